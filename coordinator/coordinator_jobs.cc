// Coordinator: the JobService entry points. Each takes mu_, works through the
// JobMachine and the views, and commits.
#include <algorithm>
#include <iterator>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "coordinator/coordinator.h"
#include "coordinator/deferred_writes.h"
#include "coordinator/engine_spec.h"
#include "coordinator/path_policy.h"
#include "coordinator/quota.h"
#include "coordinator/validation.h"
#include "coordinator/views.h"
#include "google/protobuf/util/time_util.h"

namespace ulysses::coordinator {
namespace {

// FNV-1a 64 of `text` in hex: a stable fingerprint (the same in every build and run).
std::string Fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return absl::StrFormat("%016x", h);
}

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
  // Overrides can grow a document that was within the bound; the stored spec is bounded too.
  if (static_cast<int64_t>(rec.spec_yaml.size()) > spec::kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("overrides: the spec with the overrides applied is ", rec.spec_yaml.size(),
                     " bytes, more than ", spec::kMaxSpecBytes,
                     " (put the values in the spec document and keep it under the limit)"));
  }
  rec.priority = s.scheduling.priority;
  rec.max_failures = static_cast<int>(s.scheduling.max_failures);
  rec.max_infra_failures = static_cast<int>(s.scheduling.max_infra_failures);
  rec.failure_window_s = s.scheduling.failure_window_s;
  rec.preemptible = s.scheduling.preemptible;
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
    return absl::InvalidArgumentError(absl::StrCat(spec::fields::PathOf(&spec::JobSpec::stages),
                                                   ": empty (add at least one {seq_len, steps})"));
  }
  *parsed_out = std::move(*parsed);
  return rec;
}

// The job as shown: its record and the conditions held in memory (an ended job waits for
// nothing: it has none).
v1::Job JobView(const JobRt& job, bool full) {
  v1::Job out = JobToProto(job.rec, full);
  if (job.unschedulable.status() && !job.rec.terminal()) *out.add_conditions() = job.unschedulable;
  return out;
}

// The job's metadata.labels, parsed from its stored spec once (ListJobs label filters).
const std::map<std::string, std::string>& LabelsOf(JobRt& job) {
  if (!job.labels) {
    absl::StatusOr<spec::JobSpec> s = spec::ParseJobSpec(job.rec.spec_yaml, {});
    job.labels = s.ok() ? s->metadata.labels : std::map<std::string, std::string>{};
  }
  return *job.labels;
}

}  // namespace

absl::StatusOr<const JobRt*> Coordinator::EarlierSubmissionLocked(
    const v1::SubmitJobRequest& request, const auth::Principal& caller, JobRecord& rec) {
  if (request.request_id().empty() || request.dry_run()) return nullptr;
  // Idempotent: a retry gets the job its first attempt created (durable across restarts:
  // the store keeps request ids); the same id for a different spec is refused.
  // Scoped by tenant: another tenant's id neither finds nor reveals this tenant's job.
  rec.request_id = absl::StrCat(caller.tenant, "/", request.request_id());
  rec.request_hash = Fingerprint(rec.spec_yaml);
  auto known = state_.job_by_request.find(rec.request_id);
  if (known == state_.job_by_request.end()) return nullptr;
  const JobRt* earlier = state_.FindJob(known->second);
  if (earlier == nullptr) {
    return absl::InternalError(absl::StrCat("request_id \"", request.request_id(), "\" names ",
                                            known->second, ", which no longer exists"));
  }
  if (earlier->rec.request_hash != rec.request_hash) {
    return absl::AlreadyExistsError(absl::StrCat(
        "request_id \"", request.request_id(), "\" was already used for ", earlier->rec.id,
        " with a different spec (use a new request_id for a new job, or the same spec to "
        "get ",
        earlier->rec.id, ")"));
  }
  return earlier;
}

absl::Status Coordinator::CheckTenantLimitsLocked(const v1::SubmitJobRequest& request,
                                                  const auth::Principal& caller,
                                                  const JobRecord& rec) {
  int64_t waiting = 0;  // The tenant's jobs waiting for workers (quotas.max_queued_jobs).
  int64_t stored = 0;   // Every job the store keeps for it, ended ones too (max_jobs).
  for (const auto& [other_id, other] : state_.jobs) {
    if (other->rec.tenant != caller.tenant) continue;
    ++stored;
    if (IsQueued(other->rec.state)) ++waiting;
    // A name finds one job among the tenant's jobs that have not ended (ulyssesctl NAME).
    if (!request.allow_duplicate_name() && !other->rec.terminal() && other->rec.name == rec.name) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metadata.name: \"", rec.name, "\" is already the name of ", other->rec.id, " (",
          StateName(other->rec.state),
          "); a tenant's jobs that have not ended have distinct names: cancel it, choose "
          "another metadata.name (--set metadata.name=...), or submit with --allow-duplicate"));
    }
  }
  RETURN_IF_ERROR(CheckQueuedQuota(caller.tenant, waiting, config_.quotas));
  RETURN_IF_ERROR(CheckStoredJobsQuota(caller.tenant, stored, config_.quotas));
  const std::map<std::string, int64_t> bytes = TenantBytesLocked();
  auto mine = bytes.find(caller.tenant);
  return CheckStoredBytesQuota(caller.tenant, mine == bytes.end() ? 0 : mine->second,
                               static_cast<int64_t>(rec.spec_yaml.size()), config_.quotas);
}

absl::StatusOr<CheckpointDirRecord> Coordinator::ClaimCheckpointDirLocked(
    const spec::JobSpec& s, const auth::Principal& caller, const PathRoots& roots, JobRecord& rec,
    Txn& txn) {
  // One checkpoint directory per job: retention deletes old checkpoints in it.
  std::vector<std::string> taken, taken_by;
  for (const auto& [other_id, other] : state_.jobs) {
    // An ended job's directory is claimed by its checkpoint_dirs record (below), which
    // outlives the job; a running one's is never shared, adopt or not.
    if (other->rec.terminal()) continue;
    taken.push_back(other->rec.checkpoint_dir);
    // Another tenant's job is not named (nor its directory) in the error.
    taken_by.push_back(auth::MaySeeTenant(caller, other->rec.tenant) ? other_id : "");
  }
  ASSIGN_OR_RETURN(rec.checkpoint_dir, JobCheckpointDir(s, rec.id, roots, taken, taken_by));
  std::vector<DirClaim> claims;
  for (const auto& [path, claim] : state_.checkpoint_dirs) {
    claims.push_back({claim.path, claim.tenant, claim.job_id});
  }
  RETURN_IF_ERROR(
      CheckCheckpointDirClaims(rec.checkpoint_dir, caller.tenant, s.checkpoint.adopt, claims));
  // Durable with the job, kept after it (checkpoint_dirs).
  CheckpointDirRecord claim{rec.checkpoint_dir, caller.tenant, rec.id, rec.number, rec.created_ms};
  txn.batch.checkpoint_dirs.push_back(claim);
  // The spec a rank will run must carry exactly this directory (engine_spec.h).
  RETURN_IF_ERROR(EngineSpecYaml(rec.spec_yaml, rec.checkpoint_dir).status());
  return claim;
}

absl::StatusOr<v1::SubmitJobResponse> Coordinator::SubmitJob(const v1::SubmitJobRequest& request,
                                                             const auth::Principal& caller) {
  spec::JobSpec s;
  ASSIGN_OR_RETURN(JobRecord rec, NewJobRecord(request, &s));
  rec.owner = caller.user;
  rec.tenant = caller.tenant;
  const PathRoots roots{config_.data_roots, config_.checkpoint_root};
  RETURN_IF_ERROR(CheckSpecPaths(s, roots));
  RETURN_IF_ERROR(
      CheckPriority(s.scheduling.priority, caller.admin(), config_.quotas, caller.tenant));
  RETURN_IF_ERROR(CheckPreemptible(s.scheduling.preemptible, caller.admin()));
  v1::SubmitJobResponse response;
  response.set_canonical_spec_yaml(rec.spec_yaml);
  LockDeferringWrites lock(&mu_);
  RETURN_IF_ERROR(CheckServingLocked());
  ASSIGN_OR_RETURN(const JobRt* earlier, EarlierSubmissionLocked(request, caller, rec));
  if (earlier != nullptr) {
    response.set_job_id(earlier->rec.id);
    response.set_canonical_spec_yaml(earlier->rec.spec_yaml);
    *response.mutable_job() = JobView(*earlier, true);
    return response;
  }
  rec.created_ms = NowMs();
  rec.state_entered_ms = rec.created_ms;
  if (request.dry_run()) {
    rec.reason = "dry run: valid, not queued";
    JobRt preview;  // Its Unschedulable condition, as the real submission would get it.
    preview.rec = std::move(rec);
    preview.allow_tcp_fabric = s.parallelism.allow_tcp_fabric ? 1 : 0;
    Txn scratch;  // Never committed.
    machine_.UpdateUnschedulable(preview, machine_.RegisteredSlots(), scratch);
    *response.mutable_job() = JobView(preview, true);
    return response;
  }
  RETURN_IF_ERROR(CheckTenantLimitsLocked(request, caller, rec));
  rec.number = state_.next_job_number;
  rec.id = absl::StrFormat("job-%06d", rec.number);
  Txn txn;
  ASSIGN_OR_RETURN(const CheckpointDirRecord claim,
                   ClaimCheckpointDirLocked(s, caller, roots, rec, txn));
  rec.out_dir = config_.out_root + "/" + rec.id;
  rec.state = v1::JOB_STATE_UNSPECIFIED;
  auto rt = std::make_unique<JobRt>();
  rt->rec = std::move(rec);
  JobRt& job = *rt;
  const std::string id = job.rec.id;
  state_.jobs[id] = std::move(rt);
  machine_.SetState(job, v1::JOB_STATE_PENDING, "queued", txn);
  // A stage larger than the registered cluster: accepted, with the condition and its event.
  job.allow_tcp_fabric = s.parallelism.allow_tcp_fabric ? 1 : 0;
  machine_.UpdateUnschedulable(job, machine_.RegisteredSlots(), txn);
  if (absl::Status st = CommitLocked(txn); !st.ok()) {
    if (JobRt* failed = state_.FindJob(id); failed != nullptr) {  // RestoreLocked may have.
      machine_.ForgetLogs(*failed);
      state_.jobs.erase(id);
    }
    return st;
  }
  state_.next_job_number++;
  state_.checkpoint_dirs[claim.path] = claim;
  if (!job.rec.request_id.empty()) state_.job_by_request[job.rec.request_id] = id;
  RequestScheduleLocked();  // The ticker's next pass places it.
  response.set_job_id(id);
  *response.mutable_job() = JobView(job, true);
  return response;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const v1::GetJobRequest& request,
                                            const auth::Principal& caller) {
  LockDeferringWrites lock(&mu_);
  JobRt* rt = Visible(state_.FindJob(request.job_id()), caller);
  if (rt == nullptr) return JobNotFound(request.job_id());
  v1::Job job = JobView(*rt, true);
  if (rt->interval.sent.has_value()) {
    // every_steps: auto (job_interval.cc): what the current attempt's ranks were sent, in
    // memory only.
    *job.mutable_checkpoint_interval() =
        IntervalToProto(*rt->interval.sent, rt->interval.version, rt->interval.group_gpus);
  }
  if (request.include_events()) {
    // The newest events within kMaxEventsViewBytes, in sequence order.
    size_t bytes = 0;
    auto first = rt->events.end();
    while (first != rt->events.begin()) {
      bytes += std::prev(first)->ByteSizeLong();
      if (first != rt->events.end() && bytes > kMaxEventsViewBytes) break;
      --first;
    }
    for (auto it = first; it != rt->events.end(); ++it) *job.add_events() = *it;
  }
  if (!request.include_spec()) job.clear_spec_yaml();
  return job;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request,
                                                           const auth::Principal& caller) {
  int page_size = request.page_size() <= 0 ? 100 : std::min(request.page_size(), 1000);
  int64_t before = INT64_MAX;
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &before) || before < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("page_token: \"", request.page_token(),
                                                   "\" is not a token from ListJobs (omit it)"));
  }
  std::set<int> states(request.states().begin(), request.states().end());
  if (!request.tenant().empty() && request.tenant() != caller.tenant && !caller.admin()) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant: \"", request.tenant(),
                     "\" is another tenant's; only an admin lists other tenants' jobs (omit it)"));
  }
  std::vector<std::pair<std::string, std::string>> labels;
  for (const std::string& kv : request.labels()) {
    const size_t eq = kv.find('=');
    labels.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  LockDeferringWrites lock(&mu_);
  std::vector<const JobRt*> matching;
  for (auto& [id, j] : state_.jobs) {
    if (j->rec.number >= before) continue;
    if (!states.empty() && !states.count(j->rec.state)) continue;
    if (!auth::MaySeeTenant(caller, j->rec.tenant)) continue;
    if (!request.name().empty() && j->rec.name != request.name()) continue;
    if (!request.tenant().empty() && j->rec.tenant != request.tenant()) continue;
    if (!labels.empty()) {
      const std::map<std::string, std::string>& have = LabelsOf(*j);
      bool all = true;
      for (const auto& [k, v] : labels) {
        auto it = have.find(k);
        all = all && it != have.end() && it->second == v;
      }
      if (!all) continue;
    }
    matching.push_back(j.get());
  }
  std::sort(matching.begin(), matching.end(),
            [](const JobRt* a, const JobRt* b) { return a->rec.number > b->rec.number; });
  v1::ListJobsResponse response;
  size_t bytes = 0;
  size_t i = 0;
  for (; i < matching.size() && i < static_cast<size_t>(page_size); ++i) {
    v1::Job job = JobView(*matching[i], false);
    job.clear_spec_yaml();
    bytes += job.ByteSizeLong();
    if (i > 0 && bytes > kMaxPageBytes) break;  // The rest on the next page.
    *response.add_jobs() = std::move(job);
  }
  if (i < matching.size()) {
    response.set_next_page_token(absl::StrCat(matching[i - 1]->rec.number));
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& job_id, const std::string& reason,
                                               const auth::Principal& caller) {
  LockDeferringWrites lock(&mu_);
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
  machine_.AccountCancel(*job);
  machine_.SetState(*job, v1::JOB_STATE_CANCELLED, why, txn, caller.user);
  RETURN_IF_ERROR(CommitLocked(txn));
  return JobView(*job, true);
}

absl::StatusOr<v1::Job> Coordinator::ResumeJob(const std::string& job_id,
                                               const auth::Principal& caller) {
  LockDeferringWrites lock(&mu_);
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
  job->rec.infra_failures = 0;
  job->rec.recent_failures.clear();
  job->rec.preemptions_budget_used = 0;
  job->rec.finished_ms = 0;
  job->rec.not_before_ms = 0;
  machine_.SetState(*job, v1::JOB_STATE_PENDING,
                    absl::StrCat("resumed by ", caller.user, " from ", CheckpointText(job->rec)),
                    txn, caller.user);
  RETURN_IF_ERROR(CommitLocked(txn));
  RequestScheduleLocked();
  return JobView(*job, true);
}

absl::StatusOr<v1::ListWorkersResponse> Coordinator::ListWorkers(
    const v1::ListWorkersRequest& request, const auth::Principal& caller) {
  RETURN_IF_ERROR(ValidateListWorkersRequest(request));
  const size_t page_size = request.page_size() == 0 ? 500 : std::min(request.page_size(), 1000);
  LockDeferringWrites lock(&mu_);
  v1::ListWorkersResponse response;
  const int64_t now = SteadyMs();
  const int64_t now_unix = NowMs();
  size_t bytes = 0;
  // Ids are unique and ordered: the token is the last id of the previous page.
  auto it = request.page_token().empty() ? state_.workers.begin()
                                         : state_.workers.upper_bound(request.page_token());
  for (; it != state_.workers.end() && static_cast<size_t>(response.workers_size()) < page_size;
       ++it) {
    v1::Worker w = WorkerToProto(*it->second, now, now_unix);
    if (!caller.admin()) {
      // A tenant's view: the ranks of its own jobs only, and no hosts (infrastructure).
      w.clear_host();
      w.clear_running();
      auto* ranks = w.mutable_running_ranks();
      for (int i = ranks->size() - 1; i >= 0; --i) {
        if (Visible(state_.FindJob(ranks->Get(i).ref().job_id()), caller) == nullptr) {
          ranks->DeleteSubrange(i, 1);
        }
      }
      if (w.running_ranks_size() > 0) *w.mutable_running() = w.running_ranks(0);
    }
    bytes += w.ByteSizeLong();
    if (response.workers_size() > 0 && bytes > kMaxPageBytes) break;
    *response.add_workers() = std::move(w);
  }
  if (it != state_.workers.end()) {
    response.set_next_page_token(response.workers(response.workers_size() - 1).id());
  }
  return response;
}

absl::Status Coordinator::WatchJob(const std::string& job_id, const auth::Principal& caller,
                                   JobEventSink* sink) {
  LockDeferringWrites lock(&mu_);
  JobRt* job = Visible(state_.FindJob(job_id), caller);
  if (job == nullptr) return JobNotFound(job_id);
  v1::JobEvent snapshot;
  snapshot.set_job_id(job_id);
  *snapshot.mutable_time() = google::protobuf::util::TimeUtil::MillisecondsToTimestamp(NowMs());
  *snapshot.mutable_snapshot() = JobView(*job, true);
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
  LockDeferringWrites lock(&mu_);
  if (JobRt* job = state_.FindJob(job_id); job != nullptr) job->watchers.erase(sink);
}

absl::Status Coordinator::GetJobLogs(const v1::GetJobLogsRequest& request,
                                     const auth::Principal& caller, LogSink* sink) {
  LockDeferringWrites lock(&mu_);
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
  LockDeferringWrites lock(&mu_);
  if (JobRt* job = state_.FindJob(job_id); job != nullptr) job->log_followers.erase(sink);
}

}  // namespace ulysses::coordinator
