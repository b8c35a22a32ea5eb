// `ulysses-train export`: a committed training checkpoint's model weights as a Hugging Face
// directory (config.json + safetensors, hf.h), in the dtype asked for (default: the job's), from
// the fp32 masters where they are more precise. Reads the checkpoint one tensor at a time
// (checkpoint.h CheckpointReader); the checkpoint's names and training state come from the
// engine's train/ (model_io.h, optimizer.h).
#ifndef ULYSSES_WORKER_ENGINE_HF_EXPORT_H_
#define ULYSSES_WORKER_ENGINE_HF_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/hf/hf.h"  // kHfMaxFileBytes

namespace ulysses::engine {

// The flags of `ulysses-train export`.
struct ExportOptions {
  // --checkpoint DIR: a committed step directory, or a checkpoint root (its newest committed
  // step), or a job's output directory (the newest committed step under DIR/checkpoints).
  std::string checkpoint;
  std::string hf_out;  // --hf-out DIR: must be absent or empty
  // --dtype: bf16 | fp16 | fp32 | fp64, or the spec.model.dtype spellings bfloat16 | float16 |
  // float32 | float64. "" = the job's spec.model.dtype (the checkpoint's extra.dtype).
  std::string dtype;
  // --max-file-bytes: above it the weights go to model-0000k-of-0000n.safetensors files of at
  // most this size + model.safetensors.index.json (hf.h WriteHfDirectoryStreaming).
  int64_t max_file_bytes = kHfMaxFileBytes;
  // --tokenizer-from DIR: where the tokenizer files (kTokenizerFiles) come from. "" = the
  // checkpoint's extra.init_from (the HF model the job started from) when it recorded one and
  // the directory is still there. An explicit DIR that is missing or holds none of them is an
  // error before anything is written.
  std::string tokenizer_from;
};

// The files of an HF model directory that are not weights and that a model loaded from the
// export needs as they were: the tokenizer and the generation defaults. Copied as they are
// (each a regular file, or a link to one as in the HF cache, of at most kTokenizerMaxFileBytes).
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json",
                                                  "tokenizer_config.json",
                                                  "special_tokens_map.json",
                                                  "tokenizer.model",
                                                  "vocab.json",
                                                  "merges.txt",
                                                  "added_tokens.json",
                                                  "chat_template.jinja",
                                                  "generation_config.json"};
inline constexpr int64_t kTokenizerMaxFileBytes = int64_t{256} << 20;

struct ExportResult {
  std::string checkpoint;            // the step directory exported (--checkpoint resolved)
  std::string dtype;                 // what was written: float32 | bfloat16 | float16 | float64
  int64_t tensors = 0;               // weights written
  int64_t from_masters = 0;          // of them, taken from the fp32 masters (optim/master/<name>)
  std::vector<std::string> files;    // the safetensors files written
  int64_t largest_tensor_bytes = 0;  // the most weight bytes held at once (one tensor)
  int64_t bytes_read = 0;            // checkpoint tensor bytes read
  std::string tokenizer_from;        // where the tokenizer files came from ("" = none copied)
  std::vector<std::string> tokenizer_files;  // the kTokenizerFiles copied
  std::string tokenizer_note;                // why none were copied, when the job had an init_from
};

// Writes config.json + model.safetensors (or sharded files + index above max_file_bytes) in the
// chosen dtype, one tensor at a time: read from the checkpoint's pieces, converted, written,
// dropped. A weight is taken from its fp32
// master (optimizer.h, kMasterPrefix) when the checkpoint holds one and the chosen dtype is not
// the weight's own: so an fp32 export of a bf16 job is the masters bit for bit, and an fp16
// export rounds the masters once. In the weight's own dtype the stored weights are written as
// trained. Then copies the tokenizer files (tokenizer_from). Checks --dtype, --checkpoint and
// --tokenizer-from before reading anything and refuses a non-empty hf_out; nothing is written on
// an error except a partial hf_out after a failed write (hf.h).
absl::StatusOr<ExportResult> ExportCheckpoint(const ExportOptions& options);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_HF_EXPORT_H_
