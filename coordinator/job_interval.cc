// JobMachine: the checkpoint interval of spec.checkpoint.every_steps: auto jobs (the policy:
// checkpoint_interval.h). Launch puts it in every assignment; rank 0's checkpoint reports (the
// cost C) and step reports (the step time) update its inputs, and a choice that moved is sent
// to the running ranks (CheckpointIntervalUpdate through their workers). Failure data: the
// coordinator's own attempt records for groups of the job's size.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/contract/exit.h"
#include "common/contract/rank_control.h"
#include "common/spec/job_spec_parser.h"
#include "coordinator/job_machine.h"

namespace ulysses::coordinator {
namespace {

// Whether an ended attempt was interrupted by the infrastructure: a lost worker, or a rank that
// failed from outside (contract::FailureKindOf on its exit: a peer lost, killed by a signal from
// outside). A job's own crashes (exit 1, SIGSEGV, ...) say nothing about the machines.
bool InfraFailure(const AttemptRecord& a) {
  if (a.outcome == v1::ATTEMPT_OUTCOME_LOST) return true;
  if (a.outcome != v1::ATTEMPT_OUTCOME_FAILED) return false;
  const contract::ProcessExit exit{a.exit_code, a.exit_code > 128 ? a.exit_code - 128 : 0};
  return contract::FailureKindOf(exit) == contract::FailureKind::kInfrastructure;
}

// The GPU-seconds run and the infrastructure failures (InfraFailure; preemptions come with a
// notice and a checkpoint, bad input is not an interruption) of every attempt of `gpus` ranks
// of tenant `tenant`'s jobs the coordinator holds: another tenant's jobs neither move this
// interval nor show in its reason.
void ObservedFailures(const State& state, const std::string& tenant, int64_t gpus, int64_t now_ms,
                      double* gpu_seconds, int64_t* failures) {
  *gpu_seconds = 0;
  *failures = 0;
  for (const auto& [id, job] : state.jobs) {
    if (job->rec.tenant != tenant) continue;
    for (const AttemptRecord& a : job->rec.attempts) {
      if (static_cast<int64_t>(a.worker_ids.size()) != gpus || a.started_ms <= 0) continue;
      const int64_t end = a.ended() ? a.ended_ms : now_ms;
      *gpu_seconds += static_cast<double>(gpus) *
                      static_cast<double>(std::max<int64_t>(0, end - a.started_ms)) / 1000.0;
      if (InfraFailure(a)) ++*failures;
    }
  }
}

bool IsAuto(JobRt& job) {
  if (!job.interval.auto_interval.has_value()) {
    // The canonical spec the coordinator wrote itself (NewJobRecord): it parses.
    absl::StatusOr<spec::JobSpec> s = spec::ParseJobSpec(job.rec.spec_yaml, {});
    job.interval.auto_interval = s.ok() && s->checkpoint.every_steps_auto;
  }
  return *job.interval.auto_interval;
}

IntervalInputs InputsFor(const JobRt& job, const CoordinatorConfig& config) {
  const JobIntervalState& st = job.interval;
  IntervalInputs in;
  in.auto_interval = true;
  in.group_gpus = std::max<int64_t>(1, st.group_gpus);
  if (st.cost_samples > 0) in.cost_seconds = st.cost_sum / static_cast<double>(st.cost_samples);
  if (config.checkpoint_cost_prior_s > 0) in.prior_cost_seconds = config.checkpoint_cost_prior_s;
  in.step_seconds = st.step_seconds;
  in.observed_gpu_seconds = st.observed_gpu_seconds;
  in.observed_failures = st.observed_failures;
  in.prior_gpu_mtbf_s = config.checkpoint_mtbf_prior_gpu_hours * 3600.0;
  return in;
}

}  // namespace

v1::CheckpointInterval IntervalToProto(const IntervalChoice& c, int64_t version,
                                       int64_t group_gpus) {
  v1::CheckpointInterval p;
  p.set_version(version);
  p.set_every_steps(c.every_steps);
  p.set_every_seconds(c.every_seconds);
  // Within the rank control contract's bound (the choice's text is far shorter).
  p.set_reason(c.reason.substr(0, contract::kMaxControlReasonBytes));
  p.set_interval_seconds(c.interval_seconds);
  p.set_cost_seconds(c.cost_seconds);
  p.set_cost_source(c.cost_source);
  p.set_mtbf_seconds(c.mtbf_seconds);
  p.set_mtbf_source(c.mtbf_source);
  p.set_step_seconds(c.step_seconds);
  p.set_group_gpus(static_cast<int32_t>(group_gpus));
  return p;
}

std::optional<v1::CheckpointInterval> JobMachine::LaunchInterval(JobRt& job, int64_t group_gpus) {
  if (!IsAuto(job)) return std::nullopt;
  JobIntervalState& st = job.interval;
  st.group_gpus = std::max<int64_t>(1, group_gpus);
  st.step_seconds.reset();  // a new group (maybe a new stage): its step time is measured again
  ObservedFailures(state_, job.rec.tenant, st.group_gpus, NowMs(), &st.observed_gpu_seconds,
                   &st.observed_failures);
  const IntervalChoice choice = ChooseCheckpointInterval(InputsFor(job, config_));
  st.version = std::min(st.version + 1, contract::kMaxControlVersion);
  st.sent = choice;
  return IntervalToProto(choice, st.version, st.group_gpus);
}

void JobMachine::OnCheckpointCost(JobRt& job, double blocked_seconds, Txn& txn) {
  if (!IsAuto(job) || !std::isfinite(blocked_seconds) || blocked_seconds < 0) return;
  JobIntervalState& st = job.interval;
  st.cost_sum += blocked_seconds;
  st.cost_samples++;
  ObservedFailures(state_, job.rec.tenant, st.group_gpus, NowMs(), &st.observed_gpu_seconds,
                   &st.observed_failures);
  SendIntervalIfChanged(job, txn);
}

void JobMachine::OnStepSeconds(JobRt& job, double step_seconds, Txn& txn) {
  if (!IsAuto(job) || !std::isfinite(step_seconds) || step_seconds <= 0) return;
  JobIntervalState& st = job.interval;
  // Smoothed (the first steps warm up; one slow step should not move the interval).
  st.step_seconds =
      st.step_seconds.has_value() ? 0.75 * *st.step_seconds + 0.25 * step_seconds : step_seconds;
  SendIntervalIfChanged(job, txn);
}

void JobMachine::SendIntervalIfChanged(JobRt& job, Txn& txn) {
  JobIntervalState& st = job.interval;
  const AttemptRecord* attempt = job.rec.current_attempt();
  // Only to an attempt this coordinator launched (after a restart the running ranks keep
  // what they hold: their version is unknown here).
  if (attempt == nullptr || attempt->ended() || !st.sent.has_value()) return;
  if (st.version >= contract::kMaxControlVersion) return;
  const IntervalChoice next = ChooseCheckpointInterval(InputsFor(job, config_));
  if (!IntervalChanged(*st.sent, next)) return;
  st.version++;
  st.sent = next;
  const v1::CheckpointInterval interval = IntervalToProto(next, st.version, st.group_gpus);
  for (WorkerRt* w : HoldingWorkers(job.rec.id, *attempt)) {
    v1::CoordinatorMessage msg;  // Every rank of the generation on that worker.
    v1::CheckpointIntervalUpdate* u = msg.mutable_checkpoint_interval();
    *u->mutable_ref() = w->Held(job.rec.id, attempt->generation).front();
    *u->mutable_interval() = interval;
    SendTo(*w, std::move(msg), txn);
  }
  v1::LogLine line;
  line.set_stream(v1::LOG_STREAM_COORDINATOR);
  line.set_text(absl::StrCat("checkpoint interval version ", interval.version(),
                             " sent: ", interval.reason()));
  AddLog(job, std::move(line), txn);
}

}  // namespace ulysses::coordinator
