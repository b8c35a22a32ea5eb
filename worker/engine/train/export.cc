// `ulysses-train export`: a committed checkpoint's model weights as a Hugging Face directory.
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/train/engine.h"
#include "worker/engine/train/guard.h"
#include "worker/engine/train/model_io.h"

namespace ulysses::engine::train {

absl::Status ExportCheckpoint(const std::string& checkpoint_dir, const std::string& hf_out) {
  namespace fs = std::filesystem;
  return Guard("ulysses-train export", [&]() -> absl::Status {
    std::error_code ec;
    if (fs::exists(hf_out, ec) && !fs::is_empty(hf_out, ec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("--hf-out: ", hf_out, " exists and is not empty (choose a new directory)"));
    }
    ASSIGN_OR_RETURN(CheckpointState st, LoadCheckpoint(checkpoint_dir, ""));
    if (!st.extra.contains("model_config")) {
      return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint_dir, ": no model_config"));
    }
    ASSIGN_OR_RETURN(model::LlamaConfig config, ModelConfigFromJson(st.extra["model_config"]));
    spec::ModelSpec m;
    m.vocab_size = config.vocab_size;
    m.hidden_size = config.hidden_size;
    m.intermediate_size = config.intermediate_size;
    m.num_hidden_layers = config.num_hidden_layers;
    m.num_attention_heads = config.num_attention_heads;
    m.num_key_value_heads = config.num_key_value_heads;
    m.rope_theta = config.rope_theta;
    m.rms_norm_eps = config.rms_norm_eps;
    m.tie_word_embeddings = config.tie_word_embeddings;
    std::vector<NamedTensor> weights;
    for (auto& [name, t] : ModelTensors(st)) weights.push_back({name, t});
    return WriteHfDirectory(hf_out, m, weights);
  });
}

}  // namespace ulysses::engine::train
