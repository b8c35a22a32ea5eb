// Where a rank starts and how training state goes to and from checkpoints.
//
// PlanResume() decides, before any network traffic, what a rank of stage `stage` does with the
// checkpoints under root: run the stage fresh (stage 0 with none), resume mid-stage or from the
// previous stage's final checkpoint, or nothing (the stage is already complete). A checkpoint of a
// different spec hash, or a gap (stage k+2 after an incomplete stage k), is FAILED_PRECONDITION.
//
// CommitTraining() is collective over the world: without ZeRO every rank passes its full
// (replicated) model and optimizer state and checkpoint.h splits the writing; with ZeRO each rank
// writes only the chunks it owns (SaveMode::kOwned pieces). RestoreTraining() loads model weights
// and AdamW state from any committed checkpoint, whatever layout and ZeRO stage wrote it (pieces
// come back as whole tensors; a ZeroSharding then keeps its chunks).
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
#include "worker/engine/train/zero.h"

namespace ulysses::engine::train {

// The committed checkpoint with the highest step under root, or nullopt when there is none.
absl::StatusOr<std::optional<std::string>> FindLatestCheckpoint(const std::string& root);

struct ResumePlan {
  bool stage_done = false;               // the stage already completed: nothing to run
  std::optional<CheckpointState> state;  // set when resuming (mid-stage or from stage - 1)
  std::string path;                      // the checkpoint `state` came from
};

absl::StatusOr<ResumePlan> PlanResume(const std::string& root, const std::string& spec_hash,
                                      int stage);

// The slowest checkpoint storage the collective timeout plans for (a busy network file system
// read by every rank at once): 100 MiB/s per rank.
inline constexpr int64_t kCheckpointFloorBytesPerSecond = int64_t{100} << 20;

// An upper bound of a checkpoint of `shape`: 16 bytes a parameter (weights in their dtype, fp32
// masters when that dtype is 16-bit, AdamW's two fp32 moments: 12 bytes in fp32, 14 in bf16),
// the state a save writes and a resume reads.
int64_t EstimatedCheckpointBytes(const spec::ModelShape& shape);

// The rendezvous and collective timeout of a rank: `base_s` (--collective-timeout-s) plus the
// time to move `checkpoint_bytes` at kCheckpointFloorBytesPerSecond, rounded up. Every rank
// reads the whole checkpoint before the rendezvous and writes its share between a save's
// barriers, so its peers wait for the slowest reader or writer that long; a fixed timeout would
// turn a slow load of a large model into a lost peer (exit 69). Capped at 7 days.
int64_t ScaledCollectiveTimeoutSeconds(int64_t base_s, int64_t checkpoint_bytes);

// What identifies a checkpoint besides the tensors.
struct CommitPoint {
  int stage = 0;
  int64_t step_in_stage = 0;
  int64_t global_step = 0;
  bool stage_complete = false;
};

struct CommitResult {
  std::string path;
  double seconds = 0;
};

// The state a checkpoint of this rank holds: model weights ("model/<name>"), AdamW state (with
// ZeRO: the chunks this rank owns, as pieces) and `extra` plus adam_steps. The tensors are views of
// the live training tensors (on the training device): copy them before the next step changes them.
CheckpointState TrainingCheckpointState(const spec::JobSpec& spec, const CommitPoint& point,
                                        model::LlamaForCausalLM& model, const AdamW& optimizer,
                                        nlohmann::json extra, const ZeroSharding* zero);

// Collective over `world`: saves model weights ("model/<name>"), AdamW state and `extra` (plus
// adam_steps), keeping spec.checkpoint.keep_last committed checkpoints.
absl::StatusOr<CommitResult> CommitTraining(const spec::JobSpec& spec, const std::string& root,
                                            const CommitPoint& point,
                                            model::LlamaForCausalLM& model, const AdamW& optimizer,
                                            nlohmann::json extra, Communicator& world,
                                            const ZeroSharding* zero = nullptr);

// Restores model weights and optimizer state from a loaded checkpoint.
absl::Status RestoreTraining(const CheckpointState& state, const std::string& path,
                             model::LlamaForCausalLM& model, AdamW& optimizer);
// The two halves, for ZeRO: the whole weights into the (full) model before the ZeroSharding is
// created, then the optimizer state (into `zero`'s chunks when set).
absl::Status RestoreModel(const CheckpointState& state, const std::string& path,
                          model::LlamaForCausalLM& model);
absl::Status RestoreOptimizer(const CheckpointState& state, model::LlamaForCausalLM& model,
                              AdamW& optimizer, ZeroSharding* zero);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_RESUME_H_
