// The model's state in and out of the engine: shape resolution, construction, and weights by HF
// name to and from checkpoints and Hugging Face directories. No parallelism, no training.
//
// Checkpoint naming: model weights are "model/<hf name>" tensors; the shape is stored as
// extra.model_config (ModelConfigToJson). Errors name the source (checkpoint path, init_from dir),
// the tensor and what is wrong.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_MODEL_IO_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_MODEL_IO_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/train/optimizer.h"  // NamedParams

namespace ulysses::engine::train {

inline constexpr char kModelPrefix[] = "model/";

// Model shape from the spec. With init_from, its config.json is read and compared field by
// field (spec::ResolveModelShape): fields the spec left out are taken from it, a field that
// disagrees (from a preset or explicit) is InvalidArgument naming both values.
absl::StatusOr<model::LlamaConfig> ResolveModelConfig(const spec::JobSpec& spec,
                                                      const std::string& init_from);

// Shape <-> checkpoint extra.model_config (spec::ModelShapeToJson / ModelShapeFromJson: HF
// names, rope_scaling included; an older model_config without rope_scaling reads as none).
nlohmann::json ModelConfigToJson(const model::LlamaConfig& config);
absl::StatusOr<model::LlamaConfig> ModelConfigFromJson(const nlohmann::json& j);

// The memory options of the spec (activation checkpointing, tiled MLP/loss).
model::MemoryOptions MemoryOptionsFromSpec(const spec::JobSpec& spec);

// Builds the model on `device` in `dtype`, initialised from `seed` one parameter at a time
// (model::InitialParameter: identical weights for every device, dtype and layout); no whole-model
// copy is written besides the model itself. Catches libtorch exceptions.
absl::StatusOr<model::LlamaForCausalLM> BuildModel(const model::LlamaConfig& config,
                                                   const model::MemoryOptions& memory,
                                                   uint64_t seed, torch::Device device,
                                                   torch::Dtype dtype);

// The model's modules with their parameters allocated (CPU, fp32) but never written: host pages
// nobody touches cost no memory. For ZeRO-3's sharded init (zero.h ZeroOptions::sharded_init),
// which makes each rank's chunks and frees the parameters.
absl::StatusOr<model::LlamaForCausalLM> BuildModelStructure(const model::LlamaConfig& config,
                                                            const model::MemoryOptions& memory);

// named_parameters() as (HF name, tensor) pairs, in registration order.
NamedParams Params(model::LlamaForCausalLM& model);

// Copies named tensors into the model's parameters; every parameter must be present with its
// shape. `source` names where they came from, for errors.
absl::Status LoadParams(model::LlamaForCausalLM& model,
                        const std::map<std::string, torch::Tensor>& named,
                        const std::string& source);

// Model weights of a checkpoint by HF name (its "model/<hf name>" entries).
std::map<std::string, torch::Tensor> ModelTensors(const CheckpointState& state);

// Loads spec.model.init_from (an HF directory) into the model's full parameters, one tensor at a
// time through byte-range reads (hf.h ForEachHfWeightShare); bytes read go to *stats.
absl::Status LoadInitFrom(model::LlamaForCausalLM& model, const std::string& init_from,
                          LoadStats* stats = nullptr);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_MODEL_IO_H_
