// The one place where the engine's code depends on the libtorch version or on whether libtorch
// was built with CUDA. CI builds against Debian's libtorch 1.13 (CPU); GPU machines build against
// a pip PyTorch 2.x (CUDA). Everything else includes this header and tests these macros instead
// of comparing TORCH_VERSION_* itself.
//
//   ULYSSES_TORCH_CUDA            libtorch has CUDA kernels and the CUDA caching allocator
//                                 (defined by CMake when libc10_cuda is found next to libtorch)
//   ULYSSES_TORCH_HAS_SDPA        at::scaled_dot_product_attention and at::_fused_sdp_choice (2.0)
//   ULYSSES_TORCH_HAS_SDPA_GQA    their enable_gqa argument: kv heads shared by query groups (2.5)
//   ULYSSES_TORCH_HAS_FUSED_ADAMW at::_fused_adamw_, one multi-tensor AdamW kernel on CUDA (2.2)
#ifndef ULYSSES_WORKER_ENGINE_TORCH_COMPAT_H_
#define ULYSSES_WORKER_ENGINE_TORCH_COMPAT_H_

#include <torch/version.h>

#define ULYSSES_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||          \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#define ULYSSES_TORCH_HAS_SDPA ULYSSES_TORCH_AT_LEAST(2, 0)
#define ULYSSES_TORCH_HAS_SDPA_GQA ULYSSES_TORCH_AT_LEAST(2, 5)
#define ULYSSES_TORCH_HAS_FUSED_ADAMW ULYSSES_TORCH_AT_LEAST(2, 2)

#endif  // ULYSSES_WORKER_ENGINE_TORCH_COMPAT_H_
