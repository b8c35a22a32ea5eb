#include "worker/engine/train/host_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

namespace ulysses::engine::train {
namespace {

// --intra-op-threads must bound OpenBLAS's pool too: at::set_num_threads alone left every
// rank's matmuls on one OpenBLAS thread per core.
TEST(SetIntraOpThreadsTest, BoundsLibtorchAndOpenBlasPools) {
  using GetFn = int (*)();
  auto openblas_threads = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (openblas_threads == nullptr) {
    GTEST_SKIP() << "the BLAS library in this build is not OpenBLAS";
  }
  const int before = openblas_threads();
  EXPECT_EQ(SetIntraOpThreads(1), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(openblas_threads(), 1);
  if (before >= 2) {
    EXPECT_EQ(SetIntraOpThreads(2), 2);
    EXPECT_EQ(at::get_num_threads(), 2);
    EXPECT_EQ(openblas_threads(), 2);
  }
}

}  // namespace
}  // namespace ulysses::engine::train
