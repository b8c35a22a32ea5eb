// AsyncBidiReactor: the callback API's reactor surface for a server bidi stream
// (StartRead/OnReadDone, StartWrite/OnWriteDone, Finish, OnCancel, OnDone), served by
// gRPC's async API on a completion queue of our own; CompletionQueues: those queues, one
// thread each.
//
// Why the worker Session does not use the callback API: on Linux, gRPC 1.51 runs every
// callback-API operation of the process through one shared completion queue, and a
// libgrpc built without NDEBUG (Debian's) checks each completion against a linear list
// of that queue's outstanding operations. Every open Session keeps two outstanding (its
// read and its done notification), so each message cost O(connected workers): 30 % of the
// coordinator's core at 25,000 workers (docs/BENCHMARKS.md). Spread over N queues, the
// list each completion scans is N times shorter.
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
#ifndef ULYSSES_COORDINATOR_ASYNC_BIDI_H_
#define ULYSSES_COORDINATOR_ASYNC_BIDI_H_

#include <grpcpp/completion_queue.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_stream.h>

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ulysses::coordinator {

// A completion-queue tag: the object and the member to run with the event's `ok`.
class AsyncTag {
 public:
  virtual ~AsyncTag() = default;
  virtual void Run(bool ok) = 0;
};

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
  // After grpc::Server::Shutdown (so nothing new is started): shuts every queue down,
  // runs what is still queued and joins the threads. Idempotent.
  void Shutdown();

  int size() const { return static_cast<int>(queues_.size()); }

 private:
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  bool shut_down_ = false;
};

template <typename In, typename Out>
class AsyncBidiReactor {
 public:
  using Stream = grpc::ServerAsyncReaderWriter<Out, In>;
  // A generated AsyncService's RequestMethod, bound to the service (e.g. a lambda over
  // service->RequestSession).
  using RequestFn =
      std::function<void(grpc::ServerContext*, Stream*, grpc::ServerCompletionQueue*, void* tag)>;

  virtual ~AsyncBidiReactor() = default;

  // Asks for the next call of the method on `cq`; `accepted` runs (on the queue thread)
  // when one arrives, before OnStart: it typically requests the call after this one.
  void Request(const RequestFn& request, grpc::ServerCompletionQueue* cq,
               std::function<void()> accepted) {
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
  class Tag final : public AsyncTag {
   public:
    Tag(AsyncBidiReactor* self, void (AsyncBidiReactor::*on)(bool)) : self_(self), on_(on) {}
    void Run(bool ok) override { (self_->*on_)(ok); }

   private:
    AsyncBidiReactor* const self_;
    void (AsyncBidiReactor::*const on_)(bool);
  };

  void Begin() {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
  }
  // Ends one operation; true when OnDone is due (and now claimed by the caller).
  bool End(bool finished, bool call_done) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ -= (call_done ? 0 : 1);
    finished_ = finished_ || finished;
    call_done_ = call_done_ || call_done;
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
    if (End(false, false)) OnDone();
  }
  void WriteDone(bool ok) {
    OnWriteDone(ok);
    if (End(false, false)) OnDone();
  }
  void FinishDone(bool /*ok*/) {
    if (End(true, false)) OnDone();
  }
  void CallDone(bool /*ok*/) {
    if (context_.IsCancelled()) OnCancel();
    if (End(false, true)) OnDone();
  }

  grpc::ServerContext context_;
  Stream stream_;
  std::function<void()> accepted_;
  Tag accept_tag_, read_tag_, write_tag_, finish_tag_, done_tag_;
  std::mutex mu_;
  int in_flight_ = 0;          // Reads, writes and Finish started and not yet completed.
  bool finished_ = false;      // Finish completed.
  bool call_done_ = false;     // The done notification arrived.
  bool done_claimed_ = false;  // OnDone ran (or is running).
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_ASYNC_BIDI_H_
