// The TrainJob spec (apiVersion: ulysses/v1, kind: TrainJob): one struct per
// YAML section, parsed and validated once (job_spec_parser.h), then shared by
// ulysses-train, the worker engine and the coordinator.
//
// Every field has a default and a one-line doc. Field names match the YAML keys
// exactly; the document shape is a contract (see docs/JOBSPEC.md).
//
//   apiVersion: ulysses/v1
//   kind: TrainJob
//   metadata: {name: tiny-demo, labels: {team: research}}
//   spec:
//     model: {preset: tiny}
//     data: {train: data/train.bin, validation: data/val.bin}
//     parallelism: {sp_degree: 2, dp_degree: 1}
//     optimizer: {lr: 3.0e-4, warmup_steps: 10}
//     stages:
//       - {seq_len: 1024, steps: 20}
//       - {seq_len: 4096, steps: 10, sp_degree: 4}
//     checkpoint: {every_steps: 10, keep_last: 2}
//     seed: 1234
#ifndef ULYSSES_COMMON_SPEC_JOB_SPEC_H_
#define ULYSSES_COMMON_SPEC_JOB_SPEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/spec/model_shape.h"

namespace ulysses::spec {

inline constexpr char kApiVersion[] = "ulysses/v1";
inline constexpr char kKind[] = "TrainJob";

// Bounds every reader of a TrainJob applies (ulyssesctl and the coordinator alike):
// the document's size in bytes, the number of stages, the ranks (sp x dp) of a stage.
inline constexpr int64_t kMaxSpecBytes = 256 * 1024;
inline constexpr int64_t kMaxStages = 64;
inline constexpr int64_t kMaxWorldSize = 1 << 20;
// |scheduling.priority| <= this (the coordinator caps non-admin priorities lower).
inline constexpr int64_t kMaxPriority = 1000000;

struct Metadata {
  std::string name;                           // Required. DNS-1123 label: [a-z0-9-], <= 63 chars.
  std::map<std::string, std::string> labels;  // Free-form key/value labels.
};

// spec.model is spec::ModelSpec (common/spec/model_shape.h): the model shape
// (ModelShape) plus preset, init_from and dtype.

// Synthetic data, used when no token files are given.
struct SyntheticDataSpec {
  std::string generator;             // "random" or "needle" (long-range key->value retrieval).
  int64_t validation_sequences = 8;  // Sequences in the validation set (per eval window length).
};

// Training data: flat little-endian uint32 token files, indexed document datasets
// (docs/DATA.md), or a synthetic generator.
struct DataSpec {
  std::string train;                           // Training token file (flat) or prefix (indexed).
  std::string validation;                      // Validation file / prefix ("" = none).
  std::optional<SyntheticDataSpec> synthetic;  // Set instead of train/validation.
  std::string format = "flat";                 // flat (uint32 file) | indexed (PREFIX.idx/.bin).
  bool packing = true;  // indexed: pack whole documents per sequence (false: one per sequence).
};

// Bounded evaluation, per job (spec.eval) and per stage (spec.stages[i].eval overrides).
struct EvalSpec {
  int64_t max_sequences = 0;  // Validation sequences evaluated (0 = all of the validation set).
  int64_t every_steps = 0;    // Also evaluate every N steps of a stage (0 = at stage ends only).
};

struct ParallelismSpec {
  int64_t sp_degree = 1;             // Ulysses sequence-parallel group size P (default for stages).
  int64_t dp_degree = 1;             // Data-parallel replicas (default for stages).
  int64_t zero_stage = 0;            // 0 (replicated optimizer) .. 3. Only 0 is implemented today.
  bool offload_optimizer = false;    // Keep optimizer state in host memory.
  bool offload_activations = false;  // Offload checkpointed activations to host memory.
  // Let the coordinator spread a CUDA group over workers whose GPUs reach other nodes only over
  // TCP sockets (no EFA / TCPXO / InfiniBand: docs/DEPLOY.md "Fabric between nodes"); without
  // it such a group waits, with the reason, for workers with a fabric or one worker that holds it.
  bool allow_tcp_fabric = false;
};

struct MemorySpec {
  bool activation_checkpointing = false;  // Recompute each decoder layer in backward.
  // With activation_checkpointing: keep each layer's attention output and log-sum-exp, so the
  // recompute skips the attention forward (selective checkpointing; one more layer input a layer).
  bool keep_attention_outputs = false;
  bool tiled_mlp = false;              // Run the MLP over sequence tiles.
  bool tiled_loss = false;             // Compute logits+loss in sequence tiles.
  int64_t loss_tile_tokens = 4096;     // Tokens per logits/loss tile when tiled_loss.
  int64_t attention_block_size = 512;  // Query/key block for blockwise attention on CPU.
};

struct OptimizerSpec {
  std::string type = "adamw";  // Only "adamw".
  double lr = 3.0e-4;          // Peak learning rate.
  double beta1 = 0.9;          // YAML: betas: [beta1, beta2].
  double beta2 = 0.95;
  double weight_decay = 0.1;        // Decoupled weight decay.
  double eps = 1e-8;                // Adam epsilon.
  double grad_clip = 1.0;           // Global-norm clip; 0 disables.
  int64_t warmup_steps = 0;         // Linear warmup steps (per stage unless the stage overrides).
  std::string schedule = "cosine";  // constant | linear | cosine (decay to min_lr_ratio * lr).
  double min_lr_ratio = 0.1;        // Floor of the decay, as a fraction of lr.
  int64_t grad_accum_steps = 1;     // Micro-batches per optimizer step.
  int64_t micro_batch_size = 1;     // Sequences per micro-batch (per DP replica).
};

// A stage's RoPE, as long-context recipes change it while the context grows (Llama 3's and
// Qwen2.5-1M's: a larger rope_theta, "ABF", or a larger scaling factor). Each set field
// overrides the model's for this stage and every later one (JobSpec::ApplyStageRope); the
// checkpoint records the RoPE a stage trained with, and export writes the last stage's into
// config.json.
struct StageRopeSpec {
  std::optional<double> rope_theta;         // > 0, finite.
  std::optional<RopeScaling> rope_scaling;  // Replaces the model's rope_scaling whole.
};

// One stage of staged context expansion. Unset optionals inherit from the job.
struct StageSpec {
  int64_t seq_len = 0;                  // Global sequence length N (tokens).
  int64_t steps = 0;                    // Optimizer steps in this stage.
  std::optional<double> lr;             // Overrides optimizer.lr.
  std::optional<int64_t> warmup_steps;  // Overrides optimizer.warmup_steps.
  std::optional<int64_t> sp_degree;     // Overrides parallelism.sp_degree.
  std::optional<int64_t> dp_degree;     // Overrides parallelism.dp_degree.
  std::optional<EvalSpec> eval;         // Overrides spec.eval for this stage.
  std::optional<StageRopeSpec> rope;    // From this stage on (StageRopeSpec).
};

struct CheckpointSpec {
  std::string dir;          // Directory all ranks can read ("" = <out>/checkpoints).
  int64_t every_steps = 0;  // Also commit every N steps (0 = stage ends only).
  // every_steps: auto. The coordinator picks the interval (Young/Daly, sqrt(2 C MTBF): C the
  // measured blocking cost of a checkpoint, MTBF the failure rate it observed for the job's group
  // size) and sends it with the assignment and when it changes (docs/JOBSPEC.md "Checkpoint
  // interval"). Only under a coordinator; not with every_seconds.
  bool every_steps_auto = false;
  int64_t every_seconds = 0;  // Also commit once N seconds passed since the last one (0 = off).
  int64_t keep_last = 2;      // Committed checkpoints to retain (>= 1).
  // Save in the background (worker/engine/checkpoint/async_checkpoint.h): training waits only for
  // a host-memory snapshot. Unset = yes when the snapshot fits the host memory
  // (DecideCheckpointAsync, memory_model.h); true / false force it.
  std::optional<bool> async;
  // Under a coordinator: resume from (and prune) the checkpoints another job of the same tenant
  // left in `dir` (a directory stays its tenant's after the job is deleted; without adopt a
  // directory another job used is refused). The engine checks each manifest's job identity.
  bool adopt = false;
};

// Coordinator-side policy; ignored by ulysses-train.
struct SchedulingSpec {
  int64_t priority = 0;  // Higher runs first; FIFO within a priority.
  // Failure budgets (docs/JOBSPEC.md "Failure budgets"): the job is FAILED at its
  // max_failures-th application failure (a rank exiting with an error) or its
  // max_infra_failures-th infrastructure failure (a lost worker, a killed rank, a lost peer)
  // counted since the last new committed checkpoint and within failure_window_s.
  int64_t max_failures = 3;          // 0..2^31-1.
  int64_t max_infra_failures = 20;   // 0..2^31-1.
  int64_t failure_window_s = 86400;  // Sliding window; 0 = no window. 0..2^31-1.
  int64_t max_preemptions = -1;      // -1 = unlimited. -1..2^31-1.
  std::string node_label;            // Only place on workers with this node label ("" = any).
  // May be preempted for a higher-priority job; false (admins only) opts out.
  bool preemptible = true;
};

struct JobSpec {
  std::string api_version = kApiVersion;
  std::string kind = kKind;
  Metadata metadata;
  ModelSpec model;
  DataSpec data;
  ParallelismSpec parallelism;
  MemorySpec memory;
  OptimizerSpec optimizer;
  std::vector<StageSpec> stages;
  CheckpointSpec checkpoint;
  SchedulingSpec scheduling;
  EvalSpec eval;
  uint64_t seed = 1234;

  // Effective per-stage values (stage override, else the job default).
  int64_t StageSp(size_t i) const { return stages[i].sp_degree.value_or(parallelism.sp_degree); }
  int64_t StageDp(size_t i) const { return stages[i].dp_degree.value_or(parallelism.dp_degree); }
  int64_t StageWorld(size_t i) const { return StageSp(i) * StageDp(i); }
  double StageLr(size_t i) const { return stages[i].lr.value_or(optimizer.lr); }
  int64_t StageWarmup(size_t i) const {
    return stages[i].warmup_steps.value_or(optimizer.warmup_steps);
  }
  const EvalSpec& StageEval(size_t i) const { return stages[i].eval ? *stages[i].eval : eval; }
  // The RoPE stage i trains with: `shape`'s (the model's, or a checkpoint's of an earlier stage)
  // with each stages[j].rope, j <= i, applied in order. Only rope_theta and rope_scaling change.
  void ApplyStageRope(size_t i, ModelShape* shape) const {
    for (size_t j = 0; j <= i && j < stages.size(); ++j) {
      if (!stages[j].rope) continue;
      if (stages[j].rope->rope_theta) shape->rope_theta = *stages[j].rope->rope_theta;
      if (stages[j].rope->rope_scaling) shape->rope_scaling = *stages[j].rope->rope_scaling;
    }
  }
  // Whether any stage sets its own RoPE.
  bool HasStageRope() const {
    for (const StageSpec& st : stages) {
      if (st.rope) return true;
    }
    return false;
  }
};

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_JOB_SPEC_H_
