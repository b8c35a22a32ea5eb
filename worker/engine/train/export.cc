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
    std::vector<NamedTensor> weights;
    for (auto& [name, t] : ModelTensors(st)) weights.push_back({name, t});
    return WriteHfDirectory(hf_out, config, weights);
  });
}

}  // namespace ulysses::engine::train
