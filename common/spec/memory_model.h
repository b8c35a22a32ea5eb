// Per-rank model-state memory (parameters, gradients, optimizer state) of a
// Llama model under a ZeRO stage: ONE formula shared by the planner
// (client/plan.cc, `ulyssesctl plan`) and the engine's memory benchmark
// (bench/), which checks it against measured bytes. Pure arithmetic.
//
// What the engine keeps per parameter element (AdamW, worker/engine/train/optimizer.h):
//   parameter  b bytes (the model dtype: 8 fp64, 4 fp32, 2 bf16/fp16)
//   gradient   g = 4 for bf16/fp16 parameters (fp32 gradients), else b
//   optimizer  exp_avg + exp_avg_sq (2 * g) plus an fp32 master copy (4) for bf16/fp16
// ZeRO shards over all W = sp * dp ranks of a stage (every rank of a Ulysses
// group holds the same weights):
//   stage 0: P*b + P*g + P*o              (all replicated)
//   stage 1: P*b + P*g + P*o/W            (optimizer state sharded)
//   stage 2: P*b + P*g/W + P*o/W + L*g    (gradients reduce-scattered; one layer's
//                                          full gradients live while it is reduced)
//   stage 3: P*b/W + P*g/W + P*o/W + 2*L*(b+g)  (parameters sharded; the layer in
//                                          use and the next are gathered, with grads)
// where P = parameter count and L = parameters of the largest unit gathered at
// once (a decoder layer, or the embedding / lm_head matrix when bigger).
// offload_optimizer moves the optimizer term to host memory (device term 0).
#ifndef ULYSSES_COMMON_SPEC_MEMORY_MODEL_H_
#define ULYSSES_COMMON_SPEC_MEMORY_MODEL_H_

#include <cstdint>
#include <string>

#include "common/spec/model_shape.h"

namespace ulysses::spec {

// Parameter counts of a model shape (embeddings, decoder layers, final norm, lm_head).
struct ParameterCounts {
  double total = 0;         // P
  double per_layer = 0;     // One decoder layer.
  double embedding = 0;     // embed_tokens (and lm_head, each, when untied).
  double largest_unit = 0;  // L: max(per_layer, embedding).
};
ParameterCounts CountParameters(const ModelShape& shape);

// Bytes per element of a model dtype name ("float64" 8, "float32" 4, "bfloat16"/"float16" 2).
int64_t DtypeBytes(const std::string& dtype);

struct ModelStateInputs {
  ParameterCounts params;
  std::string dtype = "float32";
  int64_t zero_stage = 0;  // 0..3
  int64_t world = 1;       // sp * dp ranks the state is sharded over (stages 1-3)
  bool offload_optimizer = false;
};

// Per-rank bytes. `device_*` are what the accelerator holds; host_optimizer is
// the optimizer state kept in host memory when offloaded (else 0).
struct ModelStateBytes {
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;       // On the device (0 when offloaded).
  double host_optimizer = 0;  // In host memory when offload_optimizer.
  double gathered = 0;        // ZeRO 2/3 transient full-layer buffers (see above).
  double DeviceTotal() const { return parameters + gradients + optimizer + gathered; }
};
ModelStateBytes ModelStatePerRank(const ModelStateInputs& in);

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_MEMORY_MODEL_H_
