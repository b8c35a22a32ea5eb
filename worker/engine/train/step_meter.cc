#include "worker/engine/train/step_meter.h"

#include <algorithm>
#include <string>

#include "common/process/host_memory.h"
#include "common/spec/memory_model.h"
#include "worker/engine/parallel/alltoall_clock.h"
#include "worker/engine/train/device_memory.h"
#include "worker/engine/train/train_step.h"

// The CUDA runtime is linked where the toolkit was found (ULYSSES_HAVE_CUDA).
#if defined(ULYSSES_TORCH_CUDA) && defined(ULYSSES_HAVE_CUDA)
#include <cuda_runtime_api.h>
#define ULYSSES_STEP_METER_CUDART 1
#endif

namespace ulysses::engine::train {

int64_t MemoryLimitBytes(const torch::Device& device) {
  if (device.is_cuda()) {
#ifdef ULYSSES_STEP_METER_CUDART
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index() < 0 ? 0 : device.index()) != cudaSuccess) {
      return 0;
    }
    return static_cast<int64_t>(prop.totalGlobalMem);
#else
    return 0;  // No CUDA runtime linked: unknown.
#endif
  }
  const int64_t physical = process::PhysicalMemoryBytes();
  const int64_t limit = process::CgroupMemoryLimitBytes();
  if (limit == 0 || (physical > 0 && limit > physical)) return physical;
  return limit;
}

StepMeter::StepMeter(torch::Device device, const Communicator* alltoall_comm,
                     double flops_per_token)
    : device_(device),
      comm_(alltoall_comm),
      flops_per_token_(flops_per_token),
      memory_limit_(MemoryLimitBytes(device)) {}

void StepMeter::Begin() {
  begin_ = batches_ready_ = Clock::now();
  alltoall_seconds_begin_ = SeqAllToAllSeconds();
  alltoall_bytes_begin_ = comm_ == nullptr ? 0 : comm_->bytes_sent();
}

void StepMeter::BatchesReady() { batches_ready_ = Clock::now(); }

RankStepFigures StepMeter::Finish(const StepStats& stats, double rank_tokens) {
  RankStepFigures f;
  const auto end = Clock::now();
  f.step_seconds = std::chrono::duration<double>(end - begin_).count();
  f.data_wait_seconds = std::chrono::duration<double>(batches_ready_ - begin_).count();
  f.forward_seconds = std::max(0.0, stats.forward_seconds);
  f.backward_seconds = std::max(0.0, stats.backward_seconds);
  f.optimizer_seconds =
      std::max(0.0, f.step_seconds - f.data_wait_seconds - f.forward_seconds - f.backward_seconds);
  f.alltoall_seconds = std::max(0.0, SeqAllToAllSeconds() - alltoall_seconds_begin_);
  f.alltoall_bytes =
      comm_ == nullptr ? 0 : std::max<int64_t>(0, comm_->bytes_sent() - alltoall_bytes_begin_);
  const DeviceMemory memory = ReadDeviceMemory(device_);
  f.peak_allocated_bytes = std::max<int64_t>(0, memory.peak_allocated);
  f.peak_reserved_bytes = std::max<int64_t>(0, memory.peak_reserved);
  f.memory_limit_bytes = memory_limit_;
  const double seconds = std::max(f.step_seconds, 1e-9);
  f.rank_tokens_per_s = std::max(0.0, rank_tokens) / seconds;
  f.model_flops_per_s = flops_per_token_ > 0 ? f.rank_tokens_per_s * flops_per_token_ : 0;
  return f;
}

}  // namespace ulysses::engine::train
