// The one reader of an init_from model's config.json: what the engine imports
// (worker/engine/hf: ReadHfConfig delegates here) and what `ulyssesctl plan` and
// `ulyssesctl validate --device-type` plan and check, so the three read the same
// shape from the same file by the same rules. No torch; thread-safe.
#ifndef ULYSSES_COMMON_SPEC_INIT_FROM_H_
#define ULYSSES_COMMON_SPEC_INIT_FROM_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/spec/model_shape.h"

namespace ulysses::spec {

// <dir>/config.json.
std::string HfConfigPath(const std::string& dir);

// config.json -> model shape, read by ModelShapeFromJson (rope_scaling none/llama3,
// LlamaConfig defaults for absent keys, keys that do not change the math ignored). Rejects
// what the engine's model does not implement (another rope type, head_dim != hidden/heads,
// hidden_act other than silu, attention/mlp bias) naming the file, the key and the value.
// A missing, unreadable, oversized (> 16 MiB) or non-JSON file is an error naming it.
absl::StatusOr<ModelShape> ReadHfConfig(const std::string& dir);

// spec.model with init_from's shape resolved as the engine resolves it (ReadHfConfig, then
// ResolveModelShape: fields the spec left out come from config.json, a field that disagrees
// is an error naming both values); from_init is then empty. `model` unchanged when it has no
// init_from.
absl::StatusOr<ModelSpec> ResolveInitFrom(const ModelSpec& model);

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_INIT_FROM_H_
