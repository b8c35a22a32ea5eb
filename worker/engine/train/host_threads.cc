#include "worker/engine/train/host_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>

#include <torch/cuda.h>

namespace ulysses::engine::train {

int RanksOnThisHost(const torch::Device& device, int world_size) {
  if (!device.is_cuda()) return world_size;
  return std::max(1, std::min<int>(world_size, static_cast<int>(torch::cuda::device_count())));
}

int SetIntraOpThreads(int threads) {
  at::set_num_threads(threads);
  // OpenBLAS's C API (cblas.h), looked up at run time: the engine links the BLAS interface, not
  // OpenBLAS, and another implementation (MKL in pip torch, which at::set_num_threads covers)
  // has no such symbols.
  using SetFn = void (*)(int);
  using GetFn = int (*)();
  auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (set == nullptr || get == nullptr) return 0;
  set(threads);
  return get();
}

}  // namespace ulysses::engine::train
