#include "common/spec/init_from.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ulysses::spec {
namespace {

// A config.json is a few KiB; a larger file is not one (and is not read into memory).
constexpr std::uintmax_t kMaxConfigBytes = std::uintmax_t{16} << 20;

absl::StatusOr<std::string> ReadConfigText(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, " (", ec.message(),
                                            "; spec.model.init_from names a Hugging Face model "
                                            "directory holding config.json)"));
  }
  if (size > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size, " bytes is more than ",
                                                   kMaxConfigBytes, " (not a config.json)"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

std::string HfConfigPath(const std::string& dir) {
  return (std::filesystem::path(dir) / "config.json").string();
}

absl::StatusOr<ModelShape> ReadHfConfig(const std::string& dir) {
  const std::string path = HfConfigPath(dir);
  ASSIGN_OR_RETURN(std::string text, ReadConfigText(path));
  nlohmann::json c = nlohmann::json::parse(text, nullptr, false);
  if (c.is_discarded() || !c.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  }
  // What the shape does not say but the math depends on: refused unless it is ours.
  auto unsupported = [&](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", key, ": ", c[key].dump(), " is not supported (", why, ")"));
  };
  if (c.contains("hidden_act") && c["hidden_act"] != "silu") {
    return unsupported("hidden_act", "the engine's Llama MLP is SwiGLU: silu");
  }
  if (c.contains("mlp_bias") && !c["mlp_bias"].is_null() && c["mlp_bias"] != false) {
    return unsupported("mlp_bias", "the engine's MLP projections have no bias");
  }
  // The shape itself (family, rope_scaling, head_dim, attention biases, sliding window) is read
  // by the one shape reader.
  return ModelShapeFromJson(c, path);
}

absl::StatusOr<ModelSpec> ResolveInitFrom(const ModelSpec& model) {
  if (model.init_from.empty()) return model;
  ASSIGN_OR_RETURN(const ModelShape hf, ReadHfConfig(model.init_from));
  ASSIGN_OR_RETURN(const ModelShape shape,
                   ResolveModelShape(model, hf, HfConfigPath(model.init_from)));
  ModelSpec resolved = model;
  static_cast<ModelShape&>(resolved) = shape;
  resolved.from_init.clear();
  return resolved;
}

}  // namespace ulysses::spec
