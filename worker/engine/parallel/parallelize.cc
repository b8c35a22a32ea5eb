#include "worker/engine/parallel/parallelize.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/parallel/ulysses_attention.h"

namespace ulysses::engine {

absl::StatusOr<ParallelRuntime> Parallelize(const ParallelConfig& config) {
  if (config.sp < 1 || config.dp < 1 || config.sp * config.dp != config.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--world-size: ", config.world_size,
                                                   " != sp_degree ", config.sp, " x dp_degree ",
                                                   config.dp, " of this stage"));
  }
  ParallelRuntime rt;
  rt.sp = config.sp;
  rt.dp = config.dp;
  try {
    rt.device = torch::Device(config.device);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", config.device, "' is not a device (use cpu or cuda:N)"));
  }
  std::string backend = config.backend;
  if (backend != "auto" && backend != "gloo" && backend != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: '", backend, "' is not auto, gloo or nccl"));
  }
  if (backend == "auto") backend = rt.device.is_cuda() ? "nccl" : "gloo";
  CommConfig comm;
  comm.backend = backend;
  comm.master_addr = config.master_addr;
  comm.master_port = config.master_port;
  comm.rank = config.rank;
  comm.world_size = config.world_size;
  comm.sp_size = static_cast<int>(config.sp);
  comm.device = config.device;
  comm.timeout = config.timeout;
  comm.attempt = config.attempt;
  comm.secret = config.secret;
  ASSIGN_OR_RETURN(rt.groups, CreateProcessGroups(comm));
  return rt;
}

AttentionCallback UlyssesAttentionFn(Communicator* sp, const AttentionOptions& options) {
  return [sp, options](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& doc_ids) {
    return UlyssesAttention(q, k, v, sp, options, doc_ids);
  };
}

}  // namespace ulysses::engine
