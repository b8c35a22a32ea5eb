// Coordinator: the WorkerService entry points. Each takes mu_, works through the
// WorkerProtocol and the JobMachine, and commits.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/coordinator.h"
#include "coordinator/deferred_writes.h"
#include "coordinator/store_schema.h"
#include "coordinator/validation.h"
#include "coordinator/version_policy.h"

namespace ulysses::coordinator {

absl::StatusOr<v1::RegisterResponse> Coordinator::Register(const v1::RegisterRequest& request,
                                                           const auth::Principal& caller) {
  RETURN_IF_ERROR(ValidateRegisterRequest(request));  // Before the lock (and again inside).
  RETURN_IF_ERROR(CheckWorkerVersion(request.agent_version()));  // Version skew.
  if (!auth::MayActAsWorker(caller, request.name())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "name: \"", request.name(), "\" is not the worker ", caller.Describe(),
        " may register (a worker registers the name of its certificate's CN or worker token)"));
  }
  const std::string identity = caller.WorkerIdentity();
  LockDeferringWrites lock(&mu_);
  RETURN_IF_ERROR(CheckServingLocked());
  if (WorkerRt* held = state_.FindWorker("w-" + request.name());
      held != nullptr && !held->rec.identity.empty() && held->rec.identity != identity) {
    // (An empty identity is a record from before authentication: the first allowed
    // identity to register it claims it, so workers survive the upgrade.)
    // Live: a session open, or heard from recently (after a coordinator restart
    // last_seen_steady is set ahead, so the reconnect window counts as live).
    const bool live =
        held->state != v1::WORKER_STATE_LOST &&
        (held->sink != nullptr ||
         SteadyMs() - held->last_seen_steady < static_cast<int64_t>(config_.lost_after_s * 1000));
    if (live) {
      return absl::PermissionDeniedError(absl::StrCat(
          "name: worker \"", request.name(), "\" is live and held by another identity (",
          held->rec.identity, "); it can be taken over only once it is LOST"));
    }
    ULOG(WARNING) << "worker " << request.name() << " taken over by " << identity << " (was "
                  << held->rec.identity << ", not live)";
  }
  Txn txn;
  std::optional<WorkerRecord> before;
  if (const WorkerRt* known = state_.FindWorker("w-" + request.name()); known != nullptr) {
    before = known->rec;
  }
  ASSIGN_OR_RETURN(WorkerProtocol::Registered registered, protocol_.Register(request, txn));
  WorkerRecord& rec = registered.worker->rec;
  rec.identity = identity;  // Persisted with the worker by the commit.
  if (before.has_value() && store_schema::WorkersTable().SameRow(*before, rec, "last_seen_ms")) {
    // A re-registration that changes nothing durable writes nothing: after a coordinator
    // restart every agent re-registers at once, and a commit (an fsync) each would
    // serialize the storm on the store (docs/BENCHMARKS.md "the reconnect storm").
    rec.last_seen_ms = before->last_seen_ms;  // Memory stays equal to the store.
    txn.workers.erase(registered.worker);
  }
  const std::string id = rec.id;
  RETURN_IF_ERROR(CommitLocked(txn));
  v1::RegisterResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_interval_ms(protocol_.heartbeat_interval_ms());
  registered.worker->told_heartbeat_interval_ms = protocol_.heartbeat_interval_ms();
  response.set_heartbeat_timeout_ms(static_cast<int64_t>(config_.heartbeat_timeout_s * 1000));
  response.set_keep_running(registered.keep_running);
  return response;
}

absl::StatusOr<uint64_t> Coordinator::OpenSession(const std::string& worker_id,
                                                  const auth::Principal& caller, WorkerSink* sink) {
  LockDeferringWrites lock(&mu_);
  WorkerRt* w = state_.FindWorker(worker_id);
  if (w == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("worker \"", worker_id, "\" is not registered (call Register first)"));
  }
  if (w->rec.identity != caller.WorkerIdentity()) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker \"", worker_id, "\" was registered by another identity (",
                     w->rec.identity, "); ", caller.Describe(), " cannot open its session"));
  }
  if (w->state == v1::WORKER_STATE_LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker \"", worker_id, "\" was declared lost; call Register again"));
  }
  if (w->sink != nullptr) w->sink->Close(absl::AbortedError("superseded by a newer session"));
  w->sink = sink;
  w->session = state_.next_session_id++;
  w->last_seen_steady = SteadyMs();
  w->state = w->busy() ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_IDLE;
  // Messages committed while no session was open.
  for (v1::CoordinatorMessage& m : w->pending) sink->Send(m);
  w->pending.clear();
  RequestScheduleLocked();  // Its free slots (a reconnect storm asks once per worker).
  return w->session;
}

void Coordinator::CloseSession(const std::string& worker_id, uint64_t session_id) {
  LockDeferringWrites lock(&mu_);
  WorkerRt* w = state_.FindWorker(worker_id);
  if (w == nullptr || w->session != session_id) return;
  w->sink = nullptr;
  w->session = 0;
  // (A SUSPECT worker stays SUSPECT: it is still silent.)
  if (w->state != v1::WORKER_STATE_LOST && w->state != v1::WORKER_STATE_SUSPECT) {
    w->state = v1::WORKER_STATE_DISCONNECTED;
  }
}

void Coordinator::OnWorkerMessage(const std::string& worker_id, uint64_t session_id,
                                  const v1::WorkerMessage& message) {
  LockDeferringWrites lock(&mu_);
  WorkerRt* w = state_.FindWorker(worker_id);
  if (w == nullptr || w->session != session_id) return;
  const int64_t now = SteadyMs();
  const size_t slots_before = w->slots.size();
  const v1::WorkerState state_before = w->state;
  Txn txn;
  machine_.OnWorkerBack(*w, now - w->last_seen_steady, txn);  // Only when SUSPECT.
  w->last_seen_steady = now;
  protocol_.OnMessage(*w, message, txn);
  // A rank that exited, or a heartbeat that freed a slot or made the worker schedulable
  // again, may let the queue move: it asks for a pass (the ticker coalesces them; a
  // pass walks every queued job and worker, per message of 25,000 workers quadratic).
  const bool has_free_slot = w->slots.size() < static_cast<size_t>(w->rec.capacity);
  const bool changed = w->slots.size() < slots_before || w->state != state_before;
  if (message.has_exited() || (message.has_heartbeat() && has_free_slot && changed)) {
    RequestScheduleLocked();
  }
  (void)CommitLocked(txn);
}

}  // namespace ulysses::coordinator
