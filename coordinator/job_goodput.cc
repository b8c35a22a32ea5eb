// JobMachine: goodput accounting (goodput.h). The state machine and the worker protocol call
// these at an attempt's launch and end, at rank 0's steps and checkpoint commits, and the
// ticker settles ended attempts; each updates job.rec.goodput (persisted with the job by the
// caller's commit) and counts what it classified in ulysses_productive_gpu_seconds_total and
// ulysses_lost_gpu_seconds_total.
#include <algorithm>

#include "coordinator/job_machine.h"

namespace ulysses::coordinator {

int64_t JobMachine::GoodputSettleMs() const {
  // A preempted or cancelled rank may commit a checkpoint within its grace; its report may
  // then wait up to a heartbeat timeout in a worker's queue.
  const double grace =
      std::max({config_.abort_grace_s, config_.cancel_grace_s, config_.preemption_grace_s});
  return static_cast<int64_t>((grace + config_.heartbeat_timeout_s) * 1000);
}

void JobMachine::AdoptForGoodput(JobRt& job) {
  const AttemptRecord* a = job.rec.current_attempt();
  if (a == nullptr || a->ended() || job.rec.goodput.generation == a->generation) return;
  // An attempt launched before this coordinator accounted goodput (an upgraded store):
  // accounted from its launch on.
  metrics_.CountGoodput(GoodputStart(job.rec.goodput, job.goodput_steps, a->generation,
                                     static_cast<int>(a->worker_ids.size()), a->started_ms));
}

void JobMachine::AccountLaunch(JobRt& job) {
  const AttemptRecord& a = job.rec.attempts.back();
  metrics_.CountGoodput(GoodputStart(job.rec.goodput, job.goodput_steps, a.generation,
                                     static_cast<int>(a.worker_ids.size()), a.started_ms));
}

void JobMachine::AccountStep(JobRt& job, const v1::StepProgress& progress) {
  AdoptForGoodput(job);
  metrics_.CountGoodput(GoodputStep(job.rec.goodput, job.goodput_steps, progress.step(),
                                    progress.has_step_seconds() ? progress.step_seconds() : -1.0,
                                    NowMs()));
}

void JobMachine::AccountCommit(JobRt& job, int64_t generation, const v1::Checkpoint& checkpoint) {
  AdoptForGoodput(job);
  if (job.rec.goodput.generation != generation) return;  // Settled and replaced already.
  metrics_.CountGoodput(GoodputCommit(
      job.rec.goodput, job.goodput_steps, checkpoint.step(),
      checkpoint.has_blocked_seconds() ? checkpoint.blocked_seconds() : -1.0, NowMs()));
}

void JobMachine::AccountEnd(JobRt& job, const AttemptRecord& attempt) {
  AdoptForGoodput(job);
  if (job.rec.goodput.generation != attempt.generation) {
    // Never accounted (ended before this coordinator saw it run): from its launch.
    metrics_.CountGoodput(GoodputStart(job.rec.goodput, job.goodput_steps, attempt.generation,
                                       static_cast<int>(attempt.worker_ids.size()),
                                       attempt.started_ms));
  }
  GoodputEnd(job.rec.goodput, attempt.outcome, attempt.ended_ms);
}

void JobMachine::AccountCancel(JobRt& job) {
  // Only the attempt the cancel aborted (a preempted or failed one keeps its cause).
  const AttemptRecord* a = job.rec.current_attempt();
  if (a != nullptr && a->outcome == v1::ATTEMPT_OUTCOME_ABORTED &&
      a->generation == job.rec.goodput.generation) {
    GoodputCancelled(job.rec.goodput);
  }
}

void JobMachine::SettleGoodput(JobRt& job, Txn& txn) {
  bool changed = false;
  metrics_.CountGoodput(
      GoodputSettle(job.rec.goodput, NowMs(), GoodputSettleMs(), /*force=*/false, &changed));
  if (changed) txn.jobs.insert(&job);
}

}  // namespace ulysses::coordinator
