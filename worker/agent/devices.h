// The devices a worker runs ranks on: one slot per device (docs/COORDINATOR.md
// "Placement"). A worker owns every GPU of its node and runs one rank per GPU, so the ranks
// of one SP group on one node talk over NVLink and shared memory.
#ifndef ULYSSES_WORKER_AGENT_DEVICES_H_
#define ULYSSES_WORKER_AGENT_DEVICES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ulysses::agent {

// The slots of `--devices SPEC` with `--capacity N` (0 = unset):
//   auto             every visible GPU (`visible_gpus` of them: cuda:0 .. cuda:k-1), else cpu;
//   cpu              N CPU slots (1 without --capacity);
//   cuda:0-7         a range; cuda:0,cuda:2 a list (each GPU once: NCCL runs one rank per GPU).
// With GPUs, --capacity may only repeat the device count. Errors name the flag, the value and
// the fix.
absl::StatusOr<std::vector<std::string>> ParseDevices(const std::string& spec, int capacity,
                                                      int visible_gpus);

// GPUs this process may use: the entries of $CUDA_VISIBLE_DEVICES when it is set, else the
// /dev/nvidia<N> device files.
int CountVisibleGpus();

// The GPU models the NVIDIA driver reports, one per GPU of the node, sorted: the "Model:"
// line of <root>/<pci bus>/information ("NVIDIA H100 80GB HBM3"). Empty without the driver.
std::vector<std::string> GpuModels(const std::string& root = "/proc/driver/nvidia/gpus");

// The MFU denominator a worker takes without --peak-flops: the dense bf16 peak of its GPUs'
// model from common/spec/gpu_peaks.h, with `why` saying where it came from or what to pass.
// 0 when there are no GPUs, the models differ, or the model is not in the table.
struct PeakFlops {
  double flops = 0;
  std::string why;
};
PeakFlops PeakFlopsOfModels(const std::vector<std::string>& models);

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_DEVICES_H_
