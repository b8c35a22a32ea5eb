// The TrainJob schema (every known YAML path, derived from the field list of
// job_spec_fields.h) and the scalar conversions the parser applies (job_spec_schema.h).
#include "common/spec/job_spec_schema.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
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
std::vector<SchemaEntry> ModelShapeSchema(const std::string& model_path) {
  std::vector<SchemaEntry> entries;
  for (const std::string& key : ShapeFieldKeys()) {
    const size_t dot = key.find('.');
    if (dot != std::string::npos) {
      const std::string group = JoinPath(model_path, key.substr(0, dot));
      if (entries.empty() || entries.back().path.rfind(group + ".", 0) != 0) {
        entries.push_back({group, Kind::kMap});
      }
    }
    entries.push_back({JoinPath(model_path, key), Kind::kScalar});
  }
  return entries;
}

// Adds the entries of one section (listed by job_spec_fields.h) under `path`.
template <class S>
class SchemaBuilder {
 public:
  SchemaBuilder(std::vector<SchemaEntry>& out, std::string path)
      : out_(out), path_(std::move(path)) {}

  template <class T>
  void Field(const char* key, T S::*, fields::Opt) {
    Add(key, Kind::kScalar);
  }
  void Constant(const char* key, std::string S::*, const char*) { Add(key, Kind::kScalar); }
  void Pair(const char* key, double S::*, double S::*) {
    Add(key, Kind::kList);
    out_.push_back({JoinPath(path_, key) + "[]", Kind::kScalar});
  }
  void IntOrAuto(const char* key, int64_t S::*, bool S::*) { Add(key, Kind::kScalar); }
  void Labels(const char* key, std::map<std::string, std::string> S::*) {
    Add(key, Kind::kStringMap);
    out_.push_back({JoinPath(JoinPath(path_, key), "*"), Kind::kScalar});
  }
  void Shape() {
    for (SchemaEntry& e : ModelShapeSchema(path_)) {
      out_.push_back(std::move(e));
    }
  }
  template <class M, class F>
  void Section(const char* key, M S::*, F list, fields::Opt) {
    Nested<typename fields::SectionOf<M>::type>(JoinPath(path_, key), list);
  }
  template <class F>
  void Section(const char* key, fields::Self, F list, fields::Opt) {
    Nested<S>(JoinPath(path_, key), list);
  }
  template <class T, class F>
  void List(const char* key, std::vector<T> S::*, F list, fields::ListOpt) {
    Add(key, Kind::kList);
    Nested<T>(JoinPath(path_, key) + "[]", list);
  }

  template <class T, class F>
  void Nested(const std::string& path, F list) {
    out_.push_back({path, Kind::kMap});
    SchemaBuilder<T> child(out_, path);
    list(child);
  }

 private:
  void Add(const char* key, Kind kind) { out_.push_back({JoinPath(path_, key), kind}); }

  std::vector<SchemaEntry>& out_;
  std::string path_;
};

}  // namespace

const std::vector<SchemaEntry>& Schema() {
  static const auto* schema = [] {
    auto* entries = new std::vector<SchemaEntry>;
    SchemaBuilder<JobSpec>(*entries, "").Nested<JobSpec>("", fields::DocumentFields{});
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
