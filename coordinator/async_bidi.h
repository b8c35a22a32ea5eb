// AsyncBidiReactor: the callback API's reactor surface for a server bidi stream
// (StartRead/OnReadDone, StartWrite/OnWriteDone, Finish, OnCancel, OnDone), served by
// gRPC's async API on a completion queue of our own; CompletionQueues: those queues, one
// thread each.
//
// Why the worker Session does not use the callback API: common/grpc/completion_queue.h. Every
// open Session keeps two operations outstanding (its read and its done notification); spread
// over N queues, the list each completion is checked against is N times shorter.
//
// The contract mirrors grpc::ServerBidiReactor so a reactor (and QueuedWriter in
// service.cc) reads the same under either API:
//   - Every callback runs on the stream's queue thread, one at a time per stream.
//   - At most one read and one write in flight; Finish once, after the last write completed
//     (reads may be pending: they complete with ok=false).
//   - OnCancel runs when the call ended without Finish's status reaching the client (the
//     client went away or the server shut down); the reactor must still call Finish.
//   - OnDone runs once, last: after Finish completed, the call ended and no read or write is
//     in flight. It may delete the reactor.
// A reactor whose call is never accepted (the server shut down first) is deleted without
// any callback.
//
// Shutdown order: gRPC aborts the process when an operation is started on a completion
// queue that was shut down (`grpc_cq_begin_op` assertion), and a reactor starts its Finish
// from a callback the queue still delivers after the server's Shutdown (the read that
// failed when the call was cancelled). So the queues are shut down only once every reactor
// on them has been deleted (CompletionQueues counts them from Request to deletion).
#ifndef ULYSSES_COORDINATOR_ASYNC_BIDI_H_
#define ULYSSES_COORDINATOR_ASYNC_BIDI_H_

#include <grpcpp/completion_queue.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_stream.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/completion_queue.h"

namespace ulysses::coordinator {

// Completion queues added to a ServerBuilder, each drained by its own thread.
class CompletionQueues {
 public:
  // Before ServerBuilder::BuildAndStart: adds `count` (>= 1) queues to `builder`.
  CompletionQueues(grpc::ServerBuilder* builder, int count);
  ~CompletionQueues() { Shutdown(); }
  CompletionQueues(const CompletionQueues&) = delete;
  CompletionQueues& operator=(const CompletionQueues&) = delete;

  // After BuildAndStart: `post(cq)` runs once per queue (to request the first call on
  // it), then the queue's thread starts running the AsyncTags that complete.
  void Start(const std::function<void(grpc::ServerCompletionQueue*)>& post);
  // After grpc::Server::Shutdown, once nothing requests new calls: waits (up to
  // `reactors_timeout`) until every reactor registered by Request has been deleted (every
  // call ended, so each ran OnDone; each request pending was failed), then shuts every
  // queue down, runs what is still queued and joins the threads. Idempotent.
  void Shutdown(std::chrono::milliseconds reactors_timeout = std::chrono::seconds(30));

  int size() const { return static_cast<int>(queues_.size()); }

 private:
  template <typename In, typename Out>
  friend class AsyncBidiReactor;
  void Enter();
  void Leave();

  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  bool shut_down_ = false;
  absl::Mutex reactors_mu_;
  int reactors_ ABSL_GUARDED_BY(reactors_mu_) = 0;
};

template <typename In, typename Out>
class AsyncBidiReactor {
 public:
  using Stream = grpc::ServerAsyncReaderWriter<Out, In>;
  // A generated AsyncService's RequestMethod, bound to the service (e.g. a lambda over
  // service->RequestSession).
  using RequestFn =
      std::function<void(grpc::ServerContext*, Stream*, grpc::ServerCompletionQueue*, void* tag)>;

  virtual ~AsyncBidiReactor() {
    if (queues_ != nullptr) queues_->Leave();
  }

  // Asks for the next call of the method on `cq`, one of `queues`; `accepted` runs (on the
  // queue thread) when one arrives, before OnStart: it typically requests the call after
  // this one. `queues` holds its queues open until this reactor is deleted.
  void Request(const RequestFn& request, CompletionQueues* queues, grpc::ServerCompletionQueue* cq,
               std::function<void()> accepted) {
    queues_ = queues;
    queues_->Enter();
    accepted_ = std::move(accepted);
    context_.AsyncNotifyWhenDone(&done_tag_);
    request(&context_, &stream_, cq, &accept_tag_);
  }

  // The call was accepted: context() has its metadata and peer.
  virtual void OnStart() = 0;
  virtual void OnReadDone(bool ok) = 0;
  virtual void OnWriteDone(bool ok) = 0;
  virtual void OnCancel() = 0;
  virtual void OnDone() = 0;

 protected:
  AsyncBidiReactor()
      : stream_(&context_),
        accept_tag_(this, &AsyncBidiReactor::Accepted),
        read_tag_(this, &AsyncBidiReactor::ReadDone),
        write_tag_(this, &AsyncBidiReactor::WriteDone),
        finish_tag_(this, &AsyncBidiReactor::FinishDone),
        done_tag_(this, &AsyncBidiReactor::CallDone) {}

  const grpc::ServerContext& context() const { return context_; }

  void StartRead(In* message) {
    Begin();
    stream_.Read(message, &read_tag_);
  }
  void StartWrite(const Out* message) {
    Begin();
    stream_.Write(*message, &write_tag_);
  }
  void Finish(const grpc::Status& status) {
    Begin();
    stream_.Finish(status, &finish_tag_);
  }

 private:
  using Tag = MemberTag<AsyncBidiReactor>;

  // Bookkeeping for OnDone: each returns true when OnDone is due, and claims it for the
  // caller. One lock a message (uncontended: a stream's callbacks run on one queue thread,
  // only its writes may start elsewhere).
  void Begin() {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  bool ReadOrWriteCompleted() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    return ClaimDoneLocked();
  }
  bool FinishCompleted() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    finished_ = true;
    return ClaimDoneLocked();
  }
  bool CallCompleted() {
    absl::MutexLock lock(&mu_);
    call_done_ = true;
    return ClaimDoneLocked();
  }
  bool ClaimDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!finished_ || !call_done_ || in_flight_ > 0 || done_claimed_) return false;
    done_claimed_ = true;
    return true;
  }

  void Accepted(bool ok) {
    if (!ok) {  // The server shut down before a call came: no done notification follows.
      delete this;
      return;
    }
    if (accepted_) accepted_();
    OnStart();
  }
  void ReadDone(bool ok) {
    OnReadDone(ok);
    if (ReadOrWriteCompleted()) OnDone();
  }
  void WriteDone(bool ok) {
    OnWriteDone(ok);
    if (ReadOrWriteCompleted()) OnDone();
  }
  void FinishDone(bool /*ok*/) {
    if (FinishCompleted()) OnDone();
  }
  void CallDone(bool /*ok*/) {
    if (context_.IsCancelled()) OnCancel();
    if (CallCompleted()) OnDone();
  }

  CompletionQueues* queues_ = nullptr;
  grpc::ServerContext context_;
  Stream stream_;
  std::function<void()> accepted_;
  Tag accept_tag_, read_tag_, write_tag_, finish_tag_, done_tag_;
  absl::Mutex mu_;
  // Reads, writes and Finish started and not yet completed.
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;      // Finish completed.
  bool call_done_ ABSL_GUARDED_BY(mu_) = false;     // The done notification arrived.
  bool done_claimed_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran (or is running).
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_ASYNC_BIDI_H_
