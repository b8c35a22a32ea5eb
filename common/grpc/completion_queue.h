// Tags for gRPC's async API and the loop that runs them: every tag put on a completion queue
// of ours is an AsyncTag, and a queue's thread runs RunCompletions. Used by the coordinator's
// worker Sessions (coordinator/async_bidi.h) and bench/coordinator_load's simulated agents.
//
// Why the async API at all: on Linux, gRPC 1.51 runs every callback-API operation of a process
// through one shared completion queue, and a libgrpc built without NDEBUG (Debian's) checks
// each completion against a linear list of that queue's outstanding operations: O(open
// streams) per message (docs/BENCHMARKS.md, 25,000 workers). Our own queues keep those lists
// short.
#ifndef ULYSSES_COMMON_GRPC_COMPLETION_QUEUE_H_
#define ULYSSES_COMMON_GRPC_COMPLETION_QUEUE_H_

#include <grpcpp/completion_queue.h>

namespace ulysses {

// A completion-queue tag: Run gets the event's `ok`.
class AsyncTag {
 public:
  virtual ~AsyncTag() = default;
  virtual void Run(bool ok) = 0;
};

// A tag that calls `(self->*on)(ok)`: one per kind of operation an object starts.
template <typename T>
class MemberTag final : public AsyncTag {
 public:
  MemberTag(T* self, void (T::*on)(bool)) : self_(self), on_(on) {}
  void Run(bool ok) override { (self_->*on_)(ok); }

 private:
  T* const self_;
  void (T::*const on_)(bool);
};

// Runs each completion's AsyncTag until `cq` is shut down and drained (Next returns false).
inline void RunCompletions(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<AsyncTag*>(tag)->Run(ok);
}

}  // namespace ulysses

#endif  // ULYSSES_COMMON_GRPC_COMPLETION_QUEUE_H_
