#include "worker/engine/train/model_io.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/train/guard.h"

namespace ulysses::engine::train {

using json = nlohmann::json;
using model::LlamaConfig;
using model::LlamaForCausalLM;

absl::StatusOr<LlamaConfig> ResolveModelConfig(const spec::JobSpec& spec,
                                               const std::string& init_from) {
  spec::ModelSpec m = spec.model;
  if (!init_from.empty() && m.hidden_size == 0) {
    ASSIGN_OR_RETURN(spec::ModelSpec hf, ReadHfConfig(init_from));
    hf.dtype = m.dtype;
    hf.init_from = init_from;
    m = hf;
  }
  return LlamaConfig::FromSpec(m);
}

json ModelConfigToJson(const LlamaConfig& c) {
  return json{{"vocab_size", c.vocab_size},
              {"hidden_size", c.hidden_size},
              {"intermediate_size", c.intermediate_size},
              {"num_hidden_layers", c.num_hidden_layers},
              {"num_attention_heads", c.num_attention_heads},
              {"num_key_value_heads", c.num_key_value_heads},
              {"rope_theta", c.rope_theta},
              {"rms_norm_eps", c.rms_norm_eps},
              {"tie_word_embeddings", c.tie_word_embeddings}};
}

absl::StatusOr<LlamaConfig> ModelConfigFromJson(const json& j) {
  try {
    LlamaConfig c;
    c.vocab_size = j.at("vocab_size");
    c.hidden_size = j.at("hidden_size");
    c.intermediate_size = j.at("intermediate_size");
    c.num_hidden_layers = j.at("num_hidden_layers");
    c.num_attention_heads = j.at("num_attention_heads");
    c.num_key_value_heads = j.at("num_key_value_heads");
    c.rope_theta = j.at("rope_theta");
    c.rms_norm_eps = j.at("rms_norm_eps");
    c.tie_word_embeddings = j.at("tie_word_embeddings");
    RETURN_IF_ERROR(c.Validate());
    return c;
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint extra.model_config: ", e.what()));
  }
}

model::MemoryOptions MemoryOptionsFromSpec(const spec::JobSpec& spec) {
  model::MemoryOptions mem;
  mem.activation_checkpointing = spec.memory.activation_checkpointing;
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
    model = LlamaForCausalLM(config, memory);
    model->InitWeights(seed);
    model->to(device, dtype);
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

absl::Status LoadInitFrom(LlamaForCausalLM& model, const std::string& init_from) {
  ASSIGN_OR_RETURN(std::vector<NamedTensor> weights, LoadHfWeights(init_from));
  std::map<std::string, torch::Tensor> named;
  for (auto& t : weights) named[t.name] = t.tensor;
  return LoadParams(model, named, absl::StrCat("init_from ", init_from));
}

}  // namespace ulysses::engine::train
