// Process groups for the engine: one Communicator per group (world, sequence-parallel,
// data-parallel).
//
// CreateProcessGroups() rendezvouses every rank through a c10d TCPStore (rank 0 hosts it at
// master_addr:master_port) and builds three groups over it:
//   world: all ranks;  sp: contiguous ranks [g*sp, (g+1)*sp);  dp: ranks with equal sp_rank.
// Backends: "gloo" (libtorch's c10d ProcessGroupGloo; with a cuda:N device, CUDA tensors are staged
// through host memory, which lets several ranks share one GPU) and "nccl" (CUDA tensors, raw NCCL;
// only when built with ULYSSES_HAVE_CUDA; one rank per GPU).
//
// Ownership: ProcessGroups owns its communicators; they share the store. Thread-safety: a
// Communicator is thread-compatible (one thread issues its collectives, in the same order on every
// rank). Errors: every collective returns a non-OK Status on peer failure or after
// CommConfig::timeout (DEADLINE_EXCEEDED); after any failure the group is unusable (later calls
// fail with FAILED_PRECONDITION) and the output tensors hold unspecified values. Completion: Gloo
// collectives are done when the call returns; NCCL ones are enqueued on libtorch's current CUDA
// stream (ordered with the kernels around them, no host wait) and a failure (timeout, dead peer)
// is returned by the group's next call.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_COMMUNICATOR_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_COMMUNICATOR_H_

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ulysses::engine {

struct CommConfig {
  // "gloo" (CPU tensors) or "nccl" (CUDA tensors; only in builds with ULYSSES_HAVE_CUDA).
  std::string backend = "gloo";
  // Where rank 0 hosts the TCPStore. Ignored when world_size == 1 (an in-process store is used).
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  // Sequence-parallel degree; world_size = sp_size * dp_size. SP groups are contiguous ranks.
  int sp_size = 1;
  // Rendezvous and every collective fail with a Status after this long.
  std::chrono::milliseconds timeout{60000};
  // "cpu" or "cuda:N" (nccl needs cuda:N; gloo takes either).
  std::string device = "cpu";
  // The attempt this rendezvous belongs to ("job-000007 generation 3"; "" = none: a local run)
  // and its secret (the coordinator's, per attempt). With either set, rank 0 publishes the
  // attempt in the store and every key of the groups is prefixed with both; a rank that finds
  // another attempt's store on the port (rank 0 of its own could not bind it and another job's
  // rank 0 did) fails at once with UNAVAILABLE (exit 69: an infrastructure failure, retried) naming
  // both attempts, the port and the fix, instead of joining that job's groups.
  std::string attempt;
  std::string secret;
};

// The store key that names a rendezvous' attempt (set by rank 0 before anything else).
inline constexpr char kAttemptKey[] = "ulysses/attempt";

// Checks every field once; messages name the field, the value and the fix.
absl::Status ValidateCommConfig(const CommConfig& config);

class Communicator {  // one process group; thread-compatible
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Equal splits along dim 0: in [size*c, ...] -> out [size*c, ...]; chunk j of `in` goes to rank
  // j, chunk j of `out` came from rank j. Tensors contiguous, same dtype/device/shape.
  virtual absl::Status AllToAll(torch::Tensor& out, const torch::Tensor& in) = 0;
  // In place; tensors may differ in shape and dtype (reduced as one flat buffer per dtype).
  virtual absl::Status AllReduceSum(std::vector<torch::Tensor>& tensors) = 0;
  virtual absl::Status AllReduceMax(torch::Tensor& t) = 0;  // in place (stop flags)
  // in [size*c] -> out [c]: out = the sum over ranks of chunk rank() of their `in` (ZeRO gradient
  // shards). Contiguous, same dtype/device; in.numel() == size * out.numel().
  virtual absl::Status ReduceScatterSum(torch::Tensor& out, const torch::Tensor& in) = 0;
  // in [c] -> out [size*c]: chunk j of `out` is rank j's `in` (ZeRO parameter gathers).
  // Contiguous, same dtype/device; out.numel() == size * in.numel().
  virtual absl::Status AllGather(torch::Tensor& out, const torch::Tensor& in) = 0;
  virtual absl::Status Broadcast(torch::Tensor& t, int root) = 0;
  virtual absl::Status Barrier() = 0;
  // Makes future collectives fail fast with ABORTED; pending ones are cancelled where the backend
  // allows (NCCL: ncclCommAbort), otherwise they end at the timeout. Safe to call from any thread.
  virtual void Abort() = 0;
  // All-to-all payload bytes this rank sent to OTHER ranks: in.nbytes() * (size-1)/size per call.
  virtual int64_t bytes_sent() const = 0;
  // True when the communicator adds its all-to-all time to the SeqAllToAll clock itself
  // (alltoall_clock.h; NCCL: device time between CUDA events, its collectives being
  // asynchronous); false: SeqAllToAll times the (blocking) call on the host.
  virtual bool times_alltoall() const { return false; }
};

struct ProcessGroups {
  std::unique_ptr<Communicator> world, sp, dp;
  int sp_rank = 0;  // rank % sp_size
  int dp_rank = 0;  // rank / sp_size
};

// Rendezvous through c10d TCPStore (rank 0 is the server at master_addr:master_port). Every rank
// must call it with the same backend/world_size/sp_size. Blocks until all ranks joined or timeout.
absl::StatusOr<ProcessGroups> CreateProcessGroups(const CommConfig& config);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_COMMUNICATOR_H_
