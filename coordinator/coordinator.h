// Coordinator: the job/worker state of ulysses-coordinator, independent of gRPC. The
// service layer (service.h) translates RPCs into calls here and implements the sinks
// (runtime.h) through which the Coordinator pushes messages to open streams.
//
// Structure (docs/ARCHITECTURE.md "Inside the coordinator"): this class owns the mutex,
// the in-memory State (runtime.h), the Store and the metrics, and does creation,
// recovery, the ticker and the commit. The rest is one concern per file:
//   job_machine.h      the job state machine (transitions, restarts, scheduling)
//   worker_protocol.h  Register and one handler per worker message kind
//   scheduler.h        pure placement and queue decisions
//   views.h            records -> v1::Job / v1::Worker
//   coordinator_metrics.h  the metric families and scrape-time gauges
//   coordinator_jobs.cc / coordinator_workers.cc  the JobService / WorkerService entry
//                      points (lock, call the above, commit).
//
// Durability: every state transition is written to the Store in one transaction
// BEFORE its side effects (assignments, aborts, events, log lines) are sent: they are
// collected in a Txn and flushed by CommitLocked only after Store::Write succeeded. On
// Create() the state is reloaded; jobs that were running go to RECOVERING and wait
// reconnect_window_s for their workers to reconnect (then RUNNING again, same
// generation) or restart from the last committed checkpoint with a new generation.
//
// Thread-safety: all public methods are thread-safe (one mutex, mu_). The store write
// (an fsync) happens with mu_ held: the in-memory state is what every request reads,
// so releasing mu_ before the commit would let another request see, and act on, a
// transition that may still be undone (RestoreLocked). Sinks are also called with mu_
// held, right after the commit, so every stream gets events and log lines in sequence
// order; they must only enqueue and must not call back into the Coordinator. mu_ is
// always taken through LockDeferringWrites (deferred_writes.h): the writes and stream ends
// the sinks queue start once it is released, so no gRPC call runs under mu_. A store
// write that fails for I/O makes the coordinator stop serving (serving() == false,
// mutating RPCs return UNAVAILABLE); one the store refuses for its data fails only
// that request (INTERNAL), its in-memory changes undone.
#ifndef ULYSSES_COORDINATOR_COORDINATOR_H_
#define ULYSSES_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "common/spec/job_spec.h"
#include "coordinator/auth/principal.h"
#include "coordinator/config.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/job_log_files.h"
#include "coordinator/job_machine.h"
#include "coordinator/path_policy.h"
#include "coordinator/runtime.h"
#include "coordinator/state_lock.h"
#include "coordinator/store.h"
#include "coordinator/worker_protocol.h"
#include "ulysses/v1/job_service.pb.h"
#include "ulysses/v1/worker_service.pb.h"

namespace ulysses::coordinator {

class Coordinator {
 public:
  // Opens the store under config.state_dir, reloads and recovers state. `registry`
  // may be null (no metrics); it must outlive the Coordinator.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const CoordinatorConfig& config,
                                                             metrics::Registry* registry);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Starts the ticker thread (heartbeat timeouts, backoff timers, scheduling).
  void Start();
  // Stops the ticker and closes every stream. Idempotent.
  void Shutdown();
  bool serving() const { return serving_.load(); }
  // Liveness (/livez): OK while the ticker has completed a tick within the last `stall_ms`
  // (measured at `now_ms`, SteadyMs()). Takes no lock, so a hung tick holding the lock is
  // reported rather than waited on. A coordinator whose store is read-only stays live: its
  // ticks go on (each one probes the store) and it serves again by itself.
  absl::Status LivenessAt(int64_t now_ms, int64_t stall_ms) const;
  // Every stored job's id -> tenant (metrics.job_series: labels). Takes the lock.
  std::map<std::string, std::string> JobTenants() ABSL_LOCKS_EXCLUDED(mu_);
  // Why the coordinator is not serving ("" while it is): the state store's error.
  std::string health_reason() const;
  const CoordinatorConfig& config() const { return config_; }

  // --- JobService (coordinator_jobs.cc) ---
  // `caller` is authenticated and allowed the RPC (auth::Authenticator::Authorize). A
  // job records its submitter's user and tenant; a job of another tenant is NOT_FOUND
  // for anyone but an admin (auth::MaySeeTenant). Cancel/resume events name the caller.
  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request,
                                                  const auth::Principal& caller);
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request, const auth::Principal& caller);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request,
                                                const auth::Principal& caller);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason,
                                    const auth::Principal& caller);
  absl::StatusOr<v1::Job> ResumeJob(const std::string& job_id, const auth::Principal& caller);
  // Pages ordered by worker id (validated here: page_token).
  // Admins see every worker whole; others see no hosts and only their tenant's ranks.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const v1::ListWorkersRequest& request,
                                                      const auth::Principal& caller);
  // Sends the snapshot event to `sink` and, unless the job already ended (then
  // sink->OnJobEnded() follows at once), registers it for every later event.
  absl::Status WatchJob(const std::string& job_id, const auth::Principal& caller,
                        JobEventSink* sink);
  void UnwatchJob(const std::string& job_id, JobEventSink* sink);
  // Sends the tail to `sink`; with follow and a live job registers it for new lines,
  // otherwise calls sink->OnJobEnded() at once.
  absl::Status GetJobLogs(const v1::GetJobLogsRequest& request, const auth::Principal& caller,
                          LogSink* sink);
  void UnfollowLogs(const std::string& job_id, LogSink* sink);

  // --- WorkerService (coordinator_workers.cc) ---
  // `caller` may register only the name it may act as (auth::MayActAsWorker). The
  // worker record keeps the identity that registered it (persisted): while the worker
  // is live (a session open, or heard from within heartbeat_timeout_s; after a
  // coordinator restart, within reconnect_window_s) another identity gets
  // PERMISSION_DENIED; the same identity may always re-register (that is how workers
  // come back after a coordinator restart).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                const auth::Principal& caller);
  // Binds a session to a registered worker; supersedes (closes) an older session.
  // Only the identity that registered the worker may open one (PERMISSION_DENIED).
  // Returns the session id to pass back with messages.
  absl::StatusOr<uint64_t> OpenSession(const std::string& worker_id, const auth::Principal& caller,
                                       WorkerSink* sink);
  void OnWorkerMessage(const std::string& worker_id, uint64_t session_id,
                       const v1::WorkerMessage& message);
  void CloseSession(const std::string& worker_id, uint64_t session_id);

  // Runs one ticker iteration now, with a scheduling pass (tests).
  void TickForTesting();

 private:
  explicit Coordinator(CoordinatorConfig config, std::unique_ptr<Store> store,
                       metrics::Registry* registry);
  absl::Status Recover();
  void TickerLoop();
  // One tick. The per-worker scans (forgetting long-LOST workers, SUSPECT / LOST) run
  // when `scan_workers`: the ticker does them every WorkerScanMs(), not every 100 ms
  // (each is a walk over every worker: 25,000 at scale).
  void Tick(bool scan_workers) ABSL_LOCKS_EXCLUDED(mu_);
  void TickLocked(Txn& txn, bool scan_workers, bool force_pass = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Scheduling passes (docs/COORDINATOR.md "Scheduling passes"): an event that may let
  // the queue move asks for one; the ticker runs it (MaybeScheduleLocked), so that a pass
  // over a 25,000-node cluster runs at most every max(100 ms, 4 x its duration) however
  // many events asked.
  void RequestScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { schedule_requested_ = true; }
  void MaybeScheduleLocked(Txn& txn, int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulePassLocked(Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // heartbeat_timeout_s / 10, within 100 ms .. 1 s: a silent worker is SUSPECT or LOST at
  // most this late.
  int64_t WorkerScanMs() const;
  // Writes txn to the store; on success flushes its side effects (sends, events, log
  // lines, ended streams) and clears it.
  absl::Status CommitLocked(Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the store refused txn's write: puts the records txn touched back to what the
  // store holds (a job or worker never written is removed) and drops assignments to
  // attempts that no longer exist. Nothing of txn was sent.
  void RestoreLocked(const Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the streams of a job that reached a terminal state and forgets its series.
  void JobEndedLocked(JobRt& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StateCounts Counts(CountsPart part) ABSL_LOCKS_EXCLUDED(mu_);
  // Per tenant: its stored jobs' spec bytes, event bytes and log-file bytes.
  std::map<std::string, int64_t> TenantBytesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckServingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SubmitJob's steps (coordinator_jobs.cc). A retried request_id: sets rec's request id and
  // hash and returns the job its first submission created (nullptr: none); the same id for
  // another spec is AlreadyExists.
  absl::StatusOr<const JobRt*> EarlierSubmissionLocked(const v1::SubmitJobRequest& request,
                                                       const auth::Principal& caller,
                                                       JobRecord& rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Distinct names among the tenant's jobs that have not ended, and its quotas (queued jobs,
  // stored jobs, stored bytes).
  absl::Status CheckTenantLimitsLocked(const v1::SubmitJobRequest& request,
                                       const auth::Principal& caller, const JobRecord& rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's own checkpoint directory (rec.checkpoint_dir), its claim added to txn.
  absl::StatusOr<CheckpointDirRecord> ClaimCheckpointDirLocked(const spec::JobSpec& s,
                                                               const auth::Principal& caller,
                                                               const PathRoots& roots,
                                                               JobRecord& rec, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // While NOT_SERVING after a store I/O error: one probe write; serving again on success.
  void ProbeStoreLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorConfig config_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::atomic<bool> serving_{false};

  mutable absl::Mutex mu_;
  std::unique_ptr<StateDirLock> state_lock_ ABSL_GUARDED_BY(mu_);  // Held until Shutdown().
  std::unique_ptr<Store> store_ ABSL_GUARDED_BY(mu_);              // Not thread-safe itself.
  std::unique_ptr<JobLogFiles> log_files_ ABSL_GUARDED_BY(mu_);    // <state_dir>/logs.
  // Bytes each tenant stores (specs, events, log files: TenantBytesLocked), recounted every
  // tick and grown by each log append in between (quotas.*.max_bytes).
  std::map<std::string, int64_t> tenant_bytes_ ABSL_GUARDED_BY(mu_);
  State state_ ABSL_GUARDED_BY(mu_);
  // Operate on state_; every call needs mu_ (they hold references to state_).
  JobMachine machine_ ABSL_GUARDED_BY(mu_);
  WorkerProtocol protocol_ ABSL_GUARDED_BY(mu_);
  bool schedule_requested_ ABSL_GUARDED_BY(mu_) = true;
  int64_t last_pass_end_steady_ ABSL_GUARDED_BY(mu_) = 0;  // SteadyMs().
  int64_t last_pass_cost_ms_ ABSL_GUARDED_BY(mu_) = 0;

  // SteadyMs() at Start() and after every tick of the ticker thread (LivenessAt).
  std::atomic<int64_t> last_tick_ms_{0};
  int64_t last_worker_scan_ms_ = 0;  // Only the ticker thread touches it.
  absl::Mutex ticker_mu_;
  bool stop_ ABSL_GUARDED_BY(ticker_mu_) = false;
  std::thread ticker_;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_COORDINATOR_H_
