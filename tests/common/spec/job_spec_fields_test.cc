// The field list (common/spec/job_spec_fields.h) is the one place a spec field is named: for
// every element of it, a non-default value is shown by ToYaml and ToJson (and the all-fields
// views of get job), read back, reachable with --set, named by PathOf and listed by the schema;
// an unknown key next to every section is refused naming it. Nothing here lists fields by
// hand: adding a field to the list adds its cases.
#include "common/spec/job_spec_fields.h"

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/job_spec_schema.h"
#include "common/spec/spec_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::spec {
namespace {

using ::testing::HasSubstr;

constexpr char kBaseYaml[] = R"(apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: fields}
spec:
  model: {vocab_size: 256, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
          num_attention_heads: 4}
  stages: [{seq_len: 64, steps: 2}]
)";

// One element of the list set to a value other than the base spec's.
struct Case {
  std::string path;                      // As --set writes it: spec.stages[0].lr.
  std::vector<std::string> assignments;  // --set path=value (the text of the new value).
  std::function<void(JobSpec&)> set;     // The same change on a JobSpec.
  // True when the field has the same value in both specs.
  std::function<bool(JobSpec, JobSpec)> same;
  std::string path_of;  // Field elements: fields::PathOf(member, 0).
};

// A value unlike `v`, and its YAML text.
int64_t Other(int64_t v) { return v + 3; }
uint64_t Other(uint64_t v) { return v + 3; }
double Other(double v) { return v + 0.25; }
bool Other(bool v) { return !v; }
std::string Other(const std::string& v) { return v + "x"; }
template <class T>
T Other(const std::optional<T>& v) {
  return Other(v.value_or(T{}));
}
std::string Text(int64_t v) { return absl::StrCat(v); }
std::string Text(uint64_t v) { return absl::StrCat(v); }
std::string Text(double v) { return internal::FormatDouble(v); }
std::string Text(bool v) { return v ? "true" : "false"; }
std::string Text(const std::string& v) { return v; }

template <class T>
T& Present(T& v) {
  return v;
}
template <class T>
T& Present(std::optional<T>& v) {
  if (!v) {
    v.emplace();
  }
  return *v;
}

// Collects the cases of a section of type S, reached in a JobSpec by `get` (which makes
// optional sections and the first list entry present).
template <class S>
class CaseCollector {
 public:
  using Getter = std::function<S&(JobSpec&)>;
  CaseCollector(std::vector<Case>& out, const JobSpec& base, std::string path, Getter get)
      : out_(out), base_(base), path_(std::move(path)), get_(std::move(get)) {}

  template <class T>
  void Field(const char* key, T S::*m, fields::Opt) {
    JobSpec probe = base_;
    auto other = Other(get_(probe).*m);
    const std::string path = Join(key);
    if constexpr (std::is_same_v<decltype(other), std::string>) {
      if (path == "spec.model.preset") {  // The reader checks preset names.
        other = "tiny";
      }
    }
    Getter get = get_;
    Add(
        path, {absl::StrCat(path, "=", Text(other))},
        [get, m, other](JobSpec& j) { get(j).*m = other; },
        [get, m](JobSpec a, JobSpec b) { return get(a).*m == get(b).*m; });
    out_.back().path_of = fields::PathOf(m, 0);
  }
  void Constant(const char*, std::string S::*, const char*) {}  // One valid value.
  void Pair(const char* key, double S::*first, double S::*second) {
    JobSpec probe = base_;
    const double a = Other(get_(probe).*first), b = Other(get_(probe).*second);
    Getter get = get_;
    Add(
        Join(key), {absl::StrCat(Join(key), "=[", Text(a), ", ", Text(b), "]")},
        [get, first, second, a, b](JobSpec& j) {
          get(j).*first = a;
          get(j).*second = b;
        },
        [get, first, second](JobSpec x, JobSpec y) {
          S &p = get(x), &q = get(y);
          return p.*first == q.*first && p.*second == q.*second;
        });
  }
  void IntOrAuto(const char* key, int64_t S::*value, bool S::*is_auto) {
    JobSpec probe = base_;
    const int64_t n = Other(get_(probe).*value);
    Getter get = get_;
    auto same = [get, value, is_auto](JobSpec x, JobSpec y) {
      S &p = get(x), &q = get(y);
      return p.*value == q.*value && p.*is_auto == q.*is_auto;
    };
    Add(
        Join(key), {absl::StrCat(Join(key), "=", n)},
        [get, value, n](JobSpec& j) { get(j).*value = n; }, same);
    out_.push_back({Join(key) + " (auto)",
                    {absl::StrCat(Join(key), "=auto")},
                    [get, is_auto](JobSpec& j) { get(j).*is_auto = true; },
                    same});
  }
  void Labels(const char* key, std::map<std::string, std::string> S::*m) {
    Getter get = get_;
    Add(
        Join(key) + ".zz", {Join(key) + ".zz=label"},
        [get, m](JobSpec& j) { (get(j).*m)["zz"] = "label"; },
        [get, m](JobSpec x, JobSpec y) { return get(x).*m == get(y).*m; });
  }
  // Shape fields (their own list, model_shape.h). Scaling numbers show only with a rope type.
  void Shape() {
    JobSpec probe = base_;
    ModelSpec& model = get_(probe);
    Getter get = get_;
    ForEachShapeField(model, [&](const std::string& key, const auto& value) {
      const auto other = Other(value);
      const std::string path = Join(key);
      std::vector<std::string> sets = {absl::StrCat(path, "=", Text(other))};
      const bool scaling = key.rfind("rope_scaling.", 0) == 0 && key != "rope_scaling.rope_type";
      if (scaling) {
        sets.push_back(Join("rope_scaling.rope_type") + "=" + kRopeLlama3);
      }
      Add(
          path, sets,
          [get, key, other, scaling](JobSpec& j) {
            ModelSpec& m = get(j);
            if (scaling) {
              m.rope_scaling.rope_type = kRopeLlama3;
            }
            ForEachShapeField(m, [&](const std::string& k, auto& v) {
              if constexpr (std::is_same_v<std::decay_t<decltype(v)>,
                                           std::decay_t<decltype(other)>>) {
                if (k == key) {
                  v = other;
                }
              }
            });
          },
          [get, key](JobSpec x, JobSpec y) { return ShapeFieldEquals(get(x), get(y), key); });
    });
  }
  template <class M, class F>
  void Section(const char* key, M S::*m, F list, fields::Opt) {
    using T = typename fields::SectionOf<M>::type;
    Getter get = get_;
    CaseCollector<T> child(out_, base_, Join(key),
                           [get, m](JobSpec& j) -> T& { return Present(get(j).*m); });
    list(child);
  }
  template <class F>
  void Section(const char* key, fields::Self, F list, fields::Opt) {
    CaseCollector<S> child(out_, base_, Join(key), get_);
    list(child);
  }
  template <class T, class F>
  void List(const char* key, std::vector<T> S::*m, F list, fields::ListOpt) {
    Getter get = get_;
    CaseCollector<T> child(out_, base_, Join(key) + "[0]", [get, m](JobSpec& j) -> T& {
      std::vector<T>& items = get(j).*m;
      if (items.empty()) {
        items.emplace_back();
      }
      return items[0];
    });
    list(child);
  }

 private:
  std::string Join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  void Add(std::string path, std::vector<std::string> sets, std::function<void(JobSpec&)> set,
           std::function<bool(JobSpec, JobSpec)> same) {
    out_.push_back({std::move(path), std::move(sets), std::move(set), std::move(same)});
  }

  std::vector<Case>& out_;
  const JobSpec& base_;
  std::string path_;
  Getter get_;
};

JobSpec Base() {
  absl::StatusOr<JobSpec> base = internal::schema::ReadJobSpec(kBaseYaml, {});
  EXPECT_TRUE(base.ok()) << base.status();
  return *base;
}

std::vector<Case> AllCases(const JobSpec& base) {
  std::vector<Case> cases;
  CaseCollector<JobSpec> root(cases, base, "", [](JobSpec& j) -> JobSpec& { return j; });
  fields::DocumentFields{}(root);
  return cases;
}

absl::StatusOr<JobSpec> Read(const std::string& yaml, std::vector<std::string> sets = {}) {
  ParseOptions options;
  options.overrides = std::move(sets);
  return internal::schema::ReadJobSpec(yaml, options);
}

TEST(JobSpecFieldsTest, EveryFieldIsEmittedReadBackAndReachableBySet) {
  const JobSpec base = Base();
  const std::string base_yaml = ToYaml(base);
  const std::vector<Case> cases = AllCases(base);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    JobSpec changed = base;
    c.set(changed);
    ASSERT_FALSE(c.same(changed, base)) << "the case does not change the field";
    const std::string yaml = ToYaml(changed);
    EXPECT_NE(yaml, base_yaml) << "ToYaml does not show " << c.path;
    EXPECT_NE(ToJson(changed), ToJson(base)) << "ToJson does not show " << c.path;
    if (absl::StartsWith(c.path, "spec.data.")) {  // ulyssesctl get job's data view
      EXPECT_NE(AllFieldsJson(changed.data), AllFieldsJson(base.data)) << c.path;
    }
    if (absl::StartsWith(c.path, "spec.eval.")) {  // ... and its eval view
      EXPECT_NE(AllFieldsJson(changed.eval), AllFieldsJson(base.eval)) << c.path;
    }
    absl::StatusOr<JobSpec> read = Read(yaml);
    ASSERT_TRUE(read.ok()) << read.status() << "\n" << yaml;
    EXPECT_TRUE(c.same(*read, changed)) << "not read back from\n" << yaml;
    EXPECT_EQ(ToYaml(*read), yaml);
    absl::StatusOr<JobSpec> set = Read(base_yaml, c.assignments);
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_TRUE(c.same(*set, changed)) << "--set " << c.assignments[0] << " does not reach it";
  }
}

// The schema (known keys, --set paths, "valid keys" hints) has exactly the list's leaves.
TEST(JobSpecFieldsTest, TheSchemaListsExactlyTheFieldsOfTheList) {
  std::set<std::string> leaves;
  for (const Case& c : AllCases(Base())) {
    std::string path = absl::StrReplaceAll(c.path, {{"[0]", "[]"}, {" (auto)", ""}});
    if (path == "metadata.labels.zz") {
      path = "metadata.labels.*";
    }
    leaves.insert(path);
  }
  std::set<std::string> schema_leaves;
  for (const internal::schema::SchemaEntry& e : internal::schema::Schema()) {
    const bool leaf =
        e.kind == internal::schema::Kind::kScalar ||
        (e.kind == internal::schema::Kind::kList && e.path.find("[]") == e.path.npos &&
         internal::schema::FindSchema(e.path + "[]")->kind == internal::schema::Kind::kScalar);
    if (leaf && e.path != "apiVersion" && e.path != "kind" && e.path.back() != ']') {
      schema_leaves.insert(e.path);
    }
  }
  EXPECT_EQ(leaves, schema_leaves);
  EXPECT_GE(leaves.size(), 60u);  // Sanity: the whole document, not one section.
}

// PathOf (the --set text ulyssesctl plan prints) names every field where the list puts it.
TEST(JobSpecFieldsTest, PathOfNamesEveryFieldByItsPlace) {
  int fields = 0, shape_fields = 0;
  for (const Case& c : AllCases(Base())) {
    if (c.path_of.empty() && c.path.rfind("spec.model.", 0) == 0) {
      // Shape fields: their own list (ForEachShapeField), no member pointer; ShapePathOf.
      EXPECT_EQ(fields::ShapePathOf(c.path.substr(11)), c.path);
      ++shape_fields;
      continue;
    }
    if (c.path.rfind("spec.eval.", 0) == 0) {
      // EvalSpec is used twice: its first place in document order is the stage's.
      EXPECT_EQ(c.path_of, "spec.stages[0].eval." + c.path.substr(10));
      continue;
    }
    if (c.path_of.empty()) {  // Not a Field element (betas, every_steps, labels).
      continue;
    }
    EXPECT_EQ(c.path_of, c.path);
    ++fields;
  }
  EXPECT_GE(fields, 40);
  EXPECT_GE(shape_fields, 9);
  EXPECT_EQ(fields::PathOf(&StageSpec::sp_degree, 3), "spec.stages[3].sp_degree");
  EXPECT_EQ(fields::PathOf(&OptimizerSpec::beta2), "spec.optimizer.betas");
  EXPECT_EQ(fields::PathOf(&CheckpointSpec::every_steps_auto), "spec.checkpoint.every_steps");
}

// Next to every mapping of a spec with every optional section present, an unknown key is an
// error naming it, in the file and by --set.
TEST(JobSpecFieldsTest, AnUnknownKeyNextToEverySectionIsRefusedNamingIt) {
  JobSpec full = Base();
  for (const Case& c : AllCases(full)) {
    c.set(full);
  }
  const std::string yaml = ToYaml(full);
  // The mappings: the document and the parent of every field but the free-form labels.
  std::set<std::string> sections = {""};
  for (const Case& c : AllCases(Base())) {
    const std::string path = absl::StrReplaceAll(c.path, {{" (auto)", ""}});
    const size_t dot = path.rfind('.');
    if (dot != std::string::npos && path.rfind("metadata.labels.", 0) != 0) {
      sections.insert(path.substr(0, dot));
    }
  }
  for (const std::string& section : sections) {
    SCOPED_TRACE(section.empty() ? "(document)" : section);
    YAML::Node root = YAML::Load(yaml);
    YAML::Node cur = root;
    for (absl::string_view step : absl::StrSplit(section, '.', absl::SkipEmpty())) {
      const bool indexed = absl::EndsWith(step, "[0]");
      const std::string key(indexed ? step.substr(0, step.size() - 3) : step);
      ASSERT_TRUE(cur[key].IsDefined()) << key << " not in\n" << yaml;
      cur.reset(cur[key]);
      if (indexed) {
        cur.reset(cur[0]);
      }
    }
    cur["zz_unknown"] = 1;
    const std::string field = section.empty() ? "zz_unknown" : section + ".zz_unknown";
    absl::StatusOr<JobSpec> read = Read(YAML::Dump(root));
    ASSERT_FALSE(read.ok());
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(field + ": unknown key"));
    absl::StatusOr<JobSpec> set = Read(yaml, {field + "=1"});
    ASSERT_FALSE(set.ok());
    EXPECT_THAT(std::string(set.status().message()), HasSubstr(field + " is not a known field"));
  }
  EXPECT_EQ(sections.size(), 17u);  // Sanity: the document, its sections and their nested ones.
}

// SpecHash is stored in checkpoints: the emitter derived from the list must print the hashed
// sections byte for byte as the hand-written emitter before it did (values computed at
// 2d3a247). A change here makes every existing checkpoint foreign.
TEST(JobSpecFieldsTest, SpecHashIsTheOneOfTheHandWrittenEmitter) {
  const struct {
    const char* spec;
    const char* hash;
  } pins[] = {
      {R"(apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: hash-pin, labels: {team: a}}
spec:
  model: {preset: tiny, dtype: float32}
  data: {synthetic: {generator: needle, validation_sequences: 4}}
  optimizer: {lr: 1.0e-3, betas: [0.9, 0.99], warmup_steps: 3, micro_batch_size: 2,
              grad_accum_steps: 2}
  stages:
    - {seq_len: 256, steps: 4}
  seed: 7
)",
       "e1d66c800cfc61d3"},
      {R"(apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: hash-pin-2}
spec:
  model: {preset: llama3-1b}
  data: {train: /d/train, validation: /d/val, format: indexed, packing: false}
  stages:
    - {seq_len: 1024, steps: 4}
)",
       "0bd1d880f8008ede"},
  };
  for (const auto& pin : pins) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(pin.spec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(SpecHash(*spec), pin.hash) << ToYaml(*spec);
  }
}

}  // namespace
}  // namespace ulysses::spec
