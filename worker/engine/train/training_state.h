// The training state a checkpoint carries beside its tensors (CheckpointState::extra), typed:
// the one place its keys are named, written and read. Saves write ToJson(); resume, eval and
// export read FromJson(), which checks every key it knows (kind and range) and names the
// checkpoint and the key. Keys it does not know are kept by no one and refused by no one (a
// newer build's additions). Keys (docs/CHECKPOINTS.md "extra"):
//   seed, sp_degree, dp_degree   the run that wrote it (informational)
//   model_config                 the model's shape (model_io.h ModelConfigToJson)
//   dtype                        spec.model.dtype (absent in older checkpoints)
//   init_from                    the HF model the job started from, absolute (export copies
//                                its tokenizer)
//   loss_scale, loss_scale_good_steps   the fp16 loss scaler (only when it is on)
//   data_cursor                  sequences of the stage consumed (data/batches.h)
//   adam_steps                   AdamW's step count (bias correction)
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_TRAINING_STATE_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_TRAINING_STATE_H_

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/train/train_step.h"

namespace ulysses::engine::train {

struct TrainingState {
  int64_t seed = 0;
  int64_t sp_degree = 0;
  int64_t dp_degree = 0;
  std::optional<model::LlamaConfig> model_config;
  std::string dtype;                 // "" = not recorded
  std::string init_from;             // "" = none
  std::optional<double> loss_scale;  // > 0 and finite when set
  int64_t loss_scale_good_steps = 0;
  std::optional<int64_t> data_cursor;  // >= 0
  std::optional<int64_t> adam_steps;   // >= 0

  nlohmann::json ToJson() const;
  // `where`: the checkpoint, for the messages ("checkpoint DIR").
  static absl::StatusOr<TrainingState> FromJson(const nlohmann::json& extra,
                                                const std::string& where);
  // model_config, or DataLoss naming `where` when the checkpoint has none.
  absl::StatusOr<model::LlamaConfig> ModelConfig(const std::string& where) const;
};

// A training checkpoint's state as of now: seed, layout (sp x dp), model config, dtype,
// init_from and the float16 loss scale (the data cursor and adam_steps are the caller's).
TrainingState TrainingStateOf(const spec::JobSpec& spec, const model::LlamaConfig& config,
                              int64_t sp, int64_t dp, const LossScaler& scaler);

// Restores the float16 loss scale from a checkpoint's state (absent: keep the initial scale).
void RestoreLossScale(const TrainingState& training, LossScaler& scaler);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_TRAINING_STATE_H_
