// The TrainJob schema (every known YAML path) and the scalar conversions the parser applies
// (job_spec_schema.h).
#include "common/spec/job_spec_schema.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/spec/model_shape.h"
#include "common/spec/spec_util.h"

namespace ulysses::spec::internal::schema {

using internal::Quote;

// ---------------------------------------------------------------------------
// Schema: every known path. "[]" stands for any list index, "*" for any key of
// a free-form string map (labels). Order is the order of "valid keys" hints.
namespace {

// The spec.model shape keys, from the field list (model_shape.h): a "group.name"
// key is a scalar inside the mapping spec.model.group.
std::vector<SchemaEntry> ModelShapeSchema() {
  std::vector<SchemaEntry> entries;
  for (const std::string& key : ShapeFieldKeys()) {
    const size_t dot = key.find('.');
    if (dot != std::string::npos) {
      const std::string group = "spec.model." + key.substr(0, dot);
      if (entries.empty() || entries.back().path.rfind(group + ".", 0) != 0) {
        entries.push_back({group, Kind::kMap});
      }
    }
    entries.push_back({"spec.model." + key, Kind::kScalar});
  }
  return entries;
}

}  // namespace

const std::vector<SchemaEntry>& Schema() {
  static const auto* schema = [] {
    auto* entries = new std::vector<SchemaEntry>{
        {"", Kind::kMap},
        {"apiVersion", Kind::kScalar},
        {"kind", Kind::kScalar},
        {"metadata", Kind::kMap},
        {"metadata.name", Kind::kScalar},
        {"metadata.labels", Kind::kStringMap},
        {"metadata.labels.*", Kind::kScalar},
        {"spec", Kind::kMap},
        {"spec.model", Kind::kMap},
        {"spec.model.preset", Kind::kScalar},
    };
    for (SchemaEntry& e : ModelShapeSchema()) {
      entries->push_back(std::move(e));
    }
    std::vector<SchemaEntry> rest = {
        {"spec.model.init_from", Kind::kScalar},
        {"spec.model.dtype", Kind::kScalar},
        {"spec.data", Kind::kMap},
        {"spec.data.train", Kind::kScalar},
        {"spec.data.validation", Kind::kScalar},
        {"spec.data.synthetic", Kind::kMap},
        {"spec.data.synthetic.generator", Kind::kScalar},
        {"spec.data.synthetic.validation_sequences", Kind::kScalar},
        {"spec.data.format", Kind::kScalar},
        {"spec.data.packing", Kind::kScalar},
        {"spec.parallelism", Kind::kMap},
        {"spec.parallelism.sp_degree", Kind::kScalar},
        {"spec.parallelism.dp_degree", Kind::kScalar},
        {"spec.parallelism.zero_stage", Kind::kScalar},
        {"spec.parallelism.offload_optimizer", Kind::kScalar},
        {"spec.parallelism.offload_activations", Kind::kScalar},
        {"spec.memory", Kind::kMap},
        {"spec.memory.activation_checkpointing", Kind::kScalar},
        {"spec.memory.tiled_mlp", Kind::kScalar},
        {"spec.memory.tiled_loss", Kind::kScalar},
        {"spec.memory.loss_tile_tokens", Kind::kScalar},
        {"spec.memory.attention_block_size", Kind::kScalar},
        {"spec.optimizer", Kind::kMap},
        {"spec.optimizer.type", Kind::kScalar},
        {"spec.optimizer.lr", Kind::kScalar},
        {"spec.optimizer.betas", Kind::kList},
        {"spec.optimizer.betas[]", Kind::kScalar},
        {"spec.optimizer.weight_decay", Kind::kScalar},
        {"spec.optimizer.eps", Kind::kScalar},
        {"spec.optimizer.grad_clip", Kind::kScalar},
        {"spec.optimizer.warmup_steps", Kind::kScalar},
        {"spec.optimizer.schedule", Kind::kScalar},
        {"spec.optimizer.min_lr_ratio", Kind::kScalar},
        {"spec.optimizer.grad_accum_steps", Kind::kScalar},
        {"spec.optimizer.micro_batch_size", Kind::kScalar},
        {"spec.stages", Kind::kList},
        {"spec.stages[]", Kind::kMap},
        {"spec.stages[].seq_len", Kind::kScalar},
        {"spec.stages[].steps", Kind::kScalar},
        {"spec.stages[].lr", Kind::kScalar},
        {"spec.stages[].warmup_steps", Kind::kScalar},
        {"spec.stages[].sp_degree", Kind::kScalar},
        {"spec.stages[].dp_degree", Kind::kScalar},
        {"spec.stages[].eval", Kind::kMap},
        {"spec.stages[].eval.max_sequences", Kind::kScalar},
        {"spec.stages[].eval.every_steps", Kind::kScalar},
        {"spec.eval", Kind::kMap},
        {"spec.eval.max_sequences", Kind::kScalar},
        {"spec.eval.every_steps", Kind::kScalar},
        {"spec.checkpoint", Kind::kMap},
        {"spec.checkpoint.dir", Kind::kScalar},
        {"spec.checkpoint.every_steps", Kind::kScalar},
        {"spec.checkpoint.every_seconds", Kind::kScalar},
        {"spec.checkpoint.keep_last", Kind::kScalar},
        {"spec.checkpoint.async", Kind::kScalar},
        {"spec.scheduling", Kind::kMap},
        {"spec.scheduling.priority", Kind::kScalar},
        {"spec.scheduling.max_failures", Kind::kScalar},
        {"spec.scheduling.max_infra_failures", Kind::kScalar},
        {"spec.scheduling.failure_window_s", Kind::kScalar},
        {"spec.scheduling.preemptible", Kind::kScalar},
        {"spec.scheduling.max_preemptions", Kind::kScalar},
        {"spec.scheduling.node_label", Kind::kScalar},
        {"spec.seed", Kind::kScalar},
    };
    entries->insert(entries->end(), rest.begin(), rest.end());
    return entries;
  }();
  return *schema;
}

const SchemaEntry* FindSchema(const std::string& schema_path) {
  for (const SchemaEntry& e : Schema()) {
    if (schema_path == e.path) {
      return &e;
    }
  }
  return nullptr;
}

std::string JoinPath(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : absl::StrCat(parent, ".", key);
}

// Keys directly under the map at `schema_path`.
std::vector<std::string> ChildKeys(const std::string& schema_path) {
  std::vector<std::string> keys;
  const std::string prefix = schema_path.empty() ? "" : schema_path + ".";
  for (const SchemaEntry& e : Schema()) {
    const std::string path = e.path;
    if (path.empty() || path.compare(0, prefix.size(), prefix) != 0) {
      continue;
    }
    const std::string rest = path.substr(prefix.size());
    if (rest.find_first_of(".[") == std::string::npos) {
      keys.push_back(rest);
    }
  }
  return keys;
}

// ---------------------------------------------------------------------------
// Scalar conversion.

// "'ten'", "a list", "a mapping", "an empty value".
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "an empty value";
  }
}

bool ParseInt64(const std::string& text, int64_t* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const int64_t v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) {
    return false;
  }
  *out = v;
  return true;
}

bool ParseUint64(const std::string& text, uint64_t* out) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const uint64_t v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) {
    return false;
  }
  *out = v;
  return true;
}

bool ParseDouble(const std::string& text, double* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (errno == ERANGE || end != text.c_str() + text.size() || !std::isfinite(v)) {
    return false;
  }
  *out = v;
  return true;
}

bool ParseBool(const std::string& text, bool* out) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "true" || t == "yes" || t == "on") {
    *out = true;
    return true;
  }
  if (t == "false" || t == "no" || t == "off") {
    *out = false;
    return true;
  }
  return false;
}

}  // namespace ulysses::spec::internal::schema
