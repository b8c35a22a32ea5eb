#include "coordinator/service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <iterator>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/grpc_util.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/backup_service.h"
#include "coordinator/deferred_writes.h"
#include "coordinator/validation.h"
#include "coordinator/version_policy.h"

namespace ulysses::coordinator {
namespace {

// Observes an RPC's handling time under its method name (the auth::RpcName table).
class RpcTimer {
 public:
  RpcTimer(metrics::HistogramFamily* family, auth::Rpc rpc)
      : family_(family), method_(auth::RpcName(rpc)), start_(std::chrono::steady_clock::now()) {}
  // The child resolved once (every Session message: no label lookup per message).
  explicit RpcTimer(metrics::Histogram* child)
      : child_(child), start_(std::chrono::steady_clock::now()) {}
  ~RpcTimer() {
    std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
    if (child_ != nullptr) {
      child_->Observe(d.count());
    } else if (family_ != nullptr) {
      family_->WithLabels({method_})->Observe(d.count());
    }
  }

 private:
  metrics::HistogramFamily* family_ = nullptr;
  metrics::Histogram* child_ = nullptr;
  const char* method_ = "";
  std::chrono::steady_clock::time_point start_;
};

// A JobService caller: authenticated and allowed `rpc`, then its version against the policy
// (version_policy.h; after authentication, so an anonymous caller learns nothing).
absl::StatusOr<auth::Principal> Admit(const auth::Authenticator& auth,
                                      const grpc::ServerContextBase& context, auth::Rpc rpc) {
  ASSIGN_OR_RETURN(auth::Principal caller, auth.Authorize(context, rpc));
  RETURN_IF_ERROR(CheckClientVersion(context));
  return caller;
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// The one JobService unary handler: timed under the RPC's name, the caller admitted for it,
// the request bounds-checked by `validate` (validation.h; null: none), then `call(caller)`
// fills the response and its status finishes the call.
template <typename Request, typename Call>
grpc::ServerUnaryReactor* HandleUnary(grpc::CallbackServerContext* context,
                                      const auth::Authenticator& auth,
                                      metrics::HistogramFamily* rpc_seconds, auth::Rpc rpc,
                                      const Request& request,
                                      absl::Status (*validate)(const Request&), Call call) {
  RpcTimer timer(rpc_seconds, rpc);
  absl::StatusOr<auth::Principal> caller = Admit(auth, *context, rpc);
  if (!caller.ok()) return FinishUnary(context, caller.status());
  if (validate != nullptr) {
    if (absl::Status invalid = validate(request); !invalid.ok()) {
      return FinishUnary(context, invalid);
    }
  }
  return FinishUnary(context, call(*caller));
}

// Serialises writes on a server stream: messages are queued and written one at a
// time; EndAfterDrain() finishes the stream once the queue is empty. Thread-safe.
// Base is grpc::ServerWriteReactor<Msg> or grpc::ServerBidiReactor<In, Msg>.
template <typename Base, typename Msg>
class QueuedWriter : public Base, public WriteStarter {
 public:
  // Bytes the queue may hold beyond the message being written (0 = unbounded): a reader
  // slower than that is cut with RESOURCE_EXHAUSTED once that message is written.
  void SetQueueBound(int64_t bytes) {
    absl::MutexLock lock(&write_mu_);
    max_queued_bytes_ = bytes;
  }
  // A write the client has not taken for `stall_ms` (it grants no HTTP/2 flow credit) cuts
  // the stream at the next message: RESOURCE_EXHAUSTED, and the call is cancelled so that
  // its slot and queue go even though that write never completes on its own.
  void SetStallDeadline(grpc::CallbackServerContext* context, int64_t stall_ms) {
    absl::MutexLock lock(&write_mu_);
    context_ = context;
    stall_ms_ = stall_ms;
  }

  void Enqueue(Msg message) {
    absl::ReleasableMutexLock lock(&write_mu_);
    if (finishing_) return;
    if (writing_ && context_ != nullptr && stall_ms_ > 0 && write_started_ms_ > 0 &&
        SteadyMs() - write_started_ms_ > stall_ms_) {
      queue_.erase(std::next(queue_.begin()), queue_.end());
      queued_bytes_ = 0;
      finishing_ = true;
      final_status_ = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("the client has not read this stream for more than ", stall_ms_ / 1000,
                       " s (stream_stall_s); read the stream continuously"));
      // Under the coordinator's mutex the cancel waits for its end (DeferredWrites).
      if (DeferredWrites::Defer(this)) {
        cancel_deferred_ = true;
        return;
      }
      grpc::CallbackServerContext* context = context_;
      lock.Release();
      context->TryCancel();
      return;
    }
    const int64_t size = static_cast<int64_t>(message.ByteSizeLong());
    if (max_queued_bytes_ > 0 && writing_ && queued_bytes_ + size > max_queued_bytes_) {
      // Drop what waits (the message being written must stay until its OnWriteDone).
      queue_.erase(std::next(queue_.begin()), queue_.end());
      queued_bytes_ = 0;
      finishing_ = true;
      final_status_ = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("the client reads too slowly: more than ", max_queued_bytes_,
                       " bytes waited in this stream's send queue (stream_queue_max_bytes); "
                       "read the stream continuously, or ask for fewer lines (tail_lines)"));
      return;
    }
    queue_.push_back(std::move(message));
    if (writing_) {
      queued_bytes_ += size;
      return;
    }
    writing_ = true;
    // Inside a DeferredWrites scope (the coordinator's mutex may be held): started at its
    // end. While writing_ with no write started nothing finishes the stream, so it lives.
    if (DeferredWrites::Defer(this)) return;
    const Msg* next = &queue_.front();
    write_started_ms_ = SteadyMs();
    lock.Release();
    this->StartWrite(next);
  }

  void StartQueuedWrite() override {
    absl::ReleasableMutexLock lock(&write_mu_);
    if (cancel_deferred_) {  // A write in flight keeps the reactor alive until then.
      cancel_deferred_ = false;
      grpc::CallbackServerContext* context = context_;
      lock.Release();
      context->TryCancel();
      return;
    }
    if (finish_deferred_) {
      finish_deferred_ = false;
      grpc::Status status = final_status_;
      lock.Release();
      this->Finish(status);
      return;
    }
    const Msg* next = &queue_.front();  // Only OnWriteDone pops, after this write.
    write_started_ms_ = SteadyMs();
    lock.Release();
    this->StartWrite(next);
  }

  void EndAfterDrain(const grpc::Status& status) {
    absl::ReleasableMutexLock lock(&write_mu_);
    if (finishing_) return;
    finishing_ = true;
    final_status_ = status;
    if (writing_) return;
    finished_ = true;
    // Inside a DeferredWrites scope (the coordinator's mutex may be held): Finish at its
    // end. Nothing is written or finished meanwhile, so the stream lives until then.
    if (DeferredWrites::Defer(this)) {
      finish_deferred_ = true;
      return;
    }
    lock.Release();
    this->Finish(status);
  }

  void OnWriteDone(bool ok) override {
    absl::ReleasableMutexLock lock(&write_mu_);
    queue_.pop_front();
    if (!ok) {  // Client gone: drop the rest.
      queue_.clear();
      finishing_ = true;
      final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "stream broken");
    }
    if (!queue_.empty()) {
      const Msg* next = &queue_.front();
      queued_bytes_ =
          std::max<int64_t>(0, queued_bytes_ - static_cast<int64_t>(next->ByteSizeLong()));
      write_started_ms_ = SteadyMs();
      lock.Release();
      this->StartWrite(next);
      return;
    }
    queued_bytes_ = 0;
    writing_ = false;
    write_started_ms_ = 0;
    if (finishing_ && !finished_) {
      finished_ = true;
      grpc::Status status = final_status_;
      lock.Release();
      this->Finish(status);
    }
  }

  void OnCancel() override {
    EndAfterDrain(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

 private:
  absl::Mutex write_mu_;
  // front() is being written while writing_.
  std::deque<Msg> queue_ ABSL_GUARDED_BY(write_mu_);
  // Of the messages behind front() while writing_.
  int64_t queued_bytes_ ABSL_GUARDED_BY(write_mu_) = 0;
  int64_t max_queued_bytes_ ABSL_GUARDED_BY(write_mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(write_mu_) = false;
  // SteadyMs() when the write in flight started (0: none started).
  int64_t write_started_ms_ ABSL_GUARDED_BY(write_mu_) = 0;
  grpc::CallbackServerContext* context_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  int64_t stall_ms_ ABSL_GUARDED_BY(write_mu_) = 0;
  bool cancel_deferred_ ABSL_GUARDED_BY(write_mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(write_mu_) = false;
  bool finished_ ABSL_GUARDED_BY(write_mu_) = false;
  // Finish waits for StartQueuedWrite (DeferredWrites).
  bool finish_deferred_ ABSL_GUARDED_BY(write_mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(write_mu_);
};

// A stream's slot in StreamLimits, held from the reactor's start until it is deleted.
class StreamSlot {
 public:
  // Takes a slot for `caller` (when it authenticated); the Status says whether it got one.
  absl::Status Take(StreamLimits* limits, const absl::StatusOr<auth::Principal>& caller) {
    if (!caller.ok()) return caller.status();
    std::string identity = StreamLimits::IdentityOf(*caller);
    RETURN_IF_ERROR(limits->Acquire(identity, caller->tenant));
    limits_ = limits;
    identity_ = std::move(identity);
    tenant_ = caller->tenant;
    return absl::OkStatus();
  }
  ~StreamSlot() {
    if (limits_ != nullptr) limits_->Release(identity_, tenant_);
  }

 private:
  StreamLimits* limits_ = nullptr;
  std::string identity_;
  std::string tenant_;
};

// A stream's entry in the Authenticator's tracker: a reload that revokes the caller's
// token ends the stream (`end`). Untracked when the reactor is done.
class RevocableCall {
 public:
  void Track(const auth::Authenticator* auth, const auth::Principal& caller,
             std::function<void()> end) {
    auth_ = auth;
    handle_ = auth->Track(caller, std::move(end));
  }
  void Untrack() {
    if (auth_ != nullptr) auth_->Untrack(handle_);
    auth_ = nullptr;
  }
  ~RevocableCall() { Untrack(); }

 private:
  const auth::Authenticator* auth_ = nullptr;
  uint64_t handle_ = 0;
};

grpc::Status Revoked() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "the token that opened this stream was revoked (ask an admin for a token: "
                      "ulysses-coordinator token create)");
}

class WatchReactor final
    : public QueuedWriter<grpc::ServerWriteReactor<v1::JobEvent>, v1::JobEvent>,
      public JobEventSink {
 public:
  WatchReactor(Coordinator* coordinator, StreamLimits* limits, const auth::Authenticator* auth,
               grpc::CallbackServerContext* context, const absl::StatusOr<auth::Principal>& caller,
               const v1::WatchJobRequest& request)
      : coordinator_(coordinator), job_id_(request.job_id()) {
    SetQueueBound(limits->queue_bytes());
    SetStallDeadline(context, limits->stall_ms());
    absl::Status status = caller.status();
    if (status.ok()) status = ValidateWatchJobRequest(request);
    if (status.ok()) status = slot_.Take(limits, caller);
    if (status.ok()) status = coordinator_->WatchJob(job_id_, *caller, this);
    if (!status.ok()) {
      EndAfterDrain(ToGrpcStatus(status));
      return;
    }
    revocable_.Track(auth, *caller, [this] { EndAfterDrain(Revoked()); });
  }
  void OnEvent(const v1::JobEvent& event) override { Enqueue(event); }
  void OnJobEnded() override { EndAfterDrain(grpc::Status::OK); }
  void OnDone() override {
    revocable_.Untrack();
    coordinator_->UnwatchJob(job_id_, this);
    delete this;
  }

 private:
  Coordinator* coordinator_;
  std::string job_id_;
  StreamSlot slot_;
  RevocableCall revocable_;
};

class LogsReactor final
    : public QueuedWriter<grpc::ServerWriteReactor<v1::GetJobLogsResponse>, v1::GetJobLogsResponse>,
      public LogSink {
 public:
  LogsReactor(Coordinator* coordinator, StreamLimits* limits, const auth::Authenticator* auth,
              grpc::CallbackServerContext* context, const absl::StatusOr<auth::Principal>& caller,
              const v1::GetJobLogsRequest& request)
      : coordinator_(coordinator), job_id_(request.job_id()), queue_bytes_(limits->queue_bytes()) {
    SetQueueBound(queue_bytes_);
    SetStallDeadline(context, limits->stall_ms());
    absl::Status status = caller.status();
    if (status.ok()) status = ValidateGetJobLogsRequest(request);
    // Every call holds a slot, a plain tail too: unread, it holds its reply as long as a
    // follow holds its queue.
    if (status.ok()) status = slot_.Take(limits, caller);
    if (status.ok()) status = coordinator_->GetJobLogs(request, *caller, this);
    tail_.store(false);  // GetJobLogs sent the tail (if any) before it returned.
    if (!status.ok()) {
      EndAfterDrain(ToGrpcStatus(status));
      return;
    }
    revocable_.Track(auth, *caller, [this] { EndAfterDrain(Revoked()); });
  }
  // At most 500 lines and 1 MiB of lines per message (a line is at most 16 KiB,
  // validation.h), far below the 4 MB a gRPC client accepts by default. The tail (the
  // first call) sends the newest lines within half the queue bound.
  void OnLines(const std::vector<v1::LogLine>& all) override {
    constexpr int kChunkLines = 500;
    constexpr size_t kChunkBytes = 1 << 20;
    size_t first = 0;
    if (tail_.exchange(false)) {
      int64_t budget = queue_bytes_ / 2;
      first = all.size();
      while (first > 0 && (budget -= static_cast<int64_t>(all[first - 1].ByteSizeLong())) >= 0) {
        --first;
      }
    }
    const std::vector<v1::LogLine> lines(all.begin() + static_cast<std::ptrdiff_t>(first),
                                         all.end());
    v1::GetJobLogsResponse response;
    size_t bytes = 0;
    for (const v1::LogLine& line : lines) {
      const size_t size = line.ByteSizeLong();
      if (response.lines_size() > 0 &&
          (response.lines_size() >= kChunkLines || bytes + size > kChunkBytes)) {
        Enqueue(std::move(response));
        response = v1::GetJobLogsResponse();
        bytes = 0;
      }
      *response.add_lines() = line;
      bytes += size;
    }
    if (response.lines_size() > 0) Enqueue(std::move(response));
  }
  void OnJobEnded() override { EndAfterDrain(grpc::Status::OK); }
  void OnDone() override {
    revocable_.Untrack();
    coordinator_->UnfollowLogs(job_id_, this);
    delete this;
  }

 private:
  Coordinator* coordinator_;
  std::string job_id_;
  const int64_t queue_bytes_;
  std::atomic<bool> tail_{true};  // OnLines from within GetJobLogs: the tail.
  StreamSlot slot_;
  RevocableCall revocable_;
};

class SessionReactor final
    : public QueuedWriter<AsyncBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>,
                          v1::CoordinatorMessage>,
      public WorkerSink {
 public:
  SessionReactor(Coordinator* coordinator, const auth::Authenticator* auth,
                 metrics::Histogram* message_seconds)
      : coordinator_(coordinator), auth_(auth), message_seconds_(message_seconds) {}

  void OnStart() override {
    caller_ = auth_->Authorize(context(), auth::Rpc::kSession);
    if (!caller_.ok()) {
      EndAfterDrain(ToGrpcStatus(caller_.status()));
      return;
    }
    // A revoked worker token loses its session at the reload: no more assignments, and
    // nothing it sends afterwards is processed.
    revocable_.Track(auth_, *caller_, [this] {
      revoked_.store(true);
      EndAfterDrain(Revoked());
    });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok || revoked_.load()) {  // Client half-closed, the stream broke, or revoked.
      EndAfterDrain(revoked_.load() ? Revoked() : grpc::Status::OK);
      return;
    }
    if (!opened_) {
      if (!in_.has_hello()) {
        EndAfterDrain(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "the first Session message must be hello{worker_id}"));
        return;
      }
      if (absl::Status hello = ValidateSessionHello(in_.hello()); !hello.ok()) {
        EndAfterDrain(ToGrpcStatus(hello));
        return;
      }
      worker_id_ = in_.hello().worker_id();
      absl::StatusOr<uint64_t> session = coordinator_->OpenSession(worker_id_, *caller_, this);
      if (!session.ok()) {
        EndAfterDrain(ToGrpcStatus(session.status()));
        return;
      }
      session_ = *session;
      opened_ = true;
    } else {
      RpcTimer timer(message_seconds_);
      coordinator_->OnWorkerMessage(worker_id_, session_, in_);
    }
    StartRead(&in_);
  }

  void Send(const v1::CoordinatorMessage& message) override { Enqueue(message); }
  void Close(const absl::Status& status) override { EndAfterDrain(ToGrpcStatus(status)); }

  void OnDone() override {
    revocable_.Untrack();
    if (opened_) coordinator_->CloseSession(worker_id_, session_);
    delete this;
  }

 private:
  Coordinator* coordinator_;
  const auth::Authenticator* auth_;
  RevocableCall revocable_;
  std::atomic<bool> revoked_{false};
  // Set by OnStart, before any read or write is started.
  absl::StatusOr<auth::Principal> caller_ = absl::UnauthenticatedError("not started");
  metrics::Histogram* message_seconds_;  // rpc_seconds{method="Session"}; null: no metrics.
  v1::WorkerMessage in_;
  bool opened_ = false;  // Only touched from OnReadDone/OnDone (serialised by the queue).
  std::string worker_id_;
  uint64_t session_ = 0;
};

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::SubmitJobResponse* response) {
  return HandleUnary(context, *auth_, rpc_seconds_, auth::Rpc::kSubmitJob, *request,
                     &ValidateSubmitJobRequest, [&](const auth::Principal& caller) -> absl::Status {
                       ASSIGN_OR_RETURN(*response, coordinator_->SubmitJob(*request, caller));
                       return absl::OkStatus();
                     });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::GetJobResponse* response) {
  return HandleUnary(context, *auth_, rpc_seconds_, auth::Rpc::kGetJob, *request,
                     &ValidateGetJobRequest, [&](const auth::Principal& caller) -> absl::Status {
                       ASSIGN_OR_RETURN(*response->mutable_job(),
                                        coordinator_->GetJob(*request, caller));
                       return absl::OkStatus();
                     });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  return HandleUnary(context, *auth_, rpc_seconds_, auth::Rpc::kListJobs, *request,
                     &ValidateListJobsRequest, [&](const auth::Principal& caller) -> absl::Status {
                       ASSIGN_OR_RETURN(*response, coordinator_->ListJobs(*request, caller));
                       return absl::OkStatus();
                     });
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::CancelJobResponse* response) {
  return HandleUnary(context, *auth_, rpc_seconds_, auth::Rpc::kCancelJob, *request,
                     &ValidateCancelJobRequest, [&](const auth::Principal& caller) -> absl::Status {
                       ASSIGN_OR_RETURN(
                           *response->mutable_job(),
                           coordinator_->CancelJob(request->job_id(), request->reason(), caller));
                       return absl::OkStatus();
                     });
}

grpc::ServerUnaryReactor* JobServiceImpl::ResumeJob(grpc::CallbackServerContext* context,
                                                    const v1::ResumeJobRequest* request,
                                                    v1::ResumeJobResponse* response) {
  return HandleUnary(context, *auth_, rpc_seconds_, auth::Rpc::kResumeJob, *request,
                     &ValidateResumeJobRequest, [&](const auth::Principal& caller) -> absl::Status {
                       ASSIGN_OR_RETURN(*response->mutable_job(),
                                        coordinator_->ResumeJob(request->job_id(), caller));
                       return absl::OkStatus();
                     });
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  return new WatchReactor(coordinator_, &streams_, auth_, context,
                          Admit(*auth_, *context, auth::Rpc::kWatchJob), *request);
}

grpc::ServerWriteReactor<v1::GetJobLogsResponse>* JobServiceImpl::GetJobLogs(
    grpc::CallbackServerContext* context, const v1::GetJobLogsRequest* request) {
  return new LogsReactor(coordinator_, &streams_, auth_, context,
                         Admit(*auth_, *context, auth::Rpc::kGetJobLogs), *request);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListWorkers(grpc::CallbackServerContext* context,
                                                      const v1::ListWorkersRequest* request,
                                                      v1::ListWorkersResponse* response) {
  return HandleUnary(context, *auth_, rpc_seconds_, auth::Rpc::kListWorkers, *request,
                     &ValidateListWorkersRequest,
                     [&](const auth::Principal& caller) -> absl::Status {
                       ASSIGN_OR_RETURN(*response, coordinator_->ListWorkers(*request, caller));
                       return absl::OkStatus();
                     });
}

grpc::ServerWriteReactor<v1::BackupStateChunk>* JobServiceImpl::BackupState(
    grpc::CallbackServerContext* context, const v1::BackupStateRequest* /*request*/) {
  RpcTimer timer(rpc_seconds_, auth::Rpc::kBackupState);
  return NewBackupReactor(Admit(*auth_, *context, auth::Rpc::kBackupState),
                          coordinator_->config().state_dir);
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Register(grpc::CallbackServerContext* context,
                                                      const v1::RegisterRequest* request,
                                                      v1::RegisterResponse* response) {
  RpcTimer timer(rpc_seconds_, auth::Rpc::kRegister);
  absl::StatusOr<auth::Principal> caller = auth_->Authorize(*context, auth::Rpc::kRegister);
  if (!caller.ok()) return FinishUnary(context, caller.status());
  absl::StatusOr<v1::RegisterResponse> r = coordinator_->Register(*request, *caller);
  if (r.ok()) *response = std::move(*r);
  return FinishUnary(context, r.status());
}

void WorkerServiceImpl::AddSessionQueues(grpc::ServerBuilder* builder, int queues) {
  session_queues_ = std::make_unique<CompletionQueues>(builder, queues);
}

void WorkerServiceImpl::StartSessions() {
  {
    absl::MutexLock lock(&accept_mu_);
    accepting_ = true;
  }
  session_queues_->Start([this](grpc::ServerCompletionQueue* cq) { AcceptSession(cq); });
}

void WorkerServiceImpl::StopSessions() {
  {
    absl::MutexLock lock(&accept_mu_);
    accepting_ = false;
  }
  if (session_queues_ != nullptr) session_queues_->Shutdown();
}

void WorkerServiceImpl::AcceptSession(grpc::ServerCompletionQueue* cq) {
  absl::MutexLock lock(&accept_mu_);
  if (!accepting_) return;
  auto* reactor = new SessionReactor(coordinator_, auth_, session_seconds_.get());
  reactor->Request([this](grpc::ServerContext* context, SessionReactor::Stream* stream,
                          grpc::ServerCompletionQueue* queue,
                          void* tag) { RequestSession(context, stream, queue, queue, tag); },
                   session_queues_.get(), cq, [this, cq] { AcceptSession(cq); });
}

}  // namespace ulysses::coordinator
