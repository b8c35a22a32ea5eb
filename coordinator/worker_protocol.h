// WorkerProtocol: what the coordinator does with a worker's Register call and with each
// kind of message on its Session stream (docs/API.md "Worker protocol"). One handler
// per WorkerMessage kind; each validates (validation.h), fences the report against the
// current assignment, and changes State through the JobMachine. Replies (Acks, Aborts)
// and every other side effect go into the Txn, sent only after the commit.
//
// Not thread-safe: the Coordinator calls it with its mutex held.
#ifndef ULYSSES_COORDINATOR_WORKER_PROTOCOL_H_
#define ULYSSES_COORDINATOR_WORKER_PROTOCOL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/config.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/job_machine.h"
#include "coordinator/runtime.h"

namespace ulysses::coordinator {

class WorkerProtocol {
 public:
  // metrics, state and machine must outlive the WorkerProtocol.
  WorkerProtocol(const CoordinatorConfig& config, CoordinatorMetrics& metrics, State& state,
                 JobMachine& machine)
      : metrics_(metrics),
        state_(state),
        machine_(machine),
        heartbeat_interval_ms_(static_cast<int64_t>(config.heartbeat_interval_s * 1000)),
        progress_log_every_ms_(static_cast<int64_t>(config.progress_log_interval_s * 1000)) {}

  struct Registered {
    WorkerRt* worker = nullptr;
    bool keep_running = false;  // It may keep the rank it reported (same generation).
  };
  // Creates or refreshes the worker named in `request` (validated here) and reconciles
  // the rank it reports running with what the coordinator assigned.
  absl::StatusOr<Registered> Register(const v1::RegisterRequest& request, Txn& txn);

  // One message from `worker`'s open session.
  void OnMessage(WorkerRt& worker, const v1::WorkerMessage& message, Txn& txn);

  // The heartbeat interval workers are asked for now (HeartbeatIntervalFor, set by the
  // coordinator's tick as the cluster changes): Register answers with it, and an Ack carries
  // it to a worker told another one before.
  int64_t heartbeat_interval_ms() const { return heartbeat_interval_ms_; }
  void set_heartbeat_interval_ms(int64_t ms) { heartbeat_interval_ms_ = ms; }

 private:
  void OnHeartbeat(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn);
  void OnStarted(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn);
  void OnProgress(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn);
  // Rank 0's progress as a job log line (`ulyssesctl logs -f`), at most one per
  // progress_log_interval_s, and the stage's last step always.
  void LogProgress(JobRt& job, const StageRecord& stage, const v1::StepProgress& p,
                   int64_t now_steady, Txn& txn);
  void OnLogs(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn);
  void OnCheckpoint(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn);
  void OnEval(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn);
  void OnPreempting(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn);
  void OnExited(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn);
  // ulysses_stage_eta_seconds: the stage's remaining steps at the mean step rate since the
  // first rank-0 report of this generation and stage.
  void UpdateStageEta(JobRt& job, const StageRecord& stage, int64_t step, int64_t now_steady);
  // ulysses_checkpoint_every_steps of the job (its spec's checkpoint.every_steps).
  void SetCheckpointEvery(JobRt& job);

  void Ack(WorkerRt& w, const v1::WorkerMessage& m, const absl::Status& status, Txn& txn);
  // Drops the message (nothing about its job changes), answers it with an error Ack and
  // counts it in ulysses_rejected_reports_total{reason}.
  void Reject(WorkerRt& w, const v1::WorkerMessage& m, const absl::Status& status,
              const std::string& reason, Txn& txn);
  // What a work report needs to be accepted (docs/API.md "Fencing"). In every case the
  // worker must hold `ref.rank` in the attempt of `ref.generation` (else "not_assigned").
  enum class Need {
    kLiveAttempt,  // started, progress, eval, preempting: the current generation, its
                   // attempt live (else "stale_generation" / "job_not_running").
    kCheckpoint,   // the current generation's attempt, live or stopped but not succeeded
                   // (a checkpoint written in the grace of a cancel or preemption counts).
    kExit,         // the current generation (its attempt may have ended already).
    kHeld,         // logs: any generation in which the worker held that rank (the last
                   // lines of a failed rank arrive after its exit).
  };
  struct Fenced {
    JobRt* job = nullptr;  // Null when rejected.
    AttemptRecord* attempt = nullptr;
    absl::Status error;  // FAILED_PRECONDITION naming what did not match.
    std::string reason;  // The ulysses_rejected_reports_total label.
  };
  Fenced FenceReport(const WorkerRt& w, const v1::WorkRef& ref, Need need);
  // FenceReport, and on a rejection: Reject it and, when `abort` (the worker reports
  // running that ref), send an Abort for the stray child.
  JobRt* Accept(WorkerRt& w, const v1::WorkerMessage& m, const v1::WorkRef& ref, Need need,
                bool abort, Txn& txn);
  // `rank` runs; SCHEDULING -> RUNNING once every rank of the stage does.
  void MarkStarted(JobRt& job, int rank, Txn& txn);

  CoordinatorMetrics& metrics_;
  State& state_;
  JobMachine& machine_;
  int64_t heartbeat_interval_ms_;
  const int64_t progress_log_every_ms_;  // 0: no progress lines.
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_WORKER_PROTOCOL_H_
