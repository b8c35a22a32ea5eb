// How training state goes to a checkpoint. CommitTraining() is collective over the world: without
// ZeRO every rank passes its full (replicated) model and optimizer state and checkpoint.h splits
// the writing; with ZeRO each rank writes only the chunks it owns (SaveMode::kOwned pieces). The
// way back is resume.h.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_COMMIT_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_COMMIT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/train/optimizer.h"
#include "worker/engine/train/training_state.h"
#include "worker/engine/train/zero.h"

namespace ulysses::engine::train {

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
// ZeRO: the chunks this rank owns, as pieces) and `training` (its adam_steps set from the
// optimizer) as its extra. The tensors are views of
// the live training tensors (on the training device): copy them before the next step changes them.
CheckpointState TrainingCheckpointState(const spec::JobSpec& spec, const CommitPoint& point,
                                        model::LlamaForCausalLM& model, const AdamW& optimizer,
                                        TrainingState training, const ZeroSharding* zero);

// Collective over `world`: saves model weights ("model/<name>"), AdamW state and `training` (plus
// adam_steps), keeping spec.checkpoint.keep_last committed checkpoints.
absl::StatusOr<CommitResult> CommitTraining(const spec::JobSpec& spec, const std::string& root,
                                            const CommitPoint& point,
                                            model::LlamaForCausalLM& model, const AdamW& optimizer,
                                            TrainingState training, Communicator& world,
                                            const ZeroSharding* zero = nullptr);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_COMMIT_H_
