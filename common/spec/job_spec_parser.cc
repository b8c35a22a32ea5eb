// TrainJob YAML -> JobSpec: schema-checked reading (unknown keys, wrong types) along the field
// list (job_spec_fields.h), --set overrides applied to the YAML tree, model presets. Validation
// lives in job_spec_validate.cc, emission (ToYaml, ToJson, SpecHash) in job_spec_emit.cc.
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/job_spec_schema.h"
#include "common/spec/spec_util.h"
#include "common/status.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::spec {
namespace {

using internal::Quote;
using internal::schema::ChildKeys;
using internal::schema::Describe;
using internal::schema::FindSchema;
using internal::schema::JoinPath;
using internal::schema::Kind;
using internal::schema::ParseBool;
using internal::schema::ParseDouble;
using internal::schema::ParseInt64;
using internal::schema::ParseUint64;
using internal::schema::Schema;
using internal::schema::SchemaEntry;

// ---------------------------------------------------------------------------
// Reader: walks the tree along the schema, collecting every error.
class Reader {
 public:
  std::vector<std::string> errors;

  void Error(const std::string& path, const std::string& message) {
    errors.push_back(absl::StrCat(path.empty() ? "(document)" : path, ": ", message));
  }

  // The entries of the mapping at `path`, checking keys against the schema.
  // Null (an empty section) gives no entries. Returns false if not a mapping.
  bool Entries(const YAML::Node& node, const std::string& path, const std::string& schema_path,
               std::map<std::string, YAML::Node>* out) {
    out->clear();
    if (node.IsNull()) {
      return true;
    }
    if (!node.IsMap()) {
      Error(path, absl::StrCat(Describe(node),
                               " is not a mapping (expected keys: ", JoinKeys(schema_path), ")"));
      return false;
    }
    const bool free_form = FindSchema(schema_path)->kind == Kind::kStringMap;
    const std::vector<std::string> known = ChildKeys(schema_path);
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar()) {
        Error(path,
              absl::StrCat(Describe(it->first), " is not a valid key (keys are plain names)"));
        continue;
      }
      const std::string key = it->first.Scalar();
      const std::string child = JoinPath(path, key);
      if (!free_form && FindSchema(JoinPath(schema_path, key)) == nullptr) {
        Error(child, absl::StrCat("unknown key", internal::SuggestKey(key, known)));
        continue;
      }
      if (out->count(key) != 0) {
        Error(child, "duplicate key (keep one of them)");
        continue;
      }
      (*out)[key] = it->second;
    }
    return true;
  }

  static std::string JoinKeys(const std::string& schema_path) {
    const SchemaEntry* e = FindSchema(schema_path);
    if (e != nullptr && e->kind == Kind::kStringMap) {
      return "any name: string value";
    }
    std::string joined;
    for (const std::string& k : ChildKeys(schema_path)) {
      absl::StrAppend(&joined, joined.empty() ? "" : ", ", k);
    }
    return joined;
  }

  // Scalar readers: absent or null leaves *out unchanged and returns false.
  bool Int(const std::map<std::string, YAML::Node>& m, const std::string& key,
           const std::string& path, int64_t* out) {
    const YAML::Node* n = Scalar(m, key, path, "an integer", "a whole number, e.g. 8");
    if (n == nullptr) {
      return false;
    }
    if (!ParseInt64(n->Scalar(), out)) {
      Error(JoinPath(path, key), absl::StrCat(Describe(*n),
                                              " is not an integer (write a whole number, "
                                              "e.g. 8)"));
      return false;
    }
    return true;
  }

  bool Double(const std::map<std::string, YAML::Node>& m, const std::string& key,
              const std::string& path, double* out) {
    const YAML::Node* n = Scalar(m, key, path, "a number", "a number, e.g. 3.0e-4");
    if (n == nullptr) {
      return false;
    }
    if (!ParseDouble(n->Scalar(), out)) {
      Error(JoinPath(path, key),
            absl::StrCat(Describe(*n), " is not a number (write a finite number, e.g. 3.0e-4)"));
      return false;
    }
    return true;
  }

  bool Bool(const std::map<std::string, YAML::Node>& m, const std::string& key,
            const std::string& path, bool* out) {
    const YAML::Node* n = Scalar(m, key, path, "a boolean", "true or false");
    if (n == nullptr) {
      return false;
    }
    if (!ParseBool(n->Scalar(), out)) {
      Error(JoinPath(path, key),
            absl::StrCat(Describe(*n), " is not a boolean (write true or false)"));
      return false;
    }
    return true;
  }

  bool String(const std::map<std::string, YAML::Node>& m, const std::string& key,
              const std::string& path, std::string* out) {
    const YAML::Node* n = Scalar(m, key, path, "a string", "a plain value");
    if (n == nullptr) {
      return false;
    }
    *out = n->Scalar();
    return true;
  }

  // Typed dispatch for the field list (model_shape.h).
  bool Read(const std::map<std::string, YAML::Node>& m, const std::string& key,
            const std::string& path, int64_t* out) {
    return Int(m, key, path, out);
  }
  bool Read(const std::map<std::string, YAML::Node>& m, const std::string& key,
            const std::string& path, double* out) {
    return Double(m, key, path, out);
  }
  bool Read(const std::map<std::string, YAML::Node>& m, const std::string& key,
            const std::string& path, bool* out) {
    return Bool(m, key, path, out);
  }
  bool Read(const std::map<std::string, YAML::Node>& m, const std::string& key,
            const std::string& path, std::string* out) {
    return String(m, key, path, out);
  }

 private:
  // The scalar node at `key`, or null when absent/null/not a scalar (reported).
  const YAML::Node* Scalar(const std::map<std::string, YAML::Node>& m, const std::string& key,
                           const std::string& path, const char* what, const char* example) {
    auto it = m.find(key);
    if (it == m.end() || it->second.IsNull()) {
      return nullptr;
    }
    if (!it->second.IsScalar()) {
      Error(JoinPath(path, key),
            absl::StrCat(Describe(it->second), " is not ", what, " (write ", example, ")"));
      return nullptr;
    }
    return &it->second;
  }
};

using Entries = std::map<std::string, YAML::Node>;

// Reads the elements of one section (listed by job_spec_fields.h) from its entries `m` into
// `obj`. `path` is the section's path as the user wrote it (spec.stages[2]), `schema_path` the
// same with [] for indices.
template <class S>
class SectionReader {
 public:
  SectionReader(Reader& r, S& obj, const Entries& m, std::string path, std::string schema_path)
      : r_(r), obj_(obj), m_(m), path_(std::move(path)), schema_path_(std::move(schema_path)) {}

  template <class T>
  void Field(const char* key, T S::*member, fields::Opt) {
    ReadValue(key, obj_.*member);
  }

  void Constant(const char* key, std::string S::*member, const char* value) {
    std::string& text = obj_.*member;
    const std::string path = JoinPath(path_, key);
    if (!r_.String(m_, key, path_, &text)) {
      r_.Error(path, absl::StrCat("missing (add ", key, ": ", value, ")"));
    } else if (text != value) {
      r_.Error(path, absl::StrCat(Quote(text), " is not supported (use ", value, ")"));
    }
  }

  void Pair(const char* key, double S::*first, double S::*second) {
    auto it = m_.find(key);
    if (it == m_.end() || it->second.IsNull()) {
      return;
    }
    const YAML::Node& node = it->second;
    const std::string p = JoinPath(path_, key);
    double* targets[2] = {&(obj_.*first), &(obj_.*second)};
    const S defaults{};  // The examples in messages.
    const std::string example = internal::FormatDouble(defaults.*first);
    if (!node.IsSequence() || node.size() != 2) {
      r_.Error(p, absl::StrCat(Describe(node), " is not a list of two numbers (write ", key, ": [",
                               example, ", ", internal::FormatDouble(defaults.*second), "])"));
      return;
    }
    for (size_t i = 0; i < 2; ++i) {
      const YAML::Node item = node[i];
      if (!item.IsScalar() || !ParseDouble(item.Scalar(), targets[i])) {
        r_.Error(absl::StrCat(p, "[", i, "]"),
                 absl::StrCat(Describe(item), " is not a number (write e.g. ", example, ")"));
      }
    }
  }

  void IntOrAuto(const char* key, int64_t S::*value, bool S::*is_auto) {
    if (auto it = m_.find(key);
        it != m_.end() && it->second.IsScalar() && it->second.Scalar() == "auto") {
      obj_.*is_auto = true;
    } else {
      r_.Int(m_, key, path_, &(obj_.*value));
    }
  }

  void Labels(const char* key, std::map<std::string, std::string> S::*member) {
    auto it = m_.find(key);
    if (it == m_.end()) {
      return;
    }
    Entries lm;
    const std::string p = JoinPath(path_, key);
    if (!r_.Entries(it->second, p, JoinPath(schema_path_, key), &lm)) {
      return;
    }
    for (const auto& [name, value] : lm) {
      std::string text;
      r_.String(lm, name, p, &text);
      (obj_.*member)[name] = text;
    }
  }

  // The model shape fields: the preset first, then the fields the document gives (nested
  // groups: "rope_scaling.factor" is factor in rope_scaling) over it.
  void Shape() {
    ModelSpec& model = obj_;
    if (!model.preset.empty()) {
      absl::Status preset = ApplyModelPreset(model);
      if (!preset.ok()) {
        r_.errors.emplace_back(preset.message());
      }
    }
    std::map<std::string, Entries> groups;
    for (const std::string& key : ShapeFieldKeys()) {
      const size_t dot = key.find('.');
      if (dot == std::string::npos || groups.count(key.substr(0, dot)) != 0) {
        continue;
      }
      const std::string group = key.substr(0, dot);
      Entries& entries = groups[group];
      auto it = m_.find(group);
      if (it != m_.end()) {
        r_.Entries(it->second, JoinPath(path_, group), JoinPath(schema_path_, group), &entries);
      }
    }
    ForEachShapeField(model, [&](const std::string& key, auto& value) {
      const size_t dot = key.find('.');
      const bool nested = dot != std::string::npos;
      const Entries& from = nested ? groups[key.substr(0, dot)] : m_;
      const std::string path = nested ? JoinPath(path_, key.substr(0, dot)) : path_;
      if (r_.Read(from, nested ? key.substr(dot + 1) : key, path, &value)) {
        given_.insert(key);
      }
    });
  }

  template <class M, class F>
  void Section(const char* key, M S::*member, F list, fields::Opt opt) {
    SectionAt(key, obj_.*member, list, opt);
  }
  template <class F>
  void Section(const char* key, fields::Self, F list, fields::Opt opt) {
    SectionAt(key, obj_, list, opt);
  }

  template <class T, class F>
  void List(const char* key, std::vector<T> S::*member, F list, fields::ListOpt opt) {
    auto it = m_.find(key);
    if (it == m_.end() || it->second.IsNull()) {
      return;
    }
    const YAML::Node& node = it->second;
    const std::string p = JoinPath(path_, key);
    if (!node.IsSequence()) {
      r_.Error(p, absl::StrCat(Describe(node), " is not a list (", opt.fix_list, ")"));
      return;
    }
    if (node.size() > static_cast<size_t>(kMaxStages)) {
      r_.errors.push_back(internal::TooManyStages(node.size()));  // Not one error per entry.
      return;
    }
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string ip = absl::StrCat(p, "[", i, "]");
      const YAML::Node item = node[i];
      T entry;
      if (item.IsNull()) {
        r_.Error(ip, absl::StrCat("an empty value is not a ", opt.noun, " (", opt.fix_item, ")"));
      } else {
        ReadMap(item, entry, list, ip, JoinPath(schema_path_, key) + "[]");
      }
      (obj_.*member).push_back(entry);
    }
  }

  // Called once the section's elements are read.
  void Finish() {
    if constexpr (std::is_same_v<S, ModelSpec>) {
      FinishModelSpec(obj_, given_);
    }
  }

 private:
  template <class T, class F>
  void SectionAt(const char* key, T& target, F list, fields::Opt opt) {
    const std::string path = JoinPath(path_, key);
    auto it = m_.find(key);
    if (it == m_.end() || (opt.null_is_missing && it->second.IsNull())) {
      if (opt.missing != nullptr) {
        r_.Error(path, absl::StrCat("missing (", opt.missing, ")"));
      }
      return;
    }
    ReadMap(it->second, target, list, path, JoinPath(schema_path_, key));
  }

  // A section that is absent or empty stays unset.
  template <class T, class F>
  void ReadMap(const YAML::Node& node, std::optional<T>& target, F list, const std::string& path,
               const std::string& schema_path) {
    if (node.IsNull()) {
      return;
    }
    T value;
    if (ReadMap(node, value, list, path, schema_path)) {
      target = value;
    }
  }

  template <class T, class F>
  bool ReadMap(const YAML::Node& node, T& target, F list, const std::string& path,
               const std::string& schema_path) {
    Entries m;
    if (!r_.Entries(node, path, schema_path, &m)) {
      return false;
    }
    SectionReader<T> child(r_, target, m, path, schema_path);
    list(child);
    child.Finish();
    return true;
  }

  template <class T>
  void ReadValue(const char* key, T& value) {
    r_.Read(m_, key, path_, &value);
  }
  template <class T>
  void ReadValue(const char* key, std::optional<T>& value) {
    T v{};
    if (r_.Read(m_, key, path_, &v)) {
      value = v;
    }
  }
  void ReadValue(const char* key, uint64_t& value) {
    auto it = m_.find(key);
    if (it != m_.end() && !it->second.IsNull()) {
      if (!it->second.IsScalar() || !ParseUint64(it->second.Scalar(), &value)) {
        r_.Error(
            JoinPath(path_, key),
            absl::StrCat(Describe(it->second), " is not a non-negative integer (write e.g. 1234)"));
      }
    }
  }

  Reader& r_;
  S& obj_;
  const Entries& m_;
  std::string path_;
  std::string schema_path_;
  std::set<std::string> given_;  // Shape keys the document set (ModelSpec).
};

// The document (the root is a mapping).
void ReadDocument(const YAML::Node& root, Reader& r, JobSpec* spec) {
  Entries m;
  if (!r.Entries(root, "", "", &m)) {
    return;
  }
  SectionReader<JobSpec> reader(r, *spec, m, "", "");
  fields::DocumentFields{}(reader);
}

// ---------------------------------------------------------------------------
// Overrides: "spec.stages[1].steps=5".
struct PathStep {
  std::string key;  // Empty for an index step.
  size_t index = 0;
};

bool ParseOverridePath(const std::string& path, std::vector<PathStep>* steps) {
  size_t i = 0;
  while (i < path.size()) {
    PathStep key_step;
    while (i < path.size() && path[i] != '.' && path[i] != '[') {
      key_step.key += path[i++];
    }
    if (key_step.key.empty()) {
      return false;
    }
    steps->push_back(key_step);
    while (i < path.size() && path[i] == '[') {
      const size_t close = path.find(']', i);
      if (close == std::string::npos) {
        return false;
      }
      int64_t index;
      if (!ParseInt64(path.substr(i + 1, close - i - 1), &index) || index < 0) {
        return false;
      }
      PathStep index_step;
      index_step.index = static_cast<size_t>(index);
      steps->push_back(index_step);
      i = close + 1;
    }
    if (i < path.size()) {
      if (path[i] != '.' || i + 1 == path.size()) {
        return false;
      }
      ++i;
    }
  }
  return !steps->empty();
}

absl::Status ApplyOverride(const YAML::Node& root, const std::string& assignment) {
  const std::string where = absl::StrCat("--set ", assignment);
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": missing '=' (write --set spec.path.to.field=value)"));
  }
  const std::string path = assignment.substr(0, eq);
  std::vector<PathStep> steps;
  if (!ParseOverridePath(path, &steps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", Quote(path), " is not a field path (write e.g. spec.stages[1].steps=5)"));
  }
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the value is not valid YAML (", e.msg, ")"));
  }
  YAML::Node cur = root;    // A handle: edits through it change the shared tree.
  std::string shown;        // Path walked so far, as the user writes it.
  std::string schema_path;  // Same, with [] for indices and * for free-form keys.
  for (size_t i = 0; i < steps.size(); ++i) {
    const PathStep& step = steps[i];
    const bool last = i + 1 == steps.size();
    const SchemaEntry* here = FindSchema(schema_path);
    if (!step.key.empty()) {
      const std::string child_schema = here->kind == Kind::kStringMap
                                           ? JoinPath(schema_path, "*")
                                           : JoinPath(schema_path, step.key);
      const std::string child_shown = JoinPath(shown, step.key);
      if ((here->kind != Kind::kMap && here->kind != Kind::kStringMap) ||
          FindSchema(child_schema) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", child_shown, " is not a known field",
            here->kind == Kind::kMap ? internal::SuggestKey(step.key, ChildKeys(schema_path))
                                     : ""));
      }
      if (cur.IsDefined() && !cur.IsMap() && !cur.IsNull()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", shown.empty() ? "(document)" : shown, " is ", Describe(cur),
                         ", not a mapping (fix the document first)"));
      }
      if (last) {
        cur[step.key] = value;
        return absl::OkStatus();
      }
      YAML::Node next = cur[step.key];
      cur.reset(next);
      shown = child_shown;
      schema_path = child_schema;
    } else {
      const std::string child_schema = schema_path + "[]";
      const std::string child_shown = absl::StrCat(shown, "[", step.index, "]");
      if (here->kind != Kind::kList || FindSchema(child_schema) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", shown, " is not a list (remove the [index])"));
      }
      if (!cur.IsSequence() || step.index >= cur.size()) {
        const size_t size = cur.IsSequence() ? cur.size() : 0;
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", child_shown,
                                                       " does not exist (", shown, " has ", size,
                                                       " entries; add the entry in the file)"));
      }
      if (last) {
        cur[step.index] = value;
        return absl::OkStatus();
      }
      YAML::Node next = cur[step.index];
      cur.reset(next);
      shown = child_shown;
      schema_path = child_schema;
    }
  }
  return absl::OkStatus();
}

// Counts node events of one document (to detect a second document without
// YAML::LoadAll, which loops forever on some malformed input in yaml-cpp 0.7).
class NodeCounter : public YAML::EventHandler {
 public:
  int nodes = 0;
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override { ++nodes; }
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { ++nodes; }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {
    ++nodes;
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    ++nodes;
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    ++nodes;
  }
  void OnMapEnd() override {}
};

absl::Status YamlError(const YAML::Exception& e) {
  if (e.mark.is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat("yaml: ", internal::OneLine(e.msg), " (fix the YAML syntax)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("yaml: line ", e.mark.line + 1, ", column ",
                                                 e.mark.column + 1, ": ", internal::OneLine(e.msg),
                                                 " (fix the YAML syntax)"));
}

absl::StatusOr<JobSpec> ParseTree(const std::string& text, const ParseOptions& options) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
    std::istringstream in(text);
    YAML::Parser parser(in);
    NodeCounter first, second;
    parser.HandleNextDocument(first);
    if (parser.HandleNextDocument(second) && second.nodes > 0) {
      return absl::InvalidArgumentError(
          "(document): more than one YAML document (give exactly one TrainJob per file)");
    }
  } catch (const YAML::Exception& e) {
    return YamlError(e);
  }
  if (root.IsNull()) {
    return absl::InvalidArgumentError(
        "(document): empty document (write a TrainJob: apiVersion, kind, metadata, spec)");
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("(document): ", Describe(root),
                     " is not a mapping (write a TrainJob: apiVersion, kind, metadata, spec)"));
  }
  std::vector<std::string> errors;
  for (const std::string& assignment : options.overrides) {
    absl::Status s = ApplyOverride(root, assignment);
    if (!s.ok()) {
      const std::string message(s.message());
      errors.push_back(message);
    }
  }
  RETURN_IF_ERROR(internal::ErrorsToStatus(errors));
  Reader reader;
  JobSpec spec;
  ReadDocument(root, reader, &spec);
  RETURN_IF_ERROR(internal::ErrorsToStatus(reader.errors));
  return spec;
}

}  // namespace

namespace internal::schema {

absl::StatusOr<JobSpec> ReadJobSpec(absl::string_view yaml_text, const ParseOptions& options) {
  if (static_cast<int64_t>(yaml_text.size()) > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "(document): ", yaml_text.size(), " bytes is more than ", kMaxSpecBytes,
        " (a TrainJob is at most 256 KiB; a real one is a few KiB: drop generated content)"));
  }
  try {
    const std::string text(yaml_text);
    return ParseTree(text, options);
  } catch (const std::exception& e) {
    // yaml-cpp reports misuse (e.g. odd node shapes) by exception; never let one escape.
    return absl::InvalidArgumentError(
        absl::StrCat("(document): cannot be read (", internal::OneLine(e.what()), ")"));
  }
}

}  // namespace internal::schema

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view yaml_text, const ParseOptions& options) {
  absl::StatusOr<JobSpec> spec = internal::schema::ReadJobSpec(yaml_text, options);
  if (!spec.ok()) {
    return spec.status();
  }
  RETURN_IF_ERROR(ValidateJobSpec(*spec));
  if (options.check_files) {
    RETURN_IF_ERROR(internal::CheckDataFiles(*spec));
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path, const ParseOptions& options) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(internal::OneLine(path), ": cannot read (", std::strerror(errno), ")"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        internal::OneLine(path), ": is not a regular file (give a TrainJob YAML file)"));
  }
  if (st.st_size > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(internal::OneLine(path), ": ", st.st_size,
                                                   " bytes is too large for a job spec "
                                                   "(at most 256 KiB)"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat(internal::OneLine(path), ": cannot read"));
  }
  return ParseJobSpec(buffer.str(), options);
}

}  // namespace ulysses::spec
