// JobMachine: the job state machine of the coordinator. Every transition of a job
// (queued -> scheduled -> running -> restart/preempt/complete -> terminal) is one of
// its methods; each changes the records in State and collects what must be written
// and sent in the Txn. Nothing is sent and nothing is written here: the Coordinator
// commits the Txn to the store and only then flushes its side effects.
//
// Not thread-safe: the Coordinator calls it with its mutex held (the mutex that guards
// the State passed to the constructor).
#ifndef ULYSSES_COORDINATOR_JOB_MACHINE_H_
#define ULYSSES_COORDINATOR_JOB_MACHINE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/contract/exit.h"
#include "coordinator/config.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/runtime.h"
#include "coordinator/scheduler.h"

namespace ulysses::coordinator {

// `c` as sent (version 1..kMaxControlVersion) and shown (GetJob).
v1::CheckpointInterval IntervalToProto(const IntervalChoice& c, int64_t version,
                                       int64_t group_gpus);

class JobMachine {
 public:
  // All three must outlive the JobMachine.
  JobMachine(const CoordinatorConfig& config, CoordinatorMetrics& metrics, State& state)
      : config_(config), metrics_(metrics), state_(state) {}

  // Moves `job` to `to` (or only updates its reason when it is already there): one
  // persisted state_change event and one coordinator log line. `actor`: the user who
  // caused the change (CancelJob, ResumeJob); "" = the coordinator itself.
  void SetState(JobRt& job, v1::JobState to, const std::string& reason, Txn& txn,
                const std::string& actor = "");
  // Starts the current stage as a new generation on worker_ids[rank].
  // Starts the job's current stage: rank r on slot slots[r] of worker_ids[r].
  void Launch(JobRt& job, const std::vector<std::string>& worker_ids, const std::vector<int>& slots,
              Txn& txn);
  // Ends the current attempt (if live) and aborts its ranks with `grace_ms`.
  void EndAttempt(JobRt& job, v1::AttemptOutcome outcome, int exit_code, const std::string& reason,
                  int64_t grace_ms, Txn& txn);
  // The group broke for a reason that is not the job's fault (a coordinator restart the
  // workers did not survive): abort the attempt, count a restart with `metric_reason`,
  // and requeue at once as RECOVERING. Not counted against max_failures, so no backoff:
  // not_before_ms is reset (a backoff left from an earlier failure does not apply).
  void RestartGroup(JobRt& job, const std::string& reason, const std::string& metric_reason,
                    Txn& txn);
  // A rank failed: FAILED for bad input or when the failure budget of its `kind` is
  // spent (coordinator/failure_budget.h), else RECOVERING with exponential backoff
  // (not_before_ms) in the number of failures of that kind that count.
  void OnRankFailure(JobRt& job, v1::AttemptOutcome outcome, int exit_code,
                     const std::string& reason, const std::string& metric_reason,
                     contract::FailureKind kind, Txn& txn);
  // A rank of the current attempt is gone (its worker was lost or came back without
  // it): RestartGroup while the job waits for reconnects after a coordinator restart,
  // otherwise an infrastructure failure (ATTEMPT_OUTCOME_LOST).
  void OnRankLost(JobRt& job, const std::string& reason, Txn& txn);
  // exit_code 75, or how else a rank stopped for a preemption ended (`how`).
  void OnRankPreempted(JobRt& job, int rank, int exit_code, const std::string& how, Txn& txn);
  // Priority preemption of `job` (RUNNING) for `for_job`: every rank is asked to checkpoint
  // now and exit 75 (Abort with preempt, grace PreemptionGraceMs()); CHECKPOINTING with the
  // reason and the work at risk; `for_job` gets a log line naming the victim.
  void PreemptForPriority(JobRt& job, JobRt& for_job, double gpu_seconds_at_risk, Txn& txn);
  // Every rank of the current stage exited 0.
  void CompleteStage(JobRt& job, Txn& txn);
  // Silent past lost_after_s (or SUSPECT when its job's ranks lost a peer): LOST, its
  // session closed, its ranks (if any) lost.
  void OnWorkerLost(WorkerRt& worker, const std::string& why, Txn& txn);
  // Worker liveness between heartbeat_timeout_s and lost_after_s (worker_liveness.cc).
  // Silent for `silent_ms` > heartbeat_timeout_s: SUSPECT (no new work; its ranks keep
  // running), a coordinator log line on each job it holds ranks of.
  void OnWorkerSuspect(WorkerRt& worker, int64_t silent_ms, Txn& txn);
  // A SUSPECT worker was heard from again after `silent_ms`: back to BUSY/IDLE (DISCONNECTED
  // without a session), a log line on each job it holds ranks of. No-op unless SUSPECT.
  void OnWorkerBack(WorkerRt& worker, int64_t silent_ms, Txn& txn);
  // A rank of `attempt` reported a broken collective (exit 69): every SUSPECT or
  // DISCONNECTED (session closed) worker of the attempt is the likely cause and is declared
  // LOST now rather than after lost_after_s.
  // True when one was (the attempt has then ended).
  bool LoseSuspectPeers(const AttemptRecord& attempt, const std::string& why, Txn& txn);
  // After a coordinator restart: restarts the group when its workers did not all
  // reconnect by the deadline.
  void CheckReconnectDeadline(JobRt& job, int64_t now_steady_ms, Txn& txn);
  // Places queued jobs on idle workers (coordinator/scheduler.h) and launches them;
  // unplaced jobs get the reason as their `reason`.
  void Schedule(Txn& txn);
  // Every slot of the workers not LOST, by label and fabric (what Schedule places against).
  LiveSlots RegisteredSlots() const;
  // The job's Unschedulable condition from `live`: its first stage from the current one on
  // that the registered workers cannot hold (scheduler.h FirstUnschedulableStage). A condition
  // that starts or stops holding is an event (persisted); a changed message is not.
  void UpdateUnschedulable(JobRt& job, const LiveSlots& live, Txn& txn);
  // The earliest end of a queued job's restart backoff seen by the last Schedule (wall
  // ms; INT64_MAX when none waits): the ticker's next pass is due then.
  int64_t next_backoff_end_ms() const { return next_backoff_end_ms_; }

  void AddEvent(JobRt& job, v1::JobEvent event, bool persist, Txn& txn);
  // Appends to the job's log buffer now (dropping the oldest lines beyond the per-job
  // line and byte bounds, and lines of the largest buffers beyond the total byte bound);
  // followers get the line after the commit.
  void AddLog(JobRt& job, v1::LogLine line, Txn& txn);
  // After a restart: `lines` (oldest first, from JobLogFiles) into the job's buffer within
  // its line and byte bounds; the next line's sequence follows the last.
  void RestoreLogs(JobRt& job, std::vector<v1::LogLine> lines);
  // Removes a job's log buffer from the total (the job is being dropped).
  void ForgetLogs(JobRt& job);
  // Forgets workers LOST for longer than lost_worker_ttl_s (memory, and the store
  // through txn.batch.deleted_workers).
  void ExpireLostWorkers(int64_t now_steady_ms, Txn& txn);
  // Deletes the jobs that ended more than ended_job_ttl_s ago (memory, and the store
  // through txn.batch.deleted_jobs); call before any pointer to a job enters txn.
  void ExpireEndedJobs(int64_t now_ms, Txn& txn);
  void SendTo(WorkerRt& worker, v1::CoordinatorMessage message, Txn& txn);

  // Goodput accounting (goodput.h; job_goodput.cc): each updates job.rec.goodput (written
  // with the job by the caller's commit) and counts what it classified in the metrics.
  void AccountLaunch(JobRt& job);  // After Launch added the attempt.
  void AccountStep(JobRt& job, const v1::StepProgress& progress);  // Rank 0's step.
  void AccountCommit(JobRt& job, int64_t generation, const v1::Checkpoint& checkpoint);
  void AccountEnd(JobRt& job, const AttemptRecord& attempt);  // The attempt just ended.
  void AccountCancel(JobRt& job);                             // Its attempt ended by a cancel.
  // Settles the job's ended attempt once GoodputSettleMs() passed since its end (ticker).
  void SettleGoodput(JobRt& job, Txn& txn);
  int64_t GoodputSettleMs() const;
  // spec.checkpoint.every_steps: auto (job_interval.cc; policy: checkpoint_interval.h).
  // The interval for the assignments of a new group of `group_gpus` ranks (remembered in
  // job.interval as sent); nullopt for a job with the spec's own interval.
  std::optional<v1::CheckpointInterval> LaunchInterval(JobRt& job, int64_t group_gpus);
  // Rank 0 reported a periodic checkpoint that blocked training `blocked_seconds` (C), or a
  // step of `step_seconds`: a new choice that moved enough goes to the running ranks
  // (CheckpointIntervalUpdate) with a coordinator log line. No-op for other jobs.
  void OnCheckpointCost(JobRt& job, double blocked_seconds, Txn& txn);
  void OnStepSeconds(JobRt& job, double step_seconds, Txn& txn);
  // An Abort for `ref` with the abort grace period.
  void SendAbort(WorkerRt& worker, const v1::WorkRef& ref, const std::string& why, Txn& txn);
  // `other`'s id, or "a job of another tenant" when `shown_to` is of another tenant.
  static std::string NameFor(const JobRt& other, const JobRt& shown_to);
  int64_t abort_grace_ms() const { return static_cast<int64_t>(config_.abort_grace_s * 1000); }
  // How long a preempted rank has to commit its checkpoint before SIGKILL:
  // preemption_grace_s, or cancel_grace_s when that is 0.
  int64_t PreemptionGraceMs() const {
    const double s =
        config_.preemption_grace_s > 0 ? config_.preemption_grace_s : config_.cancel_grace_s;
    return static_cast<int64_t>(s * 1000);
  }

 private:
  // Schedule's walk over the jobs: what waits, what runs, what is being preempted.
  struct PassJobs {
    std::vector<QueuedJob> queue;
    // Queued jobs, and live ones that still hold an Unschedulable condition (a later stage
    // too large): their condition is rechecked against the registered cluster every pass.
    std::vector<JobRt*> recheck;
    std::map<std::string, int64_t> in_use;  // Workers held by each tenant's live attempts.
    std::vector<const JobRt*> preemptible;  // Running jobs a higher priority may preempt.
    // Jobs being preempted, by the job they make room for (named in its reason).
    std::multimap<std::string, const JobRt*> preempting;
    int64_t max_preempting_priority = INT64_MIN;
  };
  // Schedule's walk over the workers' slots.
  struct PassSlots {
    std::vector<FreeWorker> idle;     // Views into state_, which the pass does not change.
    LiveSlots live;                   // Counts only: every slot of every worker not LOST.
    std::vector<IdleWorker> freeing;  // Busy with an attempt that ended or is being preempted.
  };
  PassJobs CollectJobs(int64_t now);
  PassSlots CollectSlots() const;
  // The preemptible running jobs of lower priority than the highest queued one that may
  // preempt, with their slots and the GPU-seconds a preemption now would lose.
  std::vector<RunningJob> PreemptionCandidates(const PassJobs& jobs, int64_t now) const;
  // Carries out one of PlanQueue's decisions; a changed waiting reason is kept and watched.
  void Apply(QueueDecision& d, const PassJobs& jobs, Txn& txn);
  // ulysses_wanted_workers from the workers and the queue of this pass (pool_demand.h).
  void SetWantedWorkers(const std::vector<QueuedJob>& queue);
  // The workers (each once) that still hold ranks of `attempt` of job `job_id`.
  std::vector<WorkerRt*> HoldingWorkers(const std::string& job_id, const AttemptRecord& attempt);

  // Starts accounting the job's live attempt when the record accounts another one (an
  // attempt launched before goodput accounting).
  void AdoptForGoodput(JobRt& job);
  // A rendezvous port no live attempt uses, in round-robin order.
  int AllocatePort();
  void SendIntervalIfChanged(JobRt& job, Txn& txn);
  void DropOldestLog(JobRt& job);

  const CoordinatorConfig& config_;
  CoordinatorMetrics& metrics_;
  State& state_;
  // During Schedule's launches: the ports in use, kept by AllocatePort across them.
  bool in_pass_ = false;
  int64_t next_backoff_end_ms_ = INT64_MAX;
  std::optional<std::set<int>> ports_in_use_;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_JOB_MACHINE_H_
