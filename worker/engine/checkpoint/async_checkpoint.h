// Asynchronous checkpoint saves: the files and the commit protocol of SaveCheckpoint
// (checkpoint.h), with the writing moved off the training thread.
//
// Begin() runs on the training thread at a step boundary, on every rank with the same metadata:
//   1. waits for this rank's previous save to finish (at most one save in flight; the wait is part
//      of the blocked time, and an error of the previous save is returned here);
//   2. rank 0 un-commits an earlier save of the same step (removes its manifest) and every rank
//      removes its own shard and marker files of that step; then `barrier` runs once. After it no
//      file of an earlier attempt at this step is left, so a shard that appears later was written
//      by this save;
//   3. copies the tensors this rank writes into host buffers (reused from save to save: pinned
//      memory and non-blocking copies from CUDA tensors, completed by an event the writer waits
//      for; a plain copy from CPU tensors) and hands them to the writer thread.
// The writer thread writes the shard exactly as SaveCheckpoint does (same bytes: tmp + fsync +
// rename + directory fsync) or, when that fails, a marker "shard-R-of-W.failed" with the error.
// Rank 0's writer then waits until every rank's shard is durable and commits: manifest.json last,
// then the retention of SaveCheckpoint. A kill -9 at any moment leaves the previous committed
// checkpoint the latest (the manifest of this one is written last, and only by rank 0).
//
// Why files and not a barrier on the writer thread: a collective on the training communicator
// from a second thread would interleave with the training thread's collectives on the same
// group; Gloo and NCCL match operations per group in issue order, so the ranks would pair a
// barrier with an all-reduce and hang or corrupt data. A second process group would need its own
// rendezvous, sockets (and an NCCL communicator per device) for one bit per rank. The shared
// checkpoint root already carries that bit: SaveCheckpoint's commit reads every rank's shard on
// rank 0, so the root is visible to all ranks, and a shard's final name appears only after its
// data is fsynced. Rank 0 polls the step directory (every few milliseconds) until every shard, or
// a failure marker, is there, bounded by `commit_timeout`.
//
// Thread-safety: one AsyncCheckpointer per rank; its methods are called from one (training)
// thread, except Poll and WaitIdleUntil (any thread). The destructor waits for the shard write in
// flight and abandons a commit still waiting for other ranks (their shards never come when the job
// is failing).
#ifndef ULYSSES_WORKER_ENGINE_CHECKPOINT_ASYNC_CHECKPOINT_H_
#define ULYSSES_WORKER_ENGINE_CHECKPOINT_ASYNC_CHECKPOINT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/checkpoint/checkpoint.h"

namespace ulysses::engine {

struct AsyncCheckpointOptions {
  std::string root;
  int rank = 0;
  int world = 1;
  int64_t keep_last = 2;
  SaveMode mode = SaveMode::kReplicated;
  // Rank 0 gives up waiting for the other ranks' shards after this (the collective timeout).
  std::chrono::milliseconds commit_timeout{std::chrono::minutes(10)};
};

// A save that finished on this rank: its shard is durable (rank 0: the checkpoint is committed).
struct AsyncSaveDone {
  std::string path;            // the step directory
  int64_t stage = 0;           // from the saved CheckpointState
  int64_t step_in_stage = 0;   //
  int64_t global_step = 0;     //
  double blocked_seconds = 0;  // training thread: the wait for the previous save + the snapshot
  double total_seconds = 0;    // Begin() to durable (rank 0: to committed)
};

class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(AsyncCheckpointOptions options);
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Collective (see above). `state.tensors` may be views of live training tensors on any device:
  // they are copied before Begin returns and may change afterwards. Returns the seconds the
  // training thread was blocked (wait for the previous save + snapshot). A previous save's
  // error, or a snapshot error, is returned and nothing new is started.
  absl::StatusOr<double> Begin(CheckpointState state, const std::function<absl::Status()>& barrier);

  // The save that finished since the last call, if any (never blocks). Its error, if it failed.
  std::optional<absl::StatusOr<AsyncSaveDone>> Poll();

  // Blocks until no save is in flight; returns the one that finished (nullopt: none was pending).
  std::optional<absl::StatusOr<AsyncSaveDone>> Wait();

  // Blocks until no save is in flight or `deadline` passes; true when none is. Unlike the other
  // methods callable from any thread (the preemption watch, train/preemption.h); collects
  // nothing (Poll, also thread-safe, does).
  bool WaitIdleUntil(std::chrono::steady_clock::time_point deadline);

  // Seconds the training thread spent waiting for a previous save in Begin (all saves).
  double waited_seconds() const { return waited_seconds_; }

 private:
  struct Job;
  void WriterLoop();
  absl::Status WriteAndCommit(Job& job);
  absl::Status AwaitShards(const std::string& dir, int64_t step);

  const AsyncCheckpointOptions options_;
  std::vector<torch::Tensor> buffers_;  // host copies, reused while shapes and dtypes match
  std::vector<bool> pinned_;            // buffers_[i] is pinned (its source was a CUDA tensor)
  double waited_seconds_ = 0;

  // Waits are absl::Mutex::Await on the conditions below (re-evaluated at every unlock).
  absl::Mutex mu_;
  std::unique_ptr<Job> pending_ ABSL_GUARDED_BY(mu_);  // handed to the writer
  bool busy_ ABSL_GUARDED_BY(mu_) = false;             // a save is in flight
  std::optional<absl::StatusOr<AsyncSaveDone>> finished_ ABSL_GUARDED_BY(mu_);  // not collected
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; }
  bool WriterHasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || pending_ != nullptr;
  }
  std::thread writer_;
};

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_CHECKPOINT_ASYNC_CHECKPOINT_H_
