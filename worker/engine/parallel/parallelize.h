// Parallelism for one rank, independent of the model: the device, the process groups of an
// (sp x dp) layout, and the attention callback that the model calls.
//
// Parallelize() rendezvouses the ranks of one layout (CreateProcessGroups) on the given device and
// returns a ParallelRuntime; UlyssesAttentionFn() binds Ulysses attention over the runtime's SP
// group into a callback with the model's AttentionFn signature (q [b, s/p, hq, d], k/v
// [b, s/p, hkv, d] -> [b, s/p, hq, d]). The model (worker/engine/model) knows nothing about
// either; the training loop (worker/engine/train) ties them together.
//
// Backend choice: "auto" picks NCCL on a CUDA device and Gloo on the CPU; ranks that share one GPU
// must ask for "gloo" (NCCL refuses two ranks on one device; Gloo stages CUDA tensors through host
// memory). Errors name the field and the fix. A ParallelRuntime owns its communicators; the
// attention callback borrows the SP communicator and must not outlive the runtime.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_PARALLELIZE_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_PARALLELIZE_H_

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/attention/attention.h"
#include "worker/engine/parallel/communicator.h"

namespace ulysses::engine {

struct ParallelConfig {
  int64_t sp = 1;  // sequence-parallel degree (ranks per Ulysses group)
  int64_t dp = 1;  // data-parallel replicas; world = sp * dp
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string device = "cpu";    // cpu | cuda:N
  std::string backend = "auto";  // auto | gloo | nccl
  std::chrono::milliseconds timeout{60000};
  std::string attempt;  // CommConfig::attempt
  std::string secret;   // CommConfig::secret
};

struct ParallelRuntime {
  torch::Device device{torch::kCPU};
  ProcessGroups groups;
  int64_t sp = 1, dp = 1;
};

// Validates the layout (sp * dp == world_size, device string), picks the backend and
// rendezvouses. Blocks until every rank joined or the timeout passed.
absl::StatusOr<ParallelRuntime> Parallelize(const ParallelConfig& config);

// doc_ids: [b, s] document ids of the full sequence, or undefined (one document per row).
using AttentionCallback =
    std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& doc_ids)>;

// Ulysses attention over `sp` (plain causal attention at sp size 1). `sp` is borrowed.
AttentionCallback UlyssesAttentionFn(Communicator* sp, const AttentionOptions& options);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_PARALLELIZE_H_
