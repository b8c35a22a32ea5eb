// Coordinator: the JobService entry points. Each takes mu_, works through the
// JobMachine and the views, and commits.
#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "coordinator/coordinator.h"
#include "coordinator/path_policy.h"
#include "coordinator/views.h"
#include "google/protobuf/util/time_util.h"

namespace ulysses::coordinator {
namespace {

absl::Status JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
}

// `job` if `caller` may see it, else null: another tenant's job is NOT_FOUND, exactly
// like a job that does not exist.
JobRt* Visible(JobRt* job, const auth::Principal& caller) {
  return job != nullptr && auth::MaySeeTenant(caller, job->rec.tenant) ? job : nullptr;
}

// The record of a new job from its (parsed, canonical) spec: no id yet, not queued.
absl::StatusOr<JobRecord> NewJobRecord(const v1::SubmitJobRequest& request,
                                       spec::JobSpec* parsed_out) {
  spec::ParseOptions options;
  options.overrides.assign(request.overrides().begin(), request.overrides().end());
  absl::StatusOr<spec::JobSpec> parsed = spec::ParseJobSpec(request.spec_yaml(), options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(std::string(parsed.status().message()));
  }
  const spec::JobSpec& s = *parsed;
  JobRecord rec;
  rec.name = s.metadata.name;
  rec.spec_yaml = spec::ToYaml(s);
  rec.priority = s.scheduling.priority;
  rec.max_failures = static_cast<int>(s.scheduling.max_failures);
  rec.max_preemptions = static_cast<int>(s.scheduling.max_preemptions);
  rec.node_label = s.scheduling.node_label;
  for (size_t i = 0; i < s.stages.size(); ++i) {
    StageRecord st;
    st.index = static_cast<int>(i);
    st.seq_len = s.stages[i].seq_len;
    st.steps = s.stages[i].steps;
    st.sp = static_cast<int>(s.StageSp(i));
    st.dp = static_cast<int>(s.StageDp(i));
    rec.stages.push_back(st);
  }
  if (rec.stages.empty()) {
    return absl::InvalidArgumentError("spec.stages: empty (add at least one {seq_len, steps})");
  }
  *parsed_out = std::move(*parsed);
  return rec;
}

}  // namespace

absl::StatusOr<v1::SubmitJobResponse> Coordinator::SubmitJob(const v1::SubmitJobRequest& request,
                                                             const auth::Principal& caller) {
  spec::JobSpec s;
  ASSIGN_OR_RETURN(JobRecord rec, NewJobRecord(request, &s));
  rec.owner = caller.user;
  rec.tenant = caller.tenant;
  const PathRoots roots{config_.data_roots, config_.checkpoint_root};
  RETURN_IF_ERROR(CheckSpecPaths(s, roots));
  v1::SubmitJobResponse response;
  response.set_canonical_spec_yaml(rec.spec_yaml);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckServingLocked());
  rec.created_ms = NowMs();
  rec.state_entered_ms = rec.created_ms;
  if (request.dry_run()) {
    rec.reason = "dry run: valid, not queued";
    *response.mutable_job() = JobToProto(rec, true);
    return response;
  }
  rec.number = state_.next_job_number;
  rec.id = absl::StrFormat("job-%06d", rec.number);
  {  // One checkpoint directory per job: retention deletes old checkpoints in it.
    std::vector<std::string> taken, taken_by;
    for (const auto& [other_id, other] : state_.jobs) {
      taken.push_back(other->rec.checkpoint_dir);
      taken_by.push_back(other_id);
    }
    ASSIGN_OR_RETURN(rec.checkpoint_dir, JobCheckpointDir(s, rec.id, roots, taken, taken_by));
  }
  rec.out_dir = config_.out_root + "/" + rec.id;
  rec.state = v1::JOB_STATE_UNSPECIFIED;
  auto rt = std::make_unique<JobRt>();
  rt->rec = std::move(rec);
  JobRt& job = *rt;
  const std::string id = job.rec.id;
  state_.jobs[id] = std::move(rt);
  Txn txn;
  machine_.SetState(job, v1::JOB_STATE_PENDING, "queued", txn);
  if (absl::Status st = CommitLocked(txn); !st.ok()) {
    state_.jobs.erase(id);
    return st;
  }
  state_.next_job_number++;
  machine_.Schedule(txn);
  (void)CommitLocked(txn);
  response.set_job_id(id);
  *response.mutable_job() = JobToProto(job.rec, true);
  return response;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const v1::GetJobRequest& request,
                                            const auth::Principal& caller) {
  absl::MutexLock lock(&mu_);
  JobRt* rt = Visible(state_.FindJob(request.job_id()), caller);
  if (rt == nullptr) return JobNotFound(request.job_id());
  v1::Job job = JobToProto(rt->rec, true);
  if (request.include_events()) {
    for (const v1::JobEvent& e : rt->events) *job.add_events() = e;
  }
  if (!request.include_spec()) job.clear_spec_yaml();
  return job;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request,
                                                           const auth::Principal& caller) {
  int page_size = request.page_size() <= 0 ? 100 : std::min(request.page_size(), 1000);
  int64_t before = INT64_MAX;
  if (!request.page_token().empty() && !absl::SimpleAtoi(request.page_token(), &before)) {
    return absl::InvalidArgumentError(absl::StrCat("page_token: \"", request.page_token(),
                                                   "\" is not a token from ListJobs (omit it)"));
  }
  std::set<int> states(request.states().begin(), request.states().end());
  absl::MutexLock lock(&mu_);
  std::vector<const JobRt*> matching;
  for (auto& [id, j] : state_.jobs) {
    if (j->rec.number >= before) continue;
    if (!states.empty() && !states.count(j->rec.state)) continue;
    if (!auth::MaySeeTenant(caller, j->rec.tenant)) continue;
    matching.push_back(j.get());
  }
  std::sort(matching.begin(), matching.end(),
            [](const JobRt* a, const JobRt* b) { return a->rec.number > b->rec.number; });
  v1::ListJobsResponse response;
  for (size_t i = 0; i < matching.size() && i < static_cast<size_t>(page_size); ++i) {
    v1::Job job = JobToProto(matching[i]->rec, false);
    job.clear_spec_yaml();
    *response.add_jobs() = std::move(job);
  }
  if (matching.size() > static_cast<size_t>(page_size)) {
    response.set_next_page_token(absl::StrCat(matching[page_size - 1]->rec.number));
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& job_id, const std::string& reason,
                                               const auth::Principal& caller) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckServingLocked());
  JobRt* job = Visible(state_.FindJob(job_id), caller);
  if (job == nullptr) return JobNotFound(job_id);
  if (job->rec.terminal()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " is already ", StateName(job->rec.state), " (nothing to cancel)"));
  }
  std::string why = reason.empty() ? absl::StrCat("cancelled by ", caller.user) : reason;
  Txn txn;
  machine_.EndAttempt(*job, v1::ATTEMPT_OUTCOME_ABORTED, 0, why,
                      static_cast<int64_t>(config_.cancel_grace_s * 1000), txn);
  machine_.SetState(*job, v1::JOB_STATE_CANCELLED, why, txn, caller.user);
  RETURN_IF_ERROR(CommitLocked(txn));
  return JobToProto(job->rec, true);
}

absl::StatusOr<v1::Job> Coordinator::ResumeJob(const std::string& job_id,
                                               const auth::Principal& caller) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckServingLocked());
  JobRt* job = Visible(state_.FindJob(job_id), caller);
  if (job == nullptr) return JobNotFound(job_id);
  if (job->rec.state != v1::JOB_STATE_FAILED && job->rec.state != v1::JOB_STATE_CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " is ", StateName(job->rec.state),
                     "; only FAILED or CANCELLED jobs can be resumed"));
  }
  Txn txn;
  job->rec.failures = 0;
  job->rec.preemptions_budget_used = 0;
  job->rec.finished_ms = 0;
  job->rec.not_before_ms = 0;
  machine_.SetState(*job, v1::JOB_STATE_PENDING,
                    absl::StrCat("resumed by ", caller.user, " from ", CheckpointText(job->rec)),
                    txn, caller.user);
  RETURN_IF_ERROR(CommitLocked(txn));
  machine_.Schedule(txn);
  (void)CommitLocked(txn);
  return JobToProto(job->rec, true);
}

v1::ListWorkersResponse Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  v1::ListWorkersResponse response;
  const int64_t now = SteadyMs();
  const int64_t now_unix = NowMs();
  for (auto& [id, w] : state_.workers) *response.add_workers() = WorkerToProto(*w, now, now_unix);
  return response;
}

absl::Status Coordinator::WatchJob(const std::string& job_id, const auth::Principal& caller,
                                   JobEventSink* sink) {
  absl::MutexLock lock(&mu_);
  JobRt* job = Visible(state_.FindJob(job_id), caller);
  if (job == nullptr) return JobNotFound(job_id);
  v1::JobEvent snapshot;
  snapshot.set_job_id(job_id);
  *snapshot.mutable_time() = google::protobuf::util::TimeUtil::MillisecondsToTimestamp(NowMs());
  *snapshot.mutable_snapshot() = JobToProto(job->rec, true);
  snapshot.mutable_snapshot()->clear_spec_yaml();
  sink->OnEvent(snapshot);
  if (job->rec.terminal()) {
    sink->OnJobEnded();
  } else {
    job->watchers.insert(sink);
  }
  return absl::OkStatus();
}

void Coordinator::UnwatchJob(const std::string& job_id, JobEventSink* sink) {
  absl::MutexLock lock(&mu_);
  if (JobRt* job = state_.FindJob(job_id); job != nullptr) job->watchers.erase(sink);
}

absl::Status Coordinator::GetJobLogs(const v1::GetJobLogsRequest& request,
                                     const auth::Principal& caller, LogSink* sink) {
  absl::MutexLock lock(&mu_);
  JobRt* job = Visible(state_.FindJob(request.job_id()), caller);
  if (job == nullptr) return JobNotFound(request.job_id());
  size_t n = request.tail_lines() < 0    ? job->logs.size()
             : request.tail_lines() == 0 ? 100
                                         : static_cast<size_t>(request.tail_lines());
  n = std::min(n, job->logs.size());
  std::vector<v1::LogLine> tail(job->logs.end() - static_cast<std::ptrdiff_t>(n), job->logs.end());
  if (!tail.empty()) sink->OnLines(tail);
  if (!request.follow() || job->rec.terminal()) {
    sink->OnJobEnded();
  } else {
    job->log_followers.insert(sink);
  }
  return absl::OkStatus();
}

void Coordinator::UnfollowLogs(const std::string& job_id, LogSink* sink) {
  absl::MutexLock lock(&mu_);
  if (JobRt* job = state_.FindJob(job_id); job != nullptr) job->log_followers.erase(sink);
}

}  // namespace ulysses::coordinator
