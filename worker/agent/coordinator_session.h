// The worker agent's side of its coordinator connection: Register (with the ranks it still
// claims), one Session stream at a time (re-registering with jittered backoff when it breaks),
// the outbox of reports and log lines, sequence numbers and the reports awaiting an ack
// (resent, in order, on the next session), heartbeats and the liveness timeout (no message
// from the coordinator for that long: reconnect). Acks are handled here; every other
// coordinator message goes to the agent's `dispatch`.
//
// Locking: mu() is the agent's one lock. It guards this session's state and the agent's
// SlotTable (the session reads it for Register and heartbeats, aborts its ranks when the
// coordinator no longer wants them, and drops an exit once acked) and the agent's own state.
// One lock, so a report and the slot it claims change together. `dispatch` runs on the
// session thread without it; nothing here blocks on a process or the network while holding it.
#ifndef ULYSSES_WORKER_AGENT_COORDINATOR_SESSION_H_
#define ULYSSES_WORKER_AGENT_COORDINATOR_SESSION_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "ulysses/v1/worker_service.grpc.pb.h"
#include "worker/agent/slot_table.h"
#include "worker/agent/worker_config.h"

namespace ulysses::agent {

// The grace of a rank the coordinator no longer wants (after a reconnect, or replaced on its
// slot by a newer assignment).
inline constexpr std::chrono::milliseconds kReconnectAbortGrace{2000};

class CoordinatorSession {
 public:
  using Dispatch = std::function<void(const ::ulysses::v1::CoordinatorMessage&)>;

  // `config` and `slots` outlive this object; `slots` is guarded by mu().
  CoordinatorSession(const WorkerConfig& config, SlotTable* slots, Dispatch dispatch);
  ~CoordinatorSession();
  CoordinatorSession(const CoordinatorSession&) = delete;
  CoordinatorSession& operator=(const CoordinatorSession&) = delete;

  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // Starts the session thread (register, session, reconnect) on `channel`. Once.
  void Start(std::shared_ptr<grpc::Channel> channel) ABSL_LOCKS_EXCLUDED(mu_);
  // The session loop ends: no reconnect, the open stream cancelled. Join() then waits for it.
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Join() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues a report (the pending log lines first, so they stay ahead of it). Disconnected for
  // long, the oldest report that needs no ack is dropped past the outbox's cap.
  void EnqueueLocked(::ulysses::v1::WorkerMessage msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddLogLocked(const ::ulysses::v1::WorkRef& ref, ::ulysses::v1::LogStream stream,
                    std::string text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An agent line in the rank's log (LOG_STREAM_AGENT).
  void NoteLocked(const ::ulysses::v1::WorkRef& ref, const std::string& text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Flushes the log lines and waits (releasing mu_) up to `timeout` for every report to be
  // written and acked. False on timeout.
  bool DrainLocked(absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A session stream is open.
  bool ConnectedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !session_broken_; }

 private:
  using Clock = std::chrono::steady_clock;
  using Stream =
      grpc::ClientReaderWriter<::ulysses::v1::WorkerMessage, ::ulysses::v1::CoordinatorMessage>;

  void SessionLoop() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Register() ABSL_LOCKS_EXCLUDED(mu_);
  // After Register: aborts every rank it reported when the coordinator wants none of them.
  void OnRegisteredLocked(const ::ulysses::v1::RegisterResponse& response, size_t reported)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RunSession() ABSL_LOCKS_EXCLUDED(mu_);
  void WriterLoop(Stream* stream, grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(mu_);
  // The writer's next batch (outbox, then a heartbeat when due), numbered; false when the
  // session is over (broken, or the coordinator silent past the liveness timeout).
  bool NextBatchLocked(grpc::ClientContext* ctx, Clock::time_point* next_heartbeat,
                       std::vector<::ulysses::v1::WorkerMessage>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ::ulysses::v1::WorkerMessage HeartbeatLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleAck(const ::ulysses::v1::Ack& ack) ABSL_LOCKS_EXCLUDED(mu_);
  // Heartbeats every `ms` from now on (a coordinator's value, checked), and the session's
  // liveness timeout with it: heartbeats ask for an ack, so a silent coordinator means a dead
  // session.
  void SetHeartbeatIntervalLocked(int64_t ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLogsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Await conditions (absl::Mutex re-evaluates them whenever mu_ is released).
  // Shutdown drain: every report written and acked, no log line left.
  bool DrainedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !session_broken_ && outbox_.empty() && inflight_.empty() && logs_.empty();
  }
  // The session writer has something to do before its next heartbeat.
  bool WriterHasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return session_broken_ || !outbox_.empty();
  }

  const WorkerConfig& config_;
  const Dispatch dispatch_;
  std::unique_ptr<::ulysses::v1::WorkerService::Stub> stub_;  // Set by Start().
  std::thread thread_;

  absl::Mutex mu_;
  SlotTable* const slots_ ABSL_PT_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Session loop must end.
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds heartbeat_interval_ ABSL_GUARDED_BY(mu_){1000};
  std::chrono::milliseconds coordinator_timeout_ ABSL_GUARDED_BY(mu_){0};  // RegisterResponse's.
  // No message from the coordinator this long: reconnect.
  std::chrono::milliseconds liveness_timeout_ ABSL_GUARDED_BY(mu_){15000};
  Clock::time_point last_received_ ABSL_GUARDED_BY(mu_);
  std::deque<::ulysses::v1::WorkerMessage> outbox_ ABSL_GUARDED_BY(mu_);  // Not yet written.
  // Written, awaiting ack (this session).
  std::map<uint64_t, ::ulysses::v1::WorkerMessage> inflight_ ABSL_GUARDED_BY(mu_);
  struct PendingLog {
    ::ulysses::v1::WorkRef ref;
    ::ulysses::v1::LogLine line;
  };
  std::deque<PendingLog> logs_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool session_broken_ ABSL_GUARDED_BY(mu_) = true;
  grpc::ClientContext* session_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_COORDINATOR_SESSION_H_
