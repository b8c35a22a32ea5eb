// DeferredWrites: lets a stream's first write, or its end (Finish), start after the
// caller's locks are gone.
//
// The coordinator flushes a commit's messages into its streams under its mutex, in commit
// order (coordinator.h). A stream with nothing in flight would start the write at once,
// and gRPC's StartWrite runs the transport inline (HTTP/2 framing, TLS, sendmsg): I/O
// under the coordinator's one mutex, on every heartbeat ack. Inside a DeferredWrites scope
// a stream only queues the message and records itself; the scope's end (once the entry
// point has released the mutex) starts those writes. Messages keep their order: each
// stream's queue is filled under the mutex, only the kick of its front moves.
//
// A stream's Finish is deferred the same way: ending a stream also runs the transport
// inline, and gRPC's own mutexes (absl::Mutex) would be taken under ours.
//
// The coordinator takes its mutex through LockDeferringWrites (below), so every entry
// point (a Session read or end, a unary handler, a watch opening, the ticker, shutdown)
// is a scope; nested scopes run their kicks at the outermost one's end. Outside any scope
// a stream starts its write or Finish inline.
#ifndef ULYSSES_COORDINATOR_DEFERRED_WRITES_H_
#define ULYSSES_COORDINATOR_DEFERRED_WRITES_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ulysses::coordinator {

// A stream whose first queued message waits for its write to be started.
class WriteStarter {
 public:
  virtual ~WriteStarter() = default;
  // Starts writing the front of the queue, or the deferred Finish (called once per
  // deferral, without locks).
  virtual void StartQueuedWrite() = 0;
};

class DeferredWrites {
 public:
  DeferredWrites() { ++Depth(); }
  ~DeferredWrites() {
    if (--Depth() > 0) return;
    // The depth is 0 again: a message queued while these writes start (by a callback run
    // inline on this thread) starts its own write at once, so nothing waits for a kick.
    std::vector<WriteStarter*> starters;
    starters.swap(Pending());
    for (WriteStarter* s : starters) s->StartQueuedWrite();
  }
  DeferredWrites(const DeferredWrites&) = delete;
  DeferredWrites& operator=(const DeferredWrites&) = delete;

  // Inside a scope on this thread: records `starter` and returns true (the caller must
  // not start the write). Outside: false.
  static bool Defer(WriteStarter* starter) {
    if (Depth() == 0) return false;
    Pending().push_back(starter);
    return true;
  }

 private:
  static int& Depth() {
    thread_local int depth = 0;
    return depth;
  }
  static std::vector<WriteStarter*>& Pending() {
    thread_local std::vector<WriteStarter*> pending;
    return pending;
  }
};

// Holds `mu` within a DeferredWrites scope: the scope opens before the lock is taken and
// ends after it is released, so what streams queued under `mu` starts without it.
class ABSL_SCOPED_LOCKABLE LockDeferringWrites {
 public:
  explicit LockDeferringWrites(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~LockDeferringWrites() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  LockDeferringWrites(const LockDeferringWrites&) = delete;
  LockDeferringWrites& operator=(const LockDeferringWrites&) = delete;

 private:
  DeferredWrites deferred_;  // Declared first: constructed before Lock, destroyed after Unlock.
  absl::Mutex* const mu_;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_DEFERRED_WRITES_H_
