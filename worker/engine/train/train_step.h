// One optimizer step of one rank: forward/backward over the rank's micro-batches, the world
// reduction of gradients and loss statistics, gradient scaling, clipping and the AdamW update.
//
// Loss/gradient math (SP exactness): each rank backpropagates its LOCAL loss sum; gradients and
// (loss_sum, token_count) are summed over the world group (SP x DP); gradients are then divided by
// max(total_tokens, 1). The sequence all-to-all's backward routes every token's gradient to the
// rank that owns the parameter use, so the world sum of local loss-sum gradients is exactly the
// full-sequence gradient: sp=P matches sp=1 up to float reassociation, and dp=D matches one rank
// over the same D sequences.
//
// Mixed precision: with bfloat16/float16 parameters, each micro-batch's low-precision gradients
// are accumulated into fp32 buffers, reduced over the world in fp32, and AdamW updates fp32
// masters (optimizer.h); softmax, norms and the loss are computed in fp32 by the model. float16
// adds dynamic loss scaling (LossScaler): the loss is multiplied by the scale before backward, the
// gradients divided by it after; an overflow skips the step and halves the scale, and every
// LossScaler::kGrowthInterval good steps double it.
//
// Non-finite steps: when the world loss or the gradient norm is NaN/inf, no parameter or
// optimizer state changes (the step is skipped and reported as such); the loop fails the stage
// after a run of them (kMaxConsecutiveSkippedSteps).
//
// ZeRO (zero.h): with a ZeroSharding, stage 1 all-reduces the gradients as above and updates only
// the owned chunks; stages 2-3 reduce-scatter gradient chunks instead (per layer in backward, or
// after each micro-batch) and the norm, clipping and update run on chunks; stage 3 gathers the
// outer parameters for the step. The per-step loss, norm and updates equal stage 0's.
//
// The Trainer borrows the model, the attention callback's communicator, the world communicator
// and the optimizer; none may be destroyed while it is used. Not thread-safe. Errors: libtorch
// exceptions become INTERNAL (RESOURCE_EXHAUSTED for out-of-memory) naming the step and
// micro-batch; a failed collective returns its Status. After an error the model and optimizer state
// are unspecified (the caller resumes from the last committed checkpoint).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_TRAIN_STEP_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_TRAIN_STEP_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/data/sharding.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/parallelize.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/optimizer.h"
#include "worker/engine/train/zero.h"

namespace ulysses::engine::train {

struct StepStats {
  double loss = 0;        // world loss sum / max(world tokens, 1)
  double tokens = 0;      // world count of scored tokens
  double grad_norm = 0;   // global L2 norm of the averaged gradient, before clipping
  bool skipped = false;   // loss or grad_norm was non-finite: nothing was updated
  double loss_scale = 1;  // the scale this step ran with (float16 only; 1 otherwise)
  // Host wall time of this rank's forward and backward passes over its micro-batches (each
  // backward ends with the loss read, so on CUDA it also waits for the queued forward work).
  double forward_seconds = 0;
  double backward_seconds = 0;
};

// Dynamic loss scale for float16 training. Checkpointed (scale, good_steps).
struct LossScaler {
  static constexpr double kInitialScale = 65536.0;
  static constexpr int64_t kGrowthInterval = 1000;
  bool enabled = false;
  double scale = 1.0;
  int64_t good_steps = 0;
  // After a step: halve on overflow (never below 2^-24), double after kGrowthInterval good steps.
  void Update(bool overflow);
};

// A stage fails (FAILED_PRECONDITION) after this many consecutive skipped steps: with float16
// the scaler has halved 2^16 past any usable scale by then; with other dtypes a persistent
// NaN/inf means the run diverged.
inline constexpr int64_t kMaxConsecutiveSkippedSteps = 32;

class Trainer {
 public:
  Trainer(model::LlamaForCausalLM model, AttentionCallback attention, Communicator* world,
          AdamW* optimizer, double grad_clip, torch::Device device, ZeroSharding* zero = nullptr);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step at learning rate `lr` over this rank's micro-batches (CPU tensors; moved
  // to the device here). `step` only labels errors.
  absl::StatusOr<StepStats> Step(const std::vector<LocalShard>& micro_batches, double lr,
                                 int64_t step);

  const NamedParams& params() const { return params_; }
  LossScaler& loss_scaler() { return scaler_; }
  // Bytes of the fp32 gradient accumulators (bench/zero_memory).
  int64_t accumulator_bytes() const;

 private:
  // ZeRO >= 2: reduce (loss, tokens), finish the gradient chunks, update them.
  absl::StatusOr<StepStats> ShardedUpdate(double local_loss, int64_t local_tokens, double lr,
                                          double scale, int64_t step);

  model::LlamaForCausalLM model_;
  AttentionCallback attention_;
  Communicator* world_;
  AdamW* optimizer_;
  double grad_clip_;
  torch::Device device_;
  ZeroSharding* zero_;
  NamedParams params_;
  // fp32 gradient accumulators of low-precision params (undefined for fp32/fp64 params).
  std::vector<torch::Tensor> grad32_;
  LossScaler scaler_;
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_TRAIN_STEP_H_
