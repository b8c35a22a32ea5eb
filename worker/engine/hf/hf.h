// Hugging Face interop: safetensors files and Llama config.json.
//
// Reads config.json (LlamaConfig names) into spec::ModelShape, loads every
// *.safetensors file of a directory (or the files named by
// model.safetensors.index.json) converting F32/F16/BF16/F64 weights to float32 (LoadHfWeightsShare:
// only the byte ranges a rank keeps),
// and writes a directory (config.json + model.safetensors in F32, BF16, F16 or F64) that
// transformers.LlamaForCausalLM.from_pretrained and scripts/reference_llama.py load.
//
// Stateless and thread-safe. Errors name the file and, for tensor problems, the
// tensor. A failed WriteHfDirectory may leave a partial directory behind; files are
// written via tmp + rename so an existing config.json/model.safetensors is either
// the old or the new version.
#ifndef ULYSSES_WORKER_ENGINE_HF_HF_H_
#define ULYSSES_WORKER_ENGINE_HF_HF_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "common/spec/model_shape.h"
#include "worker/engine/checkpoint/checkpoint.h"  // NamedTensor

namespace ulysses::engine {

// <dir>/config.json.
std::string HfConfigPath(const std::string& dir);

// config.json -> model shape: spec::ReadHfConfig (common/spec/init_from.h), the one reader that
// `ulyssesctl plan` and `validate --device-type` use too.
absl::StatusOr<spec::ModelShape> ReadHfConfig(const std::string& dir);

// All tensors of dir's safetensors files, as contiguous float32 CPU tensors, sorted by name.
absl::StatusOr<std::vector<NamedTensor>> LoadHfWeights(const std::string& dir);

// Sharded import: reads only the byte ranges `request` keeps (by HF name: expected shape, flat
// range) of dir's safetensors files (model.safetensors.index.json's, else every *.safetensors), one
// tensor at a time through pread, converting each kept range to float32. Only headers and kept
// ranges are read (counted in *stats); no file is read whole. Every requested tensor must be
// present with its shape and a weight dtype (checked on the headers before any tensor byte is
// read); an index naming a missing file is NOT_FOUND naming both. Whole requests come back in
// their shape, ranges as pieces (NamedTensor::full_shape, offset = begin), in request order.
absl::StatusOr<std::vector<NamedTensor>> LoadHfWeightsShare(const std::string& dir,
                                                            const ShareRequest& request,
                                                            LoadStats* stats = nullptr);

// Every tensor of dir's safetensors files is one of `model_names` (the model's parameters, by
// HF name) and every model name is in the files: an import consumes the whole checkpoint, so a
// tensor the model has no place for (a q_norm of another family, a bias) is an error naming it,
// never dropped. HF's own leftovers are allowed: `*.rotary_emb.inv_freq` buffers (written by
// transformers before 4.31) and `lm_head.weight` beside a model without one (tied embeddings).
// Reads headers only.
absl::Status CheckHfTensorsConsumed(const std::string& dir,
                                    const std::vector<std::string>& model_names);

// The same, handing each tensor to `sink` as soon as it is read (peak: one tensor), in request
// (name) order; stops at the first error of sink.
absl::Status ForEachHfWeightShare(const std::string& dir, const ShareRequest& request,
                                  const std::function<absl::Status(NamedTensor)>& sink,
                                  LoadStats* stats = nullptr);

// config.json + model.safetensors with every weight converted to `dtype` (float32,
// bfloat16, float16 or float64; config.json's torch_dtype says which). `weights` must be
// exactly the HF Llama parameters of `model` (HfLlamaShapes), else InvalidArgument naming
// the tensor; a finite weight that `dtype` cannot hold (beyond float16's range) is
// InvalidArgument naming the tensor and its largest magnitude. Everything is checked and
// converted before the directory is created. config.json holds spec::ModelShapeToJson(model)
// (rope_scaling included) and the HF architecture keys.
absl::Status WriteHfDirectory(const std::string& dir, const spec::ModelShape& model,
                              const std::vector<NamedTensor>& weights,
                              torch::ScalarType dtype = torch::kFloat32);

// Streaming export: HfLlamaShapes(model)'s tensors, fetched one at a time (`fetch(name)` returns
// the whole tensor in any floating dtype; it is checked, converted to `dtype`, written and dropped
// before the next: peak = the largest tensor). One model.safetensors when the weights fit in
// max_file_bytes, else model-0000k-of-0000n.safetensors files of at most that size each (a larger
// tensor alone in its file) + model.safetensors.index.json, as Hugging Face shards; then
// config.json. A failure leaves the files written so far (each complete or absent).
using HfTensorSource = std::function<absl::StatusOr<torch::Tensor>(const std::string& name)>;
struct HfWriteResult {
  std::vector<std::string> files;  // safetensors file names, in order
  int64_t tensors = 0;
  int64_t largest_tensor_bytes = 0;  // the largest converted tensor held at once
};
inline constexpr int64_t kHfMaxFileBytes = int64_t{5} * 1000 * 1000 * 1000;  // HF's 5 GB shards
absl::StatusOr<HfWriteResult> WriteHfDirectoryStreaming(const std::string& dir,
                                                        const spec::ModelShape& model,
                                                        const HfTensorSource& fetch,
                                                        torch::ScalarType dtype,
                                                        int64_t max_file_bytes = kHfMaxFileBytes);

// The HF Llama parameter names and shapes for `model` (lm_head.weight absent when tied).
std::map<std::string, std::vector<int64_t>> HfLlamaShapes(const spec::ModelShape& model);

// Low level: one safetensors file. Write keeps each tensor's dtype (F32, F64, F16,
// BF16, I64, I32, I16, I8, U8, BOOL); Read returns tensors in their stored dtype.
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});
absl::StatusOr<std::vector<NamedTensor>> ReadSafetensors(const std::string& path);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_HF_HF_H_
