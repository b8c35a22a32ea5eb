// Where a rank starts and how training state comes back from a checkpoint.
//
// PlanResume() decides, before any network traffic, what a rank of stage `stage` does with the
// checkpoints under root: run the stage fresh (stage 0 with none), resume mid-stage or from the
// previous stage's final checkpoint, or nothing (the stage is already complete). A checkpoint of a
// different spec hash, or a gap (stage k+2 after an incomplete stage k), is FAILED_PRECONDITION.
//
// The commit, the other direction, is commit.h. RestoreTraining() loads model weights
// and AdamW state from any committed checkpoint, whatever layout and ZeRO stage wrote it; a rank
// reads only the pieces overlapping what it keeps (ResumeShare).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_RESUME_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_RESUME_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/train/optimizer.h"
#include "worker/engine/train/training_state.h"
#include "worker/engine/train/zero.h"

namespace ulysses::engine::train {

// The committed checkpoint with the highest step under root, or nullopt when there is none.
absl::StatusOr<std::optional<std::string>> FindLatestCheckpoint(const std::string& root);

struct ResumePlan {
  bool stage_done = false;  // the stage already completed: nothing to run
  // Set when resuming (mid-stage or from stage - 1): the manifest's metadata, WITHOUT tensors
  // (ReadCheckpointInfo); each rank then reads only its share (ResumeShare). With stage_done,
  // set when the latest checkpoint is this stage's final one (the run reports it: a supervisor
  // that missed its commit, e.g. a coordinator restored from a backup, learns of it).
  std::optional<CheckpointState> state;
  std::string path;  // the checkpoint `state` came from
  // state->extra read and checked (training_state.h) when resuming (not with stage_done).
  TrainingState training;
};

// `me` and `adopt`: the job's identity and spec.checkpoint.adopt; the latest checkpoint must pass
// CheckCheckpointOwner (another job's is FAILED_PRECONDITION naming both).
absl::StatusOr<ResumePlan> PlanResume(const std::string& root, const std::string& spec_hash,
                                      int stage, const CheckpointOwner& me = {},
                                      bool adopt = false);

// The slowest checkpoint storage the collective timeout plans for (a busy network file system
// read by every rank at once): 100 MiB/s per rank.
inline constexpr int64_t kCheckpointFloorBytesPerSecond = int64_t{100} << 20;

// An upper bound of a checkpoint of `shape` in `dtype` (spec.model.dtype), the state a save
// writes and a resume reads: spec::CheckpointStateBytes (memory_model.h: the weights in their
// dtype, fp32 masters of 16-bit weights, AdamW's two moments; 12 bytes a parameter in fp32, 14 in
// bf16, 24 in fp64) plus 1 % and kCheckpointMetadataBytes for the manifest, the shard tables
// and extra (a tiny model's commit writes ~3 % over its state).
inline constexpr int64_t kCheckpointMetadataBytes = int64_t{64} << 10;
int64_t EstimatedCheckpointBytes(const spec::ModelShape& shape, const std::string& dtype);

// The rendezvous and collective timeout of a rank: `base_s` (--collective-timeout-s) plus the
// time to move `checkpoint_bytes` at kCheckpointFloorBytesPerSecond, rounded up. Every rank
// reads the whole checkpoint before the rendezvous and writes its share between a save's
// barriers, so its peers wait for the slowest reader or writer that long; a fixed timeout would
// turn a slow load of a large model into a lost peer (exit 69). Capped at 7 days.
int64_t ScaledCollectiveTimeoutSeconds(int64_t base_s, int64_t checkpoint_bytes);

// What rank `rank` of `world` keeps of a checkpoint for `model` (its full parameters, as built)
// at ZeRO `zero_stage`: the model weights whole (stages 0-2) or its chunk (stage 3, zero.h
// ZeroOwnedRange), the AdamW state whole (stage 0) or its chunks (stages 1-3). For
// LoadCheckpointShare: a rank reads about its share of the checkpoint, whatever layout wrote it.
ShareRequest ResumeShare(model::LlamaForCausalLM& model, int zero_stage, int rank, int world);

// What rank `rank` of `world` reads of a Hugging Face directory at ZeRO-3 (spec.model.init_from):
// the byte ranges of its weight chunks, by HF name (ResumeShare's "model/" entries).
ShareRequest ImportShare(model::LlamaForCausalLM& model, int rank, int world);

// Restores model weights and optimizer state from a loaded checkpoint.
absl::Status RestoreTraining(const CheckpointState& state, const std::string& path,
                             model::LlamaForCausalLM& model, AdamW& optimizer);
// The two halves, for ZeRO: the whole weights into the (full) model before the ZeroSharding is
// created (not at stage 3, whose share holds weight chunks), then the optimizer state, and at
// stage 3 the weight chunks (into `zero`'s chunks when set: ZeroSharding::LoadOwnedState).
absl::Status RestoreModel(const CheckpointState& state, const std::string& path,
                          model::LlamaForCausalLM& model);
// `training`: the checkpoint's extra (TrainingState::FromJson), for AdamW's step count.
absl::Status RestoreOptimizer(const CheckpointState& state, const TrainingState& training,
                              model::LlamaForCausalLM& model, AdamW& optimizer, ZeroSharding* zero);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_RESUME_H_
