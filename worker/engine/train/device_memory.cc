#include "worker/engine/train/device_memory.h"

#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "worker/engine/torch_compat.h"

#ifdef ULYSSES_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace ulysses::engine::train {
namespace {

int64_t CurrentRssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

int64_t PeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace

DeviceMemory ReadDeviceMemory(const torch::Device& device) {
  DeviceMemory m;
#ifdef ULYSSES_TORCH_CUDA
  if (device.is_cuda()) {
    // Index 0 of each stat array is the aggregate over the small and large pools.
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    m.allocated = stats.allocated_bytes[0].current;
    m.reserved = stats.reserved_bytes[0].current;
    m.peak_allocated = stats.allocated_bytes[0].peak;
    m.peak_reserved = stats.reserved_bytes[0].peak;
    return m;
  }
#endif
  m.allocated = m.reserved = CurrentRssBytes();
  m.peak_allocated = m.peak_reserved = PeakRssBytes();
  return m;
}

void ResetPeakDeviceMemory(const torch::Device& device) {
#ifdef ULYSSES_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

void EmptyDeviceCache(const torch::Device& device) {
#ifdef ULYSSES_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

std::string ConfigureCudaAllocator() {
  if (const char* set = std::getenv("PYTORCH_CUDA_ALLOC_CONF"); set != nullptr) return set;
#if ULYSSES_TORCH_AT_LEAST(2, 1)
  setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", /*overwrite=*/0);
  return "expandable_segments:True";
#else
  return "";
#endif
}

}  // namespace ulysses::engine::train
