// Coordinator: the job/worker state machine of ulysses-coordinator, independent of
// gRPC. The service layer (service.h) translates RPCs into calls here and implements
// the sinks through which the Coordinator pushes messages to open streams.
//
// Durability: every state transition is written to the Store in one transaction
// BEFORE its side effects (assignments, aborts) are sent. On Create() the state is
// reloaded; jobs that were running go to RECOVERING and wait reconnect_window_s for
// their workers to reconnect (then RUNNING again, same generation) or restart from
// the last committed checkpoint with a new generation.
//
// Thread-safety: all public methods are thread-safe (one mutex). Sinks are called
// with that mutex held and must only enqueue; they must not call back into the
// Coordinator from Send/OnEvent/OnLines. A store write that fails for I/O makes the
// coordinator stop serving (serving() == false, mutating RPCs return UNAVAILABLE); one
// the store refuses for its data fails only that request (INTERNAL), its in-memory
// changes undone.
#ifndef ULYSSES_COORDINATOR_COORDINATOR_H_
#define ULYSSES_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"
#include "coordinator/auth/principal.h"
#include "coordinator/config.h"
#include "coordinator/model.h"
#include "coordinator/store.h"
#include "ulysses/v1/job_service.pb.h"
#include "ulysses/v1/worker_service.pb.h"

namespace ulysses::coordinator {

// An open worker Session stream.
class WorkerSink {
 public:
  virtual ~WorkerSink() = default;
  virtual void Send(const v1::CoordinatorMessage& message) = 0;
  // Ends the stream with `status` (superseded session, lost worker, shutdown).
  virtual void Close(const absl::Status& status) = 0;
};

// An open WatchJob stream.
class JobEventSink {
 public:
  virtual ~JobEventSink() = default;
  virtual void OnEvent(const v1::JobEvent& event) = 0;
  virtual void OnJobEnded() = 0;  // After the terminal state's event: end the stream.
};

// An open GetJobLogs --follow stream.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void OnLines(const std::vector<v1::LogLine>& lines) = 0;
  virtual void OnJobEnded() = 0;  // End the stream.
};

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
  const CoordinatorConfig& config() const { return config_; }

  // --- JobService ---
  // `caller` is authenticated and allowed the RPC (auth::Authenticator::Authorize). A
  // job records its submitter's user and tenant; a job of another tenant is NOT_FOUND
  // for anyone but an admin (auth::MaySeeTenant).
  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request,
                                                  const auth::Principal& caller);
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request, const auth::Principal& caller);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request,
                                                const auth::Principal& caller);
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason,
                                    const auth::Principal& caller);
  absl::StatusOr<v1::Job> ResumeJob(const std::string& job_id, const auth::Principal& caller);
  v1::ListWorkersResponse ListWorkers();
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

  // --- WorkerService ---
  // `caller` may register only the name it may act as (auth::MayActAsWorker). The
  // worker record keeps the identity that registered it (persisted): while the worker
  // is live (a session open, or heard from within heartbeat_timeout_s), another
  // identity gets PERMISSION_DENIED; the same identity may always re-register (that is
  // how workers come back after a coordinator restart).
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

  // Runs one ticker iteration now (tests).
  void TickForTesting();

 private:
  struct WorkerRt;
  struct JobRt;
  struct Txn;
  struct Metrics;

  explicit Coordinator(CoordinatorConfig config, std::unique_ptr<Store> store,
                       metrics::Registry* registry);
  absl::Status Recover();
  void TickerLoop();
  void TickLocked(Txn& txn);
  void ScheduleLocked(Txn& txn);
  absl::Status CommitLocked(Txn& txn);
  // After the store refused txn's write: puts the records txn touched back to what the
  // store holds (a job or worker never written is removed) and drops assignments to
  // attempts that no longer exist. Nothing of txn was sent.
  void RestoreLocked(const Txn& txn);

  // State machine steps (mu_ held).
  // `actor`: the user who caused the change ("" = the coordinator itself).
  void SetState(JobRt& job, v1::JobState to, const std::string& reason, Txn& txn,
                const std::string& actor = "");
  void Launch(JobRt& job, const std::vector<std::string>& worker_ids, Txn& txn);
  void EndAttempt(JobRt& job, v1::AttemptOutcome outcome, int exit_code, const std::string& reason,
                  int64_t grace_ms, Txn& txn);
  void OnRankFailure(JobRt& job, v1::AttemptOutcome outcome, int exit_code,
                     const std::string& reason, const std::string& metric_reason, Txn& txn);
  // exit_code 75, or how else a rank stopped for a preemption ended (`how`).
  void OnRankPreempted(JobRt& job, int rank, int exit_code, const std::string& how, Txn& txn);
  void CompleteStage(JobRt& job, Txn& txn);
  void OnWorkerLost(WorkerRt& worker, const std::string& why, Txn& txn);
  void AddEvent(JobRt& job, v1::JobEvent event, bool persist, Txn& txn);
  void AddLogLocked(JobRt& job, v1::LogLine line, std::vector<v1::LogLine>* batch);
  void SendTo(WorkerRt& worker, v1::CoordinatorMessage message, Txn& txn);
  void JobEnded(JobRt& job);
  void HandleWorkMessage(WorkerRt& worker, const v1::WorkerMessage& message, Txn& txn);
  // Returns the job if `ref` is the current generation of a known job, else sets *error.
  JobRt* Fence(const v1::WorkRef& ref, absl::Status* error);

  v1::Job ToProto(const JobRt& job, bool full) const;
  v1::Worker ToProto(const WorkerRt& worker, int64_t now_steady_ms) const;
  std::vector<metrics::CallbackSample> CountJobsByState();
  std::vector<metrics::CallbackSample> CountWorkersByState();
  std::vector<metrics::CallbackSample> HeartbeatAges();
  double QueueLength();
  int AllocatePort();

  const CoordinatorConfig config_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Metrics> metrics_;

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<JobRt>> jobs_;        // By id. Guarded by mu_.
  std::map<std::string, std::unique_ptr<WorkerRt>> workers_;  // By id. Guarded by mu_.
  int64_t next_job_number_ = 1;                               // Guarded by mu_.
  uint64_t next_session_id_ = 1;                              // Guarded by mu_.
  int next_port_ = 0;                                         // Guarded by mu_.
  std::atomic<bool> serving_{false};

  std::mutex ticker_mu_;
  std::condition_variable ticker_cv_;
  bool stop_ = false;  // Guarded by ticker_mu_.
  std::thread ticker_;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_COORDINATOR_H_
