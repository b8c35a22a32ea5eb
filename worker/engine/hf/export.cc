#include "worker/engine/hf/export.h"

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/model/torch_dtype.h"
#include "worker/engine/train/guard.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/optimizer.h"

namespace ulysses::engine {
namespace {

using train::Guard;
using train::kMasterPrefix;
using train::kModelPrefix;
using train::ModelConfigFromJson;

struct ExportDtype {
  torch::ScalarType type = torch::kFloat32;
  std::string name = "float32";  // the spec.model.dtype spelling (common/dtype.h)
};

ExportDtype ExportDtypeOf(const DtypeInfo& d) { return {TorchType(d), std::string(d.name)}; }

// --dtype: the weight dtypes of common/dtype.h by name, or their short names.
absl::StatusOr<ExportDtype> ParseExportDtype(const std::string& flag) {
  static const auto* kShort = new std::map<std::string, std::string>{
      {"bf16", "bfloat16"}, {"fp16", "float16"}, {"fp32", "float32"}, {"fp64", "float64"}};
  auto alias = kShort->find(flag);
  const DtypeInfo* d = FindDtype(alias == kShort->end() ? flag : alias->second);
  if (d == nullptr || !d->weight) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype: '", flag, "' is not an export dtype (use bf16, fp16, fp32 or fp64, or ",
        WeightDtypeList(), "; leave it out to export in the job's ",
        spec::fields::PathOf(&spec::ModelSpec::dtype), ")"));
  }
  return ExportDtypeOf(*d);
}

// The job's dtype: the checkpoint's extra.dtype (spec.model.dtype), or for a checkpoint written
// before it was recorded, the dtype its model weights are stored in.
absl::StatusOr<ExportDtype> JobDtype(const CheckpointState& st,
                                     std::optional<torch::ScalarType> stored,
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
  if (!stored.has_value()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint, ": no model weights"));
  }
  if (const DtypeInfo* d = DtypeOf(*stored); d != nullptr && d->weight) return ExportDtypeOf(*d);
  return absl::DataLossError(absl::StrCat(
      "checkpoint ", checkpoint, ": model weights are stored as ", c10::toString(*stored)));
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
    // The manifest only; then one tensor at a time (checkpoint.h CheckpointReader).
    ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                     CheckpointReader::Open(o.checkpoint, ""));
    const CheckpointState& st = reader->info();
    if (!st.extra.contains("model_config")) {
      return absl::DataLossError(absl::StrCat("checkpoint ", o.checkpoint, ": no model_config"));
    }
    ASSIGN_OR_RETURN(model::LlamaConfig config, ModelConfigFromJson(st.extra["model_config"]));
    std::map<std::string, CheckpointReader::TensorInfo> stored;
    for (const auto& [name, info] : reader->tensors()) stored[name] = info;
    const std::string master_prefix = kMasterPrefix;
    std::optional<torch::ScalarType> weight_dtype;
    for (const auto& [name, info] : stored) {
      if (name.rfind(kModelPrefix, 0) == 0) {
        weight_dtype = info.dtype;
        break;
      }
    }
    ExportDtype dtype;
    if (asked.has_value()) {
      dtype = *asked;
    } else {
      ASSIGN_OR_RETURN(dtype, JobDtype(st, weight_dtype, o.checkpoint));
    }
    // Where each weight comes from, checked before anything is written: the master is the weight
    // before rounding, the better source for any other dtype.
    std::map<std::string, std::string> source;
    for (const auto& [name, shape] : HfLlamaShapes(config)) {
      auto weight = stored.find(kModelPrefix + name);
      if (weight == stored.end()) {
        return absl::DataLossError(absl::StrCat("checkpoint ", o.checkpoint, ": tensor ",
                                                kModelPrefix, name, " is missing"));
      }
      if (weight->second.shape != shape) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", o.checkpoint, ": ", weight->first, " has shape ",
                         c10::str(c10::IntArrayRef(weight->second.shape)),
                         ", its model_config needs ", c10::str(c10::IntArrayRef(shape))));
      }
      auto master = stored.find(master_prefix + name);
      if (master != stored.end() && weight->second.dtype != dtype.type) {
        if (master->second.shape != shape) {
          return absl::DataLossError(
              absl::StrCat("checkpoint ", o.checkpoint, ": ", kMasterPrefix, name, " has shape ",
                           c10::str(c10::IntArrayRef(master->second.shape)), ", the weight has ",
                           c10::str(c10::IntArrayRef(shape))));
        }
        source[name] = master->first;
        ++result.from_masters;
      } else {
        source[name] = weight->first;
      }
    }
    HfTensorSource fetch = [&](const std::string& name) -> absl::StatusOr<torch::Tensor> {
      ASSIGN_OR_RETURN(NamedTensor nt, reader->Read(source.at(name), TensorShare{}));
      return nt.tensor;
    };
    ASSIGN_OR_RETURN(
        HfWriteResult written,
        WriteHfDirectoryStreaming(o.hf_out, config, fetch, dtype.type, o.max_file_bytes));
    result.dtype = dtype.name;
    result.tensors = written.tensors;
    result.files = written.files;
    result.largest_tensor_bytes = written.largest_tensor_bytes;
    result.bytes_read = reader->stats().data_bytes;
    return absl::OkStatus();
  }));
  return result;
}

}  // namespace ulysses::engine
