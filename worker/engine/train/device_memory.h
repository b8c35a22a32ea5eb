// Memory of the device a rank trains on. CUDA devices report the caching allocator's counters
// (bytes allocated to tensors, bytes reserved from the driver, and their peaks since the last
// reset); the CPU reports the process's resident set (current) and its high-water mark (peak) for
// both. Thread-safe (reads counters); ResetPeak affects later reads on every thread.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_DEVICE_MEMORY_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_DEVICE_MEMORY_H_

#include <torch/types.h>

#include <cstdint>

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

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_DEVICE_MEMORY_H_
