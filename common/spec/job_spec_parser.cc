// TrainJob YAML -> JobSpec: schema-checked reading (unknown keys, wrong types),
// --set overrides applied to the YAML tree, model presets. Validation lives in
// job_spec_validate.cc, emission (ToYaml, SpecHash) in job_spec_emit.cc.
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
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

void ReadMetadata(const YAML::Node& node, Reader& r, Metadata* md) {
  Entries m;
  if (!r.Entries(node, "metadata", "metadata", &m)) {
    return;
  }
  r.String(m, "name", "metadata", &md->name);
  auto labels = m.find("labels");
  if (labels == m.end()) {
    return;
  }
  Entries lm;
  if (!r.Entries(labels->second, "metadata.labels", "metadata.labels", &lm)) {
    return;
  }
  for (const auto& [key, value] : lm) {
    std::string text;
    r.String(lm, key, "metadata.labels", &text);
    md->labels[key] = text;
  }
}

void ReadModel(const YAML::Node& node, Reader& r, ModelSpec* model) {
  Entries m;
  const std::string p = "spec.model";
  if (!r.Entries(node, p, p, &m)) {
    return;
  }
  *model = ModelSpec{};
  r.String(m, "preset", p, &model->preset);
  if (!model->preset.empty()) {
    absl::Status preset = ApplyModelPreset(*model);
    if (!preset.ok()) {
      const std::string message(preset.message());
      r.errors.push_back(message);
    }
  }
  // Nested groups of shape keys ("rope_scaling.factor" is factor in rope_scaling).
  std::map<std::string, Entries> groups;
  for (const std::string& key : ShapeFieldKeys()) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos || groups.count(key.substr(0, dot)) != 0) {
      continue;
    }
    const std::string group = key.substr(0, dot);
    Entries& entries = groups[group];
    auto it = m.find(group);
    if (it != m.end()) {
      r.Entries(it->second, JoinPath(p, group), JoinPath(p, group), &entries);
    }
  }
  // Explicit fields override the preset.
  std::set<std::string> given;
  ForEachShapeField(*model, [&](const std::string& key, auto& value) {
    const size_t dot = key.find('.');
    const bool nested = dot != std::string::npos;
    const Entries& from = nested ? groups[key.substr(0, dot)] : m;
    const std::string path = nested ? JoinPath(p, key.substr(0, dot)) : p;
    if (r.Read(from, nested ? key.substr(dot + 1) : key, path, &value)) {
      given.insert(key);
    }
  });
  r.String(m, "init_from", p, &model->init_from);
  r.String(m, "dtype", p, &model->dtype);
  FinishModelSpec(*model, given);
}

void ReadData(const YAML::Node& node, Reader& r, DataSpec* data) {
  Entries m;
  const std::string p = "spec.data";
  if (!r.Entries(node, p, p, &m)) {
    return;
  }
  r.String(m, "train", p, &data->train);
  r.String(m, "validation", p, &data->validation);
  r.String(m, "format", p, &data->format);
  r.Bool(m, "packing", p, &data->packing);
  auto synthetic = m.find("synthetic");
  if (synthetic == m.end() || synthetic->second.IsNull()) {
    return;
  }
  Entries sm;
  const std::string sp = "spec.data.synthetic";
  if (!r.Entries(synthetic->second, sp, sp, &sm)) {
    return;
  }
  SyntheticDataSpec s;
  r.String(sm, "generator", sp, &s.generator);
  r.Int(sm, "validation_sequences", sp, &s.validation_sequences);
  data->synthetic = s;
}

void ReadParallelism(const YAML::Node& node, Reader& r, ParallelismSpec* par) {
  Entries m;
  const std::string p = "spec.parallelism";
  if (!r.Entries(node, p, p, &m)) {
    return;
  }
  r.Int(m, "sp_degree", p, &par->sp_degree);
  r.Int(m, "dp_degree", p, &par->dp_degree);
  r.Int(m, "zero_stage", p, &par->zero_stage);
  r.Bool(m, "offload_optimizer", p, &par->offload_optimizer);
  r.Bool(m, "offload_activations", p, &par->offload_activations);
}

void ReadMemory(const YAML::Node& node, Reader& r, MemorySpec* mem) {
  Entries m;
  const std::string p = "spec.memory";
  if (!r.Entries(node, p, p, &m)) {
    return;
  }
  r.Bool(m, "activation_checkpointing", p, &mem->activation_checkpointing);
  r.Bool(m, "tiled_mlp", p, &mem->tiled_mlp);
  r.Bool(m, "tiled_loss", p, &mem->tiled_loss);
  r.Int(m, "loss_tile_tokens", p, &mem->loss_tile_tokens);
  r.Int(m, "attention_block_size", p, &mem->attention_block_size);
}

void ReadBetas(const YAML::Node& node, Reader& r, OptimizerSpec* opt) {
  const std::string p = "spec.optimizer.betas";
  if (node.IsNull()) {
    return;
  }
  if (!node.IsSequence() || node.size() != 2) {
    r.Error(p, absl::StrCat(Describe(node),
                            " is not a list of two numbers (write betas: "
                            "[0.9, 0.95])"));
    return;
  }
  double* targets[2] = {&opt->beta1, &opt->beta2};
  for (size_t i = 0; i < 2; ++i) {
    const YAML::Node item = node[i];
    const std::string ip = absl::StrCat(p, "[", i, "]");
    if (!item.IsScalar() || !ParseDouble(item.Scalar(), targets[i])) {
      r.Error(ip, absl::StrCat(Describe(item), " is not a number (write e.g. 0.9)"));
    }
  }
}

void ReadOptimizer(const YAML::Node& node, Reader& r, OptimizerSpec* opt) {
  Entries m;
  const std::string p = "spec.optimizer";
  if (!r.Entries(node, p, p, &m)) {
    return;
  }
  r.String(m, "type", p, &opt->type);
  r.Double(m, "lr", p, &opt->lr);
  if (m.count("betas")) {
    ReadBetas(m["betas"], r, opt);
  }
  r.Double(m, "weight_decay", p, &opt->weight_decay);
  r.Double(m, "eps", p, &opt->eps);
  r.Double(m, "grad_clip", p, &opt->grad_clip);
  r.Int(m, "warmup_steps", p, &opt->warmup_steps);
  r.String(m, "schedule", p, &opt->schedule);
  r.Double(m, "min_lr_ratio", p, &opt->min_lr_ratio);
  r.Int(m, "grad_accum_steps", p, &opt->grad_accum_steps);
  r.Int(m, "micro_batch_size", p, &opt->micro_batch_size);
}

// spec.eval or spec.stages[i].eval (schema path `schema`).
void ReadEvalMap(const YAML::Node& node, Reader& r, const std::string& p, const std::string& schema,
                 EvalSpec* eval) {
  Entries m;
  if (!r.Entries(node, p, schema, &m)) {
    return;
  }
  r.Int(m, "max_sequences", p, &eval->max_sequences);
  r.Int(m, "every_steps", p, &eval->every_steps);
}

void ReadEval(const YAML::Node& node, Reader& r, EvalSpec* eval) {
  ReadEvalMap(node, r, "spec.eval", "spec.eval", eval);
}

void ReadStages(const YAML::Node& node, Reader& r, std::vector<StageSpec>* stages) {
  const std::string p = "spec.stages";
  if (node.IsNull()) {
    return;
  }
  if (!node.IsSequence()) {
    r.Error(p, absl::StrCat(Describe(node),
                            " is not a list (write stages: [{seq_len: 1024, steps: 100}])"));
    return;
  }
  if (node.size() > static_cast<size_t>(kMaxStages)) {
    r.errors.push_back(internal::TooManyStages(node.size()));  // Not one error per stage.
    return;
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string ip = absl::StrCat(p, "[", i, "]");
    const YAML::Node item = node[i];
    Entries m;
    StageSpec stage;
    if (item.IsNull()) {
      r.Error(ip, "an empty value is not a stage (write {seq_len: N, steps: S})");
    } else if (r.Entries(item, ip, "spec.stages[]", &m)) {
      r.Int(m, "seq_len", ip, &stage.seq_len);
      r.Int(m, "steps", ip, &stage.steps);
      double lr;
      if (r.Double(m, "lr", ip, &lr)) {
        stage.lr = lr;
      }
      int64_t v;
      if (r.Int(m, "warmup_steps", ip, &v)) {
        stage.warmup_steps = v;
      }
      if (r.Int(m, "sp_degree", ip, &v)) {
        stage.sp_degree = v;
      }
      if (r.Int(m, "dp_degree", ip, &v)) {
        stage.dp_degree = v;
      }
      if (auto ev = m.find("eval"); ev != m.end() && !ev->second.IsNull()) {
        EvalSpec eval;
        ReadEvalMap(ev->second, r, ip + ".eval", "spec.stages[].eval", &eval);
        stage.eval = eval;
      }
    }
    stages->push_back(stage);
  }
}

void ReadCheckpoint(const YAML::Node& node, Reader& r, CheckpointSpec* ckpt) {
  Entries m;
  const std::string p = "spec.checkpoint";
  if (!r.Entries(node, p, p, &m)) {
    return;
  }
  r.String(m, "dir", p, &ckpt->dir);
  if (auto it = m.find("every_steps");
      it != m.end() && it->second.IsScalar() && it->second.Scalar() == "auto") {
    ckpt->every_steps_auto = true;
  } else {
    r.Int(m, "every_steps", p, &ckpt->every_steps);
  }
  r.Int(m, "every_seconds", p, &ckpt->every_seconds);
  r.Int(m, "keep_last", p, &ckpt->keep_last);
  bool async = false;
  if (r.Bool(m, "async", p, &async)) ckpt->async = async;
}

void ReadScheduling(const YAML::Node& node, Reader& r, SchedulingSpec* sched) {
  Entries m;
  const std::string p = "spec.scheduling";
  if (!r.Entries(node, p, p, &m)) {
    return;
  }
  r.Int(m, "priority", p, &sched->priority);
  r.Int(m, "max_failures", p, &sched->max_failures);
  r.Int(m, "max_infra_failures", p, &sched->max_infra_failures);
  r.Int(m, "failure_window_s", p, &sched->failure_window_s);
  r.Bool(m, "preemptible", p, &sched->preemptible);
  r.Int(m, "max_preemptions", p, &sched->max_preemptions);
  r.String(m, "node_label", p, &sched->node_label);
}

void ReadSpec(const YAML::Node& node, Reader& r, JobSpec* spec) {
  Entries m;
  if (!r.Entries(node, "spec", "spec", &m)) {
    return;
  }
  if (m.count("model")) {
    ReadModel(m["model"], r, &spec->model);
  } else {
    r.Error("spec.model", "missing (add model: {preset: tiny} or the shape fields)");
  }
  // Optional sections: read when present, defaults otherwise.
  auto section = [&](const char* key, auto read, auto* out) {
    if (auto it = m.find(key); it != m.end()) read(it->second, r, out);
  };
  section("data", ReadData, &spec->data);
  section("parallelism", ReadParallelism, &spec->parallelism);
  section("memory", ReadMemory, &spec->memory);
  section("optimizer", ReadOptimizer, &spec->optimizer);
  section("stages", ReadStages, &spec->stages);
  section("checkpoint", ReadCheckpoint, &spec->checkpoint);
  section("scheduling", ReadScheduling, &spec->scheduling);
  section("eval", ReadEval, &spec->eval);
  auto seed = m.find("seed");
  if (seed != m.end() && !seed->second.IsNull()) {
    if (!seed->second.IsScalar() || !ParseUint64(seed->second.Scalar(), &spec->seed)) {
      r.Error("spec.seed", absl::StrCat(Describe(seed->second),
                                        " is not a non-negative integer (write e.g. 1234)"));
    }
  }
}

void ReadDocument(const YAML::Node& root, Reader& r, JobSpec* spec) {
  Entries m;
  if (!r.Entries(root, "", "", &m)) {
    return;
  }
  if (!r.String(m, "apiVersion", "", &spec->api_version)) {
    r.Error("apiVersion", absl::StrCat("missing (add apiVersion: ", kApiVersion, ")"));
  } else if (spec->api_version != kApiVersion) {
    r.Error("apiVersion",
            absl::StrCat(Quote(spec->api_version), " is not supported (use ", kApiVersion, ")"));
  }
  if (!r.String(m, "kind", "", &spec->kind)) {
    r.Error("kind", absl::StrCat("missing (add kind: ", kKind, ")"));
  } else if (spec->kind != kKind) {
    r.Error("kind", absl::StrCat(Quote(spec->kind), " is not supported (use ", kKind, ")"));
  }
  if (m.count("metadata")) {
    ReadMetadata(m["metadata"], r, &spec->metadata);
  } else {
    r.Error("metadata", "missing (add metadata: {name: my-job})");
  }
  if (m.count("spec") && !m["spec"].IsNull()) {
    ReadSpec(m["spec"], r, spec);
  } else {
    r.Error("spec", "missing (add spec: with model, data and stages)");
  }
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

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view yaml_text, const ParseOptions& options) {
  if (static_cast<int64_t>(yaml_text.size()) > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "(document): ", yaml_text.size(), " bytes is more than ", kMaxSpecBytes,
        " (a TrainJob is at most 256 KiB; a real one is a few KiB: drop generated content)"));
  }
  absl::StatusOr<JobSpec> spec;
  try {
    const std::string text(yaml_text);
    spec = ParseTree(text, options);
  } catch (const std::exception& e) {
    // yaml-cpp reports misuse (e.g. odd node shapes) by exception; never let one escape.
    return absl::InvalidArgumentError(
        absl::StrCat("(document): cannot be read (", internal::OneLine(e.what()), ")"));
  }
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
