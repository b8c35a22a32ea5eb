// The model's memory math, in one place (FLOPs are in model_math.h, dtype sizes in
// common/dtype.h): parameter counts; per-rank model-state memory (parameters, gradients,
// optimizer state) of a Llama model under a ZeRO stage; activation bytes per micro-batch; the
// host memory of an asynchronous checkpoint's snapshot and the choice it drives. Shared by the
// planner (client/plan.cc, `ulyssesctl plan`), the engine (checkpoint mode, ZeRO buffers) and
// the memory benchmarks (bench/), which check it against measured bytes. Pure arithmetic.
//
// What the engine keeps per parameter element (AdamW, worker/engine/train/optimizer.h):
//   parameter  b bytes (the model dtype: 8 fp64, 4 fp32, 2 bf16/fp16)
//   gradient   g = 4 for bf16/fp16 parameters (fp32 gradients), else b
//   optimizer  exp_avg + exp_avg_sq (2 * g) plus an fp32 master copy (4) for bf16/fp16
// ZeRO (worker/engine/train/zero.h) shards over all W = sp * dp ranks of a stage (every rank of
// a Ulysses group holds the same weights). What the engine holds per rank:
//   stage 0: P*b + P*g + P*o                     (all replicated)
//   stage 1: P*b + P*b/W + P*g + P*o/W           (optimizer state sharded; the owned parameter
//                                                 chunk is a separate copy AdamW updates)
//   stage 2: P*b + P*b/W + P*g/W + P*o/W + T2*g  (gradients reduce-scattered into chunks)
//   stage 3: P*b/W + P*g/W + P*o/W + (O+Y)*(b+g) (parameters sharded)
// where P = parameter count, Y = one decoder layer, O = the outer parameters (embeddings, final
// norm, lm_head; gathered for the whole step at stage 3, with their full gradients), and the
// transient full gradients of stage 2 are T2 = O + Y with activation checkpointing (each layer
// reduces right after its recomputed backward) and P without (reduced after backward).
// offload_optimizer (stages 1-3) moves the optimizer term to host memory (device term 0) with a
// host copy of the parameter chunk that AdamW updates: host_optimizer = P*o/W + P*b/W.
#ifndef ULYSSES_COMMON_SPEC_MEMORY_MODEL_H_
#define ULYSSES_COMMON_SPEC_MEMORY_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "common/spec/model_shape.h"

namespace ulysses::spec {

// Parameter counts of a model shape (embeddings, decoder layers, final norm, lm_head).
struct ParameterCounts {
  double total = 0;           // P
  double per_layer = 0;       // One decoder layer.
  double embedding = 0;       // embed_tokens (and lm_head, each, when untied).
  double largest_unit = 0;    // max(per_layer, embedding).
  double outer = 0;           // O: embeddings + final norm + lm_head (untied).
  double largest_tensor = 0;  // The largest single parameter: max(V*H, H*I, Hq*D*H).
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
  // memory.activation_checkpointing: at stage 2 full gradients then live one layer at a time.
  bool activation_checkpointing = false;
};

// Per-rank bytes. `device_*` are what the accelerator holds; host_optimizer is
// the optimizer state kept in host memory when offloaded (else 0).
struct ModelStateBytes {
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;       // On the device (0 when offloaded).
  double host_optimizer = 0;  // In host memory when offload_optimizer.
  double gathered = 0;        // ZeRO 2/3 transient full buffers during a step (see above).
  double DeviceTotal() const { return parameters + gradients + optimizer + gathered; }
};
ModelStateBytes ModelStatePerRank(const ModelStateInputs& in);

// Per-rank peaks while a rank builds its state, before its first step (what the engine does,
// worker/engine/train/engine.cc RunRankImpl, zero.cc Create/LoadOwnedState, checkpoint_load.cc).
// `device` is what the accelerator holds, `host` the host memory (on a cpu device the two add
// up). P = parameters, W = world, L = the largest tensor, b/g/o as above, S = a rank's share of
// the checkpoint (resume.h ResumeShare: (b+o)P/W at stage 3, b*P + o*P/W at 1-2, (b+o)P at 0).
//   init (seeded):  stage 3 (sharded init): device (b+g)P/W; host: the offloaded chunk copy b*P/W
//                   and one parameter made whole in fp32, converted and padded (L*(4+2b)).
//                   stages 0-2: the full model b*P (+ the chunks (b [+g])P/W), one fp32 tensor.
//   import (init_from): stage 3: as init, plus every kept range read as fp32 (4*P/W) on the host.
//                   stages 0-2: as init, plus one tensor read and converted (L*(4+4)) at a time.
//   resume:         the loaded share S on the host next to the state being restored: the model
//                   (b*P at 0-2, chunks at 3), the chunks and gradient chunks, and the AdamW state
//                   (o*P/W, o*P at stage 0) where it lives (host when offloaded); plus one
//                   streaming block. S is dropped before the first step.
// AdamW moments do not exist before the first step except on resume; gradients (stages 0-1) not
// before the first backward. The asynchronous checkpoint snapshot is steady state, not here.
struct StartupBytes {
  double init_device = 0, init_host = 0;
  double import_device = 0, import_host = 0;
  double resume_device = 0, resume_host = 0;
  // `ulysses-train export` (one host process, worker/engine/hf/export.cc): one whole tensor
  // read from its pieces in the stored dtype and its converted copy being written: 2*b*L.
  double export_host = 0;
};
// The bounded block a straddling checkpoint piece is streamed through (checkpoint_load.cc).
inline constexpr double kCheckpointStreamBlockBytes = 4.0 * 1024 * 1024;
StartupBytes StartupPerRank(const ModelStateInputs& in);

// Bytes of a checkpoint of the model state: the weights in their dtype, AdamW's two moments and
// the fp32 masters of 16-bit weights (ModelStatePerRank's parameter + optimizer terms at stage 0).
double CheckpointStateBytes(const ParameterCounts& params, const std::string& dtype);

// Host memory one rank's asynchronous-checkpoint snapshot holds: the part of the checkpoint it
// writes. ZeRO (stage >= 1) writes exactly its 1/W chunks; without ZeRO rank r writes the
// tensors whose index % W == r, which is 1/W of the bytes give or take one tensor (bounded here
// by the largest unit: an embedding or a decoder layer's weights with their optimizer state).
double SnapshotBytesPerRank(const ParameterCounts& params, const std::string& dtype, int64_t world,
                            int64_t zero_stage);

// The share of a rank's host memory an asynchronous snapshot may take when the spec leaves
// checkpoint.async unset; the rest stays for the data loader, offloaded state and the page cache.
inline constexpr double kSnapshotHostShare = 0.5;

// Whether checkpoints are saved asynchronously, and why (printed by `ulyssesctl plan`, logged by
// the engine). `requested` is spec.checkpoint.async; when it is unset the save is asynchronous
// iff snapshot_bytes <= kSnapshotHostShare * host_bytes_per_rank (the host memory left to each
// rank of a node after what the job already keeps there). host_bytes_per_rank <= 0 = unknown:
// asynchronous.
struct CheckpointModeChoice {
  bool async = true;
  std::string reason;
};
CheckpointModeChoice ChooseCheckpointMode(std::optional<bool> requested, double snapshot_bytes,
                                          double host_bytes_per_rank);

// Activation bytes per rank for one micro-batch (docs/JOBSPEC.md, "Plan"; derived from
// worker/engine/model/llama.cc and attention/attention.cc: what autograd saves per layer).
struct ActivationInputs {
  ModelShape shape;
  std::string dtype = "float32";
  int64_t tokens = 0;                     // tokens a rank holds per micro-batch: micro_batch x N/P
  int64_t sp = 1;                         // Ulysses degree P
  int64_t kv_heads_exchanged = 0;         // UlyssesKvHeadsExchanged: Hkv, or P when replicated
  bool activation_checkpointing = false;  // spec.memory
  bool keep_attention_outputs = false;    // with checkpointing: + each layer's attention output
  bool tiled_mlp = false;
  bool tiled_loss = false;
  int64_t loss_tile_tokens = 0;
  bool offload_activations = false;  // checkpointed inputs to host memory (on an accelerator)
};
struct ActivationBytes {
  double saved = 0;    // Held from forward to backward on the device.
  double working = 0;  // Peak transient on top of it.
  double host = 0;     // Offloaded to host memory.
};
ActivationBytes ActivationBytesPerRank(const ActivationInputs& in);

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_MEMORY_MODEL_H_
