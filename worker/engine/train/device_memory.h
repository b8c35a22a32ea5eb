// Memory of the device a rank trains on. CUDA devices report the caching allocator's counters
// (bytes allocated to tensors, bytes reserved from the driver, and their peaks since the last
// reset); the CPU reports the process's resident set (current) and its high-water mark (peak) for
// both. Thread-safe (reads counters); ResetPeak affects later reads on every thread.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_DEVICE_MEMORY_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_DEVICE_MEMORY_H_

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace ulysses::engine::train {

struct DeviceMemory {
  int64_t allocated = 0;
  int64_t reserved = 0;
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
};

DeviceMemory ReadDeviceMemory(const torch::Device& device);
// CUDA: starts a new peak window. CPU: no-op (the kernel's high-water mark cannot be reset).
void ResetPeakDeviceMemory(const torch::Device& device);
// CUDA: returns cached, unused blocks to the driver (after an out-of-memory step). CPU: no-op.
void EmptyDeviceCache(const torch::Device& device);

// The CUDA caching allocator's settings, before the first CUDA allocation of the process: with
// libtorch >= 2.1, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless the variable is set
// (segments grow in place instead of fragmenting into fixed blocks: less memory reserved at
// long sequences). Returns the value in effect ("" = libtorch's defaults). Older libtorch rejects
// the option, so nothing is set there. Call at the start of main, before threads start.
std::string ConfigureCudaAllocator();

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_DEVICE_MEMORY_H_
