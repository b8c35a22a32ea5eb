// The CPU AdamW kernel: one pass over each tensor's elements that reads the gradient, updates the
// fp32 target (the parameter or its fp32 master) and both fp32 moments, and writes the bf16
// parameter back, instead of the reference's seven tensor ops (optimizer.cc), each its own pass
// over memory. Vectorised (the element loop is compiled once per x86 ISA -- AVX-512, AVX2+FMA,
// baseline -- and the dynamic loader picks the machine's) and split over the rank's intra-op
// threads (at::parallel_for; rank_setup.h sets how many).
//
// The arithmetic is the reference's, operation for operation and with the same fp32 scalars:
//   w <- w * (1 - lr*wd)                       (matrices only: decoupled weight decay)
//   m <- fma(g, 1-b1, m*b1)                    (libtorch's add_(g, alpha) is a fused multiply-add)
//   v <- fma((1-b2)*g, g, v*b2)                (addcmul_, as libtorch's vector kernels contract it)
//   w <- w + (-lr/bc1 * m) / (sqrt(v / bc2) + eps)      bc_i = 1 - b_i^step
// compiled with -ffp-contract=off (the fmas are explicit), so every ISA clone gives the same bits
// (sqrt and division are correctly rounded everywhere). Against Debian's libtorch 1.13 (CI) that
// is the reference's result to the bit; another libtorch build may round addcmul_ without the fma,
// so the test's general bound is fp32 rounding (tests/worker/engine/train/cpu_adamw_test.cc).
//
// bf16 parameters are rounded from the fp32 master to nearest-even, as c10::BFloat16's conversion
// (copy_) does; a NaN master gives a NaN parameter (0x7FC0; libtorch's vector copy writes 0xFFFF).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_CPU_ADAMW_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_CPU_ADAMW_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace ulysses::engine::train {

// One step's hyper-parameters; step counts from 1 (the bias correction of the first update).
struct CpuAdamWStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;
};

// One tensor's update. target, exp_avg, exp_avg_sq: contiguous fp32 CPU tensors of one numel;
// grad: contiguous fp32 or bf16 CPU tensor of that numel; param: the tensor to write the rounded
// target into (contiguous bf16 CPU), or undefined when the target is the parameter itself.
struct CpuAdamWTensors {
  torch::Tensor target, exp_avg, exp_avg_sq, grad, param;
  bool decays = false;  // decoupled weight decay applies (matrices)
};

// True when the kernel takes these tensors (else the caller runs the reference loop).
bool CpuAdamWApplies(const CpuAdamWTensors& t);

// Updates every entry in place (each must satisfy CpuAdamWApplies), elements split over the
// intra-op threads.
void CpuAdamWUpdate(const std::vector<CpuAdamWTensors>& tensors, const CpuAdamWStep& step);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_CPU_ADAMW_H_
