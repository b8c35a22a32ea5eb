// The one definition of model FLOPs per token and MFU. Every figure that says "MFU" or
// "TFLOP/s" uses it: the engine's progress line and step events, the worker's
// ulysses_rank_mfu_ratio gauge, `ulyssesctl plan`, bench/gpu/engine_bench and
// bench/gpu/hf_bench.py (whose Python copy,
// bench/gpu/model_math.py, is checked against this one by tests/common/spec/model_math_test.cc).
//
// Convention (docs/ENGINE.md "MFU"): a trained token costs
//   6 * N + 6 * layers * hidden * seq_len
// where N = the decoder layers' parameters + the lm_head matmul (vocab * hidden, counted also
// when tied to the embeddings: the matmul runs either way); the embedding lookup and the final
// norm are not counted. 6 = forward 2 + backward 4 FLOPs per parameter per token. The second
// term is causal attention: QK^T and AV are 4 * seq_len * hidden FLOPs per token per layer
// forward over the full square, half of that under the causal mask, times 3 for forward and
// backward. Recomputation (activation checkpointing, tiled MLP/loss) is not counted: MFU, not
// HFU; RecomputeFlopsPerToken gives what the memory options add (hardware FLOPs).
#ifndef ULYSSES_COMMON_SPEC_MODEL_MATH_H_
#define ULYSSES_COMMON_SPEC_MODEL_MATH_H_

#include <cstdint>
#include <optional>

#include "common/spec/model_shape.h"

namespace ulysses::spec {

// Model FLOPs per trained token at this sequence length (the convention above).
double ModelFlopsPerToken(const ModelShape& shape, int64_t seq_len);

// The memory options that recompute forward work in the backward pass (spec.memory).
struct RecomputeOptions {
  bool activation_checkpointing = false;  // Every layer's forward once more.
  bool tiled_mlp = false;                 // The MLP forward once more (without checkpointing).
  bool tiled_loss = false;                // The lm_head logits once more.
  // With activation_checkpointing: attention's forward is not run again (kept from the first).
  bool keep_attention_outputs = false;
};

// FLOPs per token those options add on top of ModelFlopsPerToken (hardware, not model FLOPs).
double RecomputeFlopsPerToken(const ModelShape& shape, int64_t seq_len,
                              const RecomputeOptions& options);

// Model FLOPs utilisation: flops_per_token * tokens_per_s / (devices * peak_flops_per_s), where
// tokens_per_s counts every token the `devices` trained together. nullopt when a figure is
// unknown or not positive (peak 0 = unknown) or the result is not finite.
std::optional<double> Mfu(double flops_per_token, double tokens_per_s, int64_t devices,
                          double peak_flops_per_s);

// The same ratio from a model FLOP rate already multiplied out (flops_per_token x tokens_per_s,
// e.g. a rank's step event model_flops_per_s): model_flops_per_s / (devices * peak). Mfu above
// is this; the worker's ulysses_rank_mfu_ratio gauge (devices = 1) uses it. nullopt as Mfu.
std::optional<double> MfuOfFlopRate(double model_flops_per_s, int64_t devices,
                                    double peak_flops_per_s);

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_MODEL_MATH_H_
