// `ulysses-train export`: a committed checkpoint's model weights as a Hugging Face directory, in
// the dtype asked for (default: the job's), from the fp32 masters where they are more precise.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/train/engine.h"
#include "worker/engine/train/guard.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/optimizer.h"

namespace ulysses::engine::train {
namespace {

struct ExportDtype {
  torch::ScalarType type = torch::kFloat32;
  const char* name = "float32";  // the spec.model.dtype spelling
};

constexpr ExportDtype kBfloat16{torch::kBFloat16, "bfloat16"};
constexpr ExportDtype kFloat16{torch::kFloat16, "float16"};
constexpr ExportDtype kFloat32{torch::kFloat32, "float32"};
constexpr ExportDtype kFloat64{torch::kFloat64, "float64"};

// --dtype: the short names and the spec.model.dtype spellings.
absl::StatusOr<ExportDtype> ParseExportDtype(const std::string& flag) {
  static const auto* kDtypes = new std::map<std::string, ExportDtype>{
      {"bf16", kBfloat16}, {"bfloat16", kBfloat16}, {"fp16", kFloat16}, {"float16", kFloat16},
      {"fp32", kFloat32},  {"float32", kFloat32},   {"fp64", kFloat64}, {"float64", kFloat64}};
  auto it = kDtypes->find(flag);
  if (it == kDtypes->end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype: '", flag,
        "' is not an export dtype (use bf16, fp16, fp32 or fp64, or bfloat16, float16, float32, "
        "float64; leave it out to export in the job's spec.model.dtype)"));
  }
  return it->second;
}

// The job's dtype: the checkpoint's extra.dtype (spec.model.dtype), or for a checkpoint written
// before it was recorded, the dtype its model weights are stored in.
absl::StatusOr<ExportDtype> JobDtype(const CheckpointState& st,
                                     const std::map<std::string, torch::Tensor>& weights,
                                     const std::string& checkpoint) {
  if (st.extra.contains("dtype")) {
    const nlohmann::json& d = st.extra["dtype"];
    if (d.is_string()) {
      absl::StatusOr<ExportDtype> parsed = ParseExportDtype(d.get<std::string>());
      if (parsed.ok()) return parsed;
    }
    return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint, ": extra.dtype ", d.dump(),
                                            " is not a model dtype"));
  }
  if (weights.empty()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint, ": no model weights"));
  }
  const torch::ScalarType stored = weights.begin()->second.scalar_type();
  for (const ExportDtype& d : {kBfloat16, kFloat16, kFloat32, kFloat64}) {
    if (d.type == stored) return d;
  }
  return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint,
                                          ": model weights are stored as ", c10::toString(stored)));
}

}  // namespace

absl::StatusOr<ExportResult> ExportCheckpoint(const ExportOptions& o) {
  namespace fs = std::filesystem;
  // Flags first: a bad --dtype reads and writes nothing.
  std::optional<ExportDtype> asked;
  if (!o.dtype.empty()) {
    ASSIGN_OR_RETURN(asked, ParseExportDtype(o.dtype));
  }
  if (o.checkpoint.empty()) return absl::InvalidArgumentError("--checkpoint: required");
  if (o.hf_out.empty()) return absl::InvalidArgumentError("--hf-out: required");
  std::error_code ec;
  if (fs::exists(o.hf_out, ec) && !fs::is_empty(o.hf_out, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("--hf-out: ", o.hf_out, " exists and is not empty (choose a new directory)"));
  }
  ExportResult result;
  RETURN_IF_ERROR(Guard("ulysses-train export", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(CheckpointState st, LoadCheckpoint(o.checkpoint, ""));
    if (!st.extra.contains("model_config")) {
      return absl::DataLossError(absl::StrCat("checkpoint ", o.checkpoint, ": no model_config"));
    }
    ASSIGN_OR_RETURN(model::LlamaConfig config, ModelConfigFromJson(st.extra["model_config"]));
    const std::map<std::string, torch::Tensor> weights = ModelTensors(st);
    ExportDtype dtype = kFloat32;
    if (asked.has_value()) {
      dtype = *asked;
    } else {
      ASSIGN_OR_RETURN(dtype, JobDtype(st, weights, o.checkpoint));
    }
    std::map<std::string, torch::Tensor> masters;
    for (const NamedTensor& t : st.tensors) {
      if (t.name.rfind(kMasterPrefix, 0) == 0) {
        masters[t.name.substr(std::char_traits<char>::length(kMasterPrefix))] = t.tensor;
      }
    }
    std::vector<NamedTensor> out;
    for (const auto& [name, weight] : weights) {
      auto master = masters.find(name);
      // The master is the weight before rounding: the better source for any other dtype.
      if (master != masters.end() && weight.scalar_type() != dtype.type) {
        if (master->second.sizes() != weight.sizes()) {
          return absl::DataLossError(absl::StrCat(
              "checkpoint ", o.checkpoint, ": ", kMasterPrefix, name, " has shape ",
              c10::str(master->second.sizes()), ", the weight has ", c10::str(weight.sizes())));
        }
        out.push_back({name, master->second});
        ++result.from_masters;
      } else {
        out.push_back({name, weight});
      }
    }
    result.dtype = dtype.name;
    result.tensors = static_cast<int64_t>(out.size());
    return WriteHfDirectory(o.hf_out, config, out, dtype.type);
  }));
  return result;
}

}  // namespace ulysses::engine::train
