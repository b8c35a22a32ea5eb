// AdamW on named tensors (HF parameter names) and the per-stage LR schedule.
//
// State: exp_avg / exp_avg_sq per parameter name (fp32 for half/bf16 params, the
// parameter's dtype otherwise) and the number of updates applied so far (bias
// correction uses it; it carries across stages). Weight decay is decoupled and
// applies to matrices (dim >= 2: projections, embeddings, lm_head) but not to
// RMSNorm weights (dim 1).
//
// Mixed precision: for a low-precision parameter (bfloat16/float16) AdamW keeps an fp32 MASTER
// copy; the update is applied to the master and the parameter becomes the master rounded to its
// dtype. Updates far below the parameter's precision (lr 1e-5 on N(0, 0.02) weights, or on
// RMSNorm weights of 1.0) therefore accumulate instead of being rounded away. Masters are part of
// the state (checkpointed), created from the parameter at the first step.
//
// Kernels: fp32 CUDA targets take libtorch's fused multi-tensor AdamW (2.2+); fp32 CPU targets
// with fp32 or bf16 gradients take cpu_adamw.h's kernel (bf16 parameters written by it); anything
// else (fp64, fp16 parameters) takes the reference loop of tensor ops in AdamW::Step.
//
// Not thread-safe. Step() mutates the parameters in place under no-grad.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_OPTIMIZER_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_OPTIMIZER_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"

namespace ulysses::engine::train {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

// Checkpoint name prefix of the fp32 master of a low-precision parameter: "optim/master/<name>".
inline constexpr char kMasterPrefix[] = "optim/master/";

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // fp32 CPU targets (fp32 parameters, the fp32 masters of bf16 ones; the offloaded host state)
  // take the one-pass vectorised kernel (cpu_adamw.h); false: the per-tensor reference loop for
  // every target (the kernel's tests and bench/cpu_adam compare the two).
  bool fast_cpu = true;
};

// True for parameters that get weight decay (matrices), false for norm weights.
bool DecaysWeight(const std::string& name, const torch::Tensor& param);

class AdamW {
 public:
  explicit AdamW(const AdamWConfig& config) : config_(config) {}

  // One update with learning rate lr. grads[i] is the averaged gradient of params[i] (any
  // floating dtype; fp32 for low-precision params keeps its precision); undefined grads skip.
  void Step(const NamedParams& params, const std::vector<torch::Tensor>& grads, double lr);
  // The same with each param's .grad().
  void Step(const NamedParams& params, double lr);

  int64_t step_count() const { return step_count_; }
  // Fixes whether `name` gets weight decay, instead of DecaysWeight() on the tensor it updates
  // (ZeRO updates flat chunks, whose dim no longer tells matrices from norm weights).
  void SetDecays(const std::string& name, bool decays) { decays_[name] = decays; }
  // The fp32 master of a low-precision parameter (undefined before its first step, and for
  // fp32/fp64 parameters, which are their own master).
  torch::Tensor Master(const std::string& name) const;
  // Checkpoint view: "optim/exp_avg/<name>", "optim/exp_avg_sq/<name>" and, for low-precision
  // parameters, "optim/master/<name>".
  std::vector<std::pair<std::string, torch::Tensor>> StateTensors() const;
  // Restores from StateTensors()' names; missing moments are an error naming them. A missing
  // master is recreated from the parameter.
  absl::Status LoadState(const NamedParams& params,
                         const std::map<std::string, torch::Tensor>& tensors, int64_t step_count);

 private:
  // The update through libtorch's fused multi-tensor AdamW when every target is an fp32 CUDA
  // tensor (and libtorch has it); false when the caller must run the per-tensor loop.
  bool FusedStep(const NamedParams& params, const std::vector<torch::Tensor>& grads,
                 const std::vector<torch::Tensor>& targets, double lr);
  // Updates (and clears from `targets`) every entry the CPU kernel takes; `written[i]` says the
  // kernel also wrote the low-precision parameter.
  void CpuStep(const NamedParams& params, const std::vector<torch::Tensor>& grads,
               std::vector<torch::Tensor>& targets, std::vector<bool>& written, double lr);

  AdamWConfig config_;
  int64_t step_count_ = 0;
  bool Decays(const std::string& name, const torch::Tensor& target) const;

  std::map<std::string, torch::Tensor> exp_avg_, exp_avg_sq_, master_;
  std::map<std::string, bool> decays_;
};

// True for bfloat16/float16 tensors (those that get an fp32 master and fp32 gradients).
bool IsLowPrecision(const torch::Tensor& t);

// LR at step_in_stage of a stage with `steps` steps: linear warmup over `warmup`
// steps to peak (lr * (t+1)/warmup), then constant | linear | cosine decay towards
// min_lr_ratio * peak at the last step.
double ScheduledLr(const std::string& schedule, double peak, double min_lr_ratio, int64_t warmup,
                   int64_t steps, int64_t step_in_stage);

// Global L2 norm of the grads (computed in fp64); when clip > 0 and norm > clip scales them by
// clip/norm. Returns the pre-clip norm (non-finite when any gradient is; nothing is scaled then).
double ClipGradNorm(const std::vector<torch::Tensor>& grads, double clip);
// The same for grads / divisor (the summed gradients over the token count and loss scale),
// folded: one _foreach_norm pass reads the grads, and one _foreach_mul_ writes them with the
// division and the clipping coefficient together (instead of divide, read, scale). Returns the
// pre-clip norm of grads / divisor; non-finite: the grads are only divided.
double DivideAndClipGrads(const std::vector<torch::Tensor>& grads, double divisor, double clip);
// The global norm of `grads` from one _foreach_norm pass: per-tensor norms in the grads' dtype
// (fp16/bf16 ones in fp32), combined in fp64 (one host sync). Undefined grads are skipped.
double GlobalGradNorm(const std::vector<torch::Tensor>& grads);
// The sum of the squared per-tensor norms, as GlobalGradNorm squared: an fp64 [1] tensor on the
// grads' device (no host sync; ZeRO all-reduces it), [1] zeros on the CPU when there is none.
torch::Tensor SquaredGradNormSum(const std::vector<torch::Tensor>& grads);
// The same over each param's .grad().
double ClipGradNorm(const NamedParams& params, double clip);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_OPTIMIZER_H_
