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
#include "worker/engine/train/training_state.h"

namespace ulysses::engine {
namespace {

using train::Guard;
using train::kMasterPrefix;
using train::kModelPrefix;

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
absl::StatusOr<ExportDtype> JobDtype(const train::TrainingState& training,
                                     std::optional<torch::ScalarType> stored,
                                     const std::string& checkpoint) {
  if (!training.dtype.empty()) {
    absl::StatusOr<ExportDtype> parsed = ParseExportDtype(training.dtype);
    if (parsed.ok()) return parsed;
    return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint, ": extra.dtype \"",
                                            training.dtype, "\" is not a model dtype"));
  }
  if (!stored.has_value()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint, ": no model weights"));
  }
  if (const DtypeInfo* d = DtypeOf(*stored); d != nullptr && d->weight) return ExportDtypeOf(*d);
  return absl::DataLossError(absl::StrCat(
      "checkpoint ", checkpoint, ": model weights are stored as ", c10::toString(*stored)));
}

// --checkpoint: a step directory (it has a manifest.json), a checkpoint root, or a job's output
// directory (its checkpoints/ root): the newest committed step of the root.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("--checkpoint: ", dir, " is not a directory"));
  }
  if (fs::exists(fs::path(dir) / kManifestName, ec)) return dir;
  for (const fs::path& root : {fs::path(dir), fs::path(dir) / "checkpoints"}) {
    absl::StatusOr<std::string> latest = LatestCommittedCheckpoint(root.string());
    if (latest.ok()) return latest;
  }
  return absl::NotFoundError(absl::StrCat(
      "--checkpoint: ", dir, " is no committed checkpoint (no ", kManifestName,
      ") and holds no committed step-* directory, neither itself nor in ", dir,
      "/checkpoints (give a step directory, a checkpoint root or a job's --out directory)"));
}

// The kTokenizerFiles present in `dir`, each checked (a regular file or a link to one, at most
// kTokenizerMaxFileBytes).
absl::StatusOr<std::vector<std::string>> TokenizerFilesIn(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> found;
  for (const char* name : kTokenizerFiles) {
    const fs::path p = fs::path(dir) / name;
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    if (!fs::is_regular_file(p, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer file ", p.string(), " is not a regular file"));
    }
    const auto size = fs::file_size(p, ec);
    if (ec || size > static_cast<uintmax_t>(kTokenizerMaxFileBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer file ", p.string(), " is ", ec ? ec.message() : absl::StrCat(size, " B"),
          ", above the ", kTokenizerMaxFileBytes, " B a tokenizer file may be"));
    }
    found.push_back(name);
  }
  return found;
}

std::string FileList() {
  std::string out;
  for (const char* name : kTokenizerFiles) absl::StrAppend(&out, out.empty() ? "" : ", ", name);
  return out;
}

// An explicit --tokenizer-from: a directory holding at least one of kTokenizerFiles.
absl::Status CheckTokenizerFrom(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("--tokenizer-from: ", dir, " is not a directory"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> files, TokenizerFilesIn(dir));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("--tokenizer-from: ", dir, " holds none of ",
                                            FileList(),
                                            " (give the HF model directory the job started from)"));
  }
  return absl::OkStatus();
}

// Copies the tokenizer files into hf_out: from --tokenizer-from, else from the checkpoint's
// extra.init_from when that directory is still there (else a note says why none were copied).
absl::Status CopyTokenizer(const ExportOptions& o, const train::TrainingState& training,
                           ExportResult& r) {
  namespace fs = std::filesystem;
  std::string from = o.tokenizer_from;
  if (from.empty()) {
    if (training.init_from.empty()) return absl::OkStatus();
    from = training.init_from;
    std::error_code ec;
    if (!fs::is_directory(from, ec)) {
      r.tokenizer_note = absl::StrCat("the job's init_from ", from,
                                      " is not here: no tokenizer files copied (pass "
                                      "--tokenizer-from DIR)");
      return absl::OkStatus();
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::string> files, TokenizerFilesIn(from));
  if (files.empty()) {
    r.tokenizer_note = absl::StrCat("init_from ", from, " holds none of ", FileList());
    return absl::OkStatus();
  }
  for (const std::string& name : files) {
    std::error_code ec;
    fs::copy_file(fs::path(from) / name, fs::path(o.hf_out) / name,
                  fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("copying ", (fs::path(from) / name).string(), " to ",
                                              o.hf_out, ": ", ec.message()));
    }
  }
  r.tokenizer_from = from;
  r.tokenizer_files = files;
  return absl::OkStatus();
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
  ASSIGN_OR_RETURN(const std::string step_dir, ResolveCheckpoint(o.checkpoint));
  if (!o.tokenizer_from.empty()) RETURN_IF_ERROR(CheckTokenizerFrom(o.tokenizer_from));
  std::error_code ec;
  if (fs::exists(o.hf_out, ec) && !fs::is_empty(o.hf_out, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("--hf-out: ", o.hf_out, " exists and is not empty (choose a new directory)"));
  }
  ExportResult result;
  result.checkpoint = step_dir;
  RETURN_IF_ERROR(Guard("ulysses-train export", [&]() -> absl::Status {
    // The manifest only; then one tensor at a time (checkpoint.h CheckpointReader).
    ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                     CheckpointReader::Open(step_dir, ""));
    const std::string where = absl::StrCat("checkpoint ", step_dir);
    ASSIGN_OR_RETURN(const train::TrainingState training,
                     train::TrainingState::FromJson(reader->info().extra, where));
    ASSIGN_OR_RETURN(model::LlamaConfig config, training.ModelConfig(where));
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
      ASSIGN_OR_RETURN(dtype, JobDtype(training, weight_dtype, step_dir));
    }
    // Where each weight comes from, checked before anything is written: the master is the weight
    // before rounding, the better source for any other dtype.
    std::map<std::string, std::string> source;
    for (const auto& [name, shape] : HfLlamaShapes(config)) {
      auto weight = stored.find(kModelPrefix + name);
      if (weight == stored.end()) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", step_dir, ": tensor ", kModelPrefix, name, " is missing"));
      }
      if (weight->second.shape != shape) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", step_dir, ": ", weight->first, " has shape ",
                         c10::str(c10::IntArrayRef(weight->second.shape)),
                         ", its model_config needs ", c10::str(c10::IntArrayRef(shape))));
      }
      auto master = stored.find(master_prefix + name);
      if (master != stored.end() && weight->second.dtype != dtype.type) {
        if (master->second.shape != shape) {
          return absl::DataLossError(
              absl::StrCat("checkpoint ", step_dir, ": ", kMasterPrefix, name, " has shape ",
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
    return CopyTokenizer(o, training, result);
  }));
  return result;
}

}  // namespace ulysses::engine
