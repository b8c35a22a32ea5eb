#include "worker/engine/train/model_io.h"

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/train/guard.h"

namespace ulysses::engine::train {

using json = nlohmann::json;
using model::LlamaConfig;
using model::LlamaForCausalLM;

namespace {

// What the engine's model cannot compute yet is refused, never run as another model.
absl::Status CheckEngineSupports(const LlamaConfig& c) {
  if (c.attention_bias || c.qk_norm) {
    return absl::UnimplementedError(
        absl::StrCat(spec::fields::ShapePathOf("family"), ": '", c.family, "' needs ",
                     c.attention_bias ? "q/k/v biases" : "per-head q/k RMSNorm",
                     ", which this engine build does not implement (use family llama or mistral)"));
  }
  return absl::OkStatus();
}

// The sliding window against the stages, once the window is known (it may come from
// config.json).
absl::Status CheckWindow(const LlamaConfig& c, const spec::JobSpec& spec,
                         const std::string& source) {
  std::vector<int64_t> lengths;
  for (const spec::StageSpec& stage : spec.stages) lengths.push_back(stage.seq_len);
  return spec::CheckSlidingWindow(c.sliding_window, lengths, source);
}

}  // namespace

absl::StatusOr<LlamaConfig> ResolveModelConfig(const spec::JobSpec& spec,
                                               const std::string& init_from) {
  if (init_from.empty()) {
    RETURN_IF_ERROR(spec.model.Validate());
    LlamaConfig config(spec.model);
    RETURN_IF_ERROR(CheckEngineSupports(config));
    RETURN_IF_ERROR(CheckWindow(config, spec, ""));
    return config;
  }
  ASSIGN_OR_RETURN(LlamaConfig hf, ReadHfConfig(init_from));
  ASSIGN_OR_RETURN(LlamaConfig config,
                   spec::ResolveModelShape(spec.model, hf, HfConfigPath(init_from)));
  RETURN_IF_ERROR(CheckEngineSupports(config));
  RETURN_IF_ERROR(CheckWindow(config, spec, HfConfigPath(init_from)));
  return config;
}

json ModelConfigToJson(const LlamaConfig& c) { return spec::ModelShapeToJson(c); }

absl::StatusOr<LlamaConfig> ModelConfigFromJson(const json& j) {
  absl::StatusOr<LlamaConfig> c =
      spec::ModelShapeFromJson(j, "checkpoint extra.model_config", spec::JsonDefaults::kRequireAll);
  if (!c.ok()) return absl::DataLossError(c.status().message());  // our own file: corrupt
  return c;
}

model::MemoryOptions MemoryOptionsFromSpec(const spec::JobSpec& spec) {
  model::MemoryOptions mem;
  mem.activation_checkpointing = spec.memory.activation_checkpointing;
  mem.keep_attention_outputs = spec.memory.keep_attention_outputs;
  mem.offload_activations = spec.parallelism.offload_activations;
  mem.tiled_mlp = spec.memory.tiled_mlp;
  mem.tiled_loss = spec.memory.tiled_loss;
  mem.loss_tile_tokens = spec.memory.loss_tile_tokens;
  return mem;
}

absl::StatusOr<LlamaForCausalLM> BuildModel(const LlamaConfig& config,
                                            const model::MemoryOptions& memory, uint64_t seed,
                                            torch::Device device, torch::Dtype dtype) {
  LlamaForCausalLM model{nullptr};
  RETURN_IF_ERROR(Guard("building the model", [&] {
    model = LlamaForCausalLM(config, memory);  // parameters allocated, not written
    model->to(device, dtype);
    model->InitWeights(seed);  // one parameter at a time, in its dtype and device
    return absl::OkStatus();
  }));
  return model;
}

absl::StatusOr<LlamaForCausalLM> BuildModelStructure(const LlamaConfig& config,
                                                     const model::MemoryOptions& memory) {
  LlamaForCausalLM model{nullptr};
  RETURN_IF_ERROR(Guard("building the model", [&] {
    model = LlamaForCausalLM(config, memory);
    return absl::OkStatus();
  }));
  return model;
}

NamedParams Params(LlamaForCausalLM& model) {
  NamedParams out;
  for (auto& item : model->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

namespace {

absl::Status CheckShape(const std::string& name, const std::string& source,
                        const torch::Tensor& have, const torch::Tensor& want) {
  if (have.sizes() == want.sizes()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": tensor ", name, " has shape ", c10::str(have.sizes()), " but the model needs ",
      c10::str(want.sizes()), " (model shape in the spec does not match)"));
}

}  // namespace

absl::Status LoadParams(LlamaForCausalLM& model, const std::map<std::string, torch::Tensor>& named,
                        const std::string& source) {
  return Guard(source, [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      auto it = named.find(item.key());
      if (it == named.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": tensor ", item.key(), " is missing"));
      }
      RETURN_IF_ERROR(CheckShape(item.key(), source, it->second, item.value()));
      item.value().copy_(it->second);
    }
    return absl::OkStatus();
  });
}

std::map<std::string, torch::Tensor> ModelTensors(const CheckpointState& state) {
  std::map<std::string, torch::Tensor> out;
  const std::string prefix = kModelPrefix;
  for (const auto& t : state.tensors) {
    if (t.name.rfind(prefix, 0) == 0) out[t.name.substr(prefix.size())] = t.tensor;
  }
  return out;
}

absl::Status LoadInitFrom(LlamaForCausalLM& model, const std::string& init_from, LoadStats* stats) {
  ShareRequest request;
  std::map<std::string, torch::Tensor> params;
  for (auto& [name, p] : Params(model)) {
    request[name].shape = p.sizes().vec();
    params[name] = p;
  }
  std::vector<std::string> names;
  for (const auto& [name, p] : params) names.push_back(name);
  RETURN_IF_ERROR(CheckHfTensorsConsumed(init_from, names));  // Nothing dropped silently.
  return Guard(absl::StrCat("init_from ", init_from), [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    // One tensor at a time, straight into its parameter (converted to its dtype and device).
    return ForEachHfWeightShare(
        init_from, request,
        [&](NamedTensor nt) {
          params.at(nt.name).copy_(nt.tensor);
          return absl::OkStatus();
        },
        stats);
  });
}

}  // namespace ulysses::engine::train
