// The canonical tree of a JobSpec, derived from the field list (job_spec_fields.h): ToJson,
// ToYaml (canonical, fully defaulted YAML) and SpecHash (FNV-1a 64 of the canonical YAML of
// the training-relevant sections).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/spec_util.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::spec {
namespace {

using internal::FormatDouble;
using json = nlohmann::ordered_json;

// One default-constructed section per type (kUnlessDefault compares with it).
template <class S>
const S& Defaults() {
  static const S* defaults = new S();
  return *defaults;
}

// Builds the canonical tree of one section (listed by job_spec_fields.h) into `out`, an
// object. Doubles stay doubles (ToYaml prints them with FormatDouble).
template <class S>
class TreeBuilder {
 public:
  // `hashed_only`: only the elements marked hashed (SpecHash). `all`: kUnlessDefault elements
  // too (a view of every field).
  TreeBuilder(const S& obj, json& out, bool hashed_only = false, bool all = false)
      : obj_(obj), out_(out), hashed_only_(hashed_only), all_(all) {}

  template <class T>
  void Field(const char* key, T S::*member, fields::Opt opt) {
    const bool hidden_default =
        opt.show == fields::Show::kUnlessDefault && obj_.*member == Defaults<S>().*member;
    if (Shown(opt) && (all_ || !hidden_default)) {
      Put(key, obj_.*member);
    }
  }
  // The elements below carry no options: never hashed, always shown.
  void Constant(const char* key, std::string S::*member, const char*) {
    if (!hashed_only_) {
      out_[key] = obj_.*member;
    }
  }
  void Pair(const char* key, double S::*first, double S::*second) {
    if (!hashed_only_) {
      out_[key] = json::array({obj_.*first, obj_.*second});
    }
  }
  void IntOrAuto(const char* key, int64_t S::*value, bool S::*is_auto) {
    if (hashed_only_) {
      return;
    }
    if (obj_.*is_auto) {
      out_[key] = "auto";
    } else {
      out_[key] = obj_.*value;
    }
  }
  void Labels(const char* key, std::map<std::string, std::string> S::*member) {
    if (hashed_only_) {
      return;
    }
    json labels = json::object();
    for (const auto& [name, value] : obj_.*member) {
      labels[name] = value;
    }
    out_[key] = labels;
  }
  void Shape() {
    if (hashed_only_) {
      return;
    }
    const ModelSpec& model = obj_;
    ForEachShapeField(model, [&](const std::string& key, const auto& value) {
      if (ShapeFieldShown(model, key)) {  // "rope_scaling.factor" nests under rope_scaling
        std::string pointer = "/" + key;
        std::replace(pointer.begin(), pointer.end(), '.', '/');
        out_[json::json_pointer(pointer)] = value;
      }
    });
  }
  template <class M, class F>
  void Section(const char* key, M S::*member, F list, fields::Opt opt) {
    SectionAt(key, obj_.*member, Defaults<S>().*member, list, opt);
  }
  template <class F>
  void Section(const char* key, fields::Self, F list, fields::Opt opt) {
    SectionAt(key, obj_, Defaults<S>(), list, opt);
  }
  template <class T, class F>
  void List(const char* key, std::vector<T> S::*member, F list, fields::ListOpt) {
    if (!hashed_only_) {
      json items = json::array();
      for (const T& item : obj_.*member) {
        items.push_back(Build(item, list, false, all_));
      }
      out_[key] = items;
    }
  }

  template <class T, class F>
  static json Build(const T& obj, F list, bool hashed_only = false, bool all = false) {
    json out = json::object();
    TreeBuilder<T> builder(obj, out, hashed_only, all);
    list(builder);
    return out;
  }

 private:
  bool Shown(fields::Opt opt) const { return !hashed_only_ || opt.hashed; }

  template <class T>
  void Put(const char* key, const T& value) {
    out_[key] = value;
  }
  template <class T>
  void Put(const char* key, const std::optional<T>& value) {
    if (value.has_value()) {
      out_[key] = *value;
    }
  }

  template <class T, class F>
  void SectionAt(const char* key, const T& target, const T& defaults, F list, fields::Opt opt) {
    if (Shown(opt)) {
      SectionValue(key, target, defaults, list, opt);
    }
  }
  template <class T, class F>
  void SectionValue(const char* key, const std::optional<T>& target, const std::optional<T>&,
                    F list, fields::Opt) {
    if (target.has_value()) {
      out_[key] = Build(*target, list, false, all_);
    }
  }
  template <class T, class F>
  void SectionValue(const char* key, const T& target, const T& defaults, F list, fields::Opt opt) {
    json tree = Build(target, list, false, all_);
    if (!all_ && opt.show == fields::Show::kUnlessDefault && tree == Build(defaults, list)) {
      return;
    }
    out_[key] = std::move(tree);
  }

  const S& obj_;
  json& out_;
  bool hashed_only_;
  bool all_;
};

// Block style, except lists of scalars ([0.9, 0.95]) and the mappings inside lists (one
// stage per line), which are flow style.
void EmitTree(YAML::Emitter& out, const json& value, bool flow) {
  if (value.is_object()) {
    if (flow) {
      out << YAML::Flow;
    }
    out << YAML::BeginMap;
    for (auto it = value.begin(); it != value.end(); ++it) {
      out << YAML::Key << it.key() << YAML::Value;
      EmitTree(out, it.value(), flow);
    }
    out << YAML::EndMap;
  } else if (value.is_array()) {
    const bool scalars =
        !value.empty() && std::none_of(value.begin(), value.end(),
                                       [](const json& item) { return item.is_structured(); });
    if (flow || scalars) {
      out << YAML::Flow;
    }
    out << YAML::BeginSeq;
    for (const json& item : value) {
      EmitTree(out, item, true);
    }
    out << YAML::EndSeq;
  } else if (value.is_string()) {
    out << value.get<std::string>();
  } else if (value.is_boolean()) {
    out << value.get<bool>();
  } else if (value.is_number_unsigned()) {
    out << value.get<uint64_t>();
  } else if (value.is_number_integer()) {
    out << value.get<int64_t>();
  } else if (value.is_number_float()) {
    out << FormatDouble(value.get<double>());
  } else {
    out << YAML::Null;
  }
}

std::string EmitYaml(const json& tree) {
  YAML::Emitter out;
  EmitTree(out, tree, false);
  return out.c_str();
}

uint64_t Fnv1a64(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace

nlohmann::ordered_json ToJson(const JobSpec& s) {
  return TreeBuilder<JobSpec>::Build(s, fields::DocumentFields{});
}

nlohmann::ordered_json AllFieldsJson(const DataSpec& data) {
  return TreeBuilder<DataSpec>::Build(data, fields::DataFields{}, false, /*all=*/true);
}

nlohmann::ordered_json AllFieldsJson(const EvalSpec& eval) {
  return TreeBuilder<EvalSpec>::Build(eval, fields::EvalFields{}, false, /*all=*/true);
}

std::string ToYaml(const JobSpec& s) { return EmitYaml(ToJson(s)) + "\n"; }

std::string SpecHash(const JobSpec& s) {
  // The preset name is left out: the expanded shape fields already say what it meant.
  JobSpec hashed = s;
  hashed.model.preset.clear();
  // How a step's batch is cut (micro_batch_size x grad_accum_steps x dp, like sp) is layout,
  // not training: a checkpoint resumes under another cut, and the data cursor it stores keeps
  // the sequence stream exact (docs/DATA.md). Hashed as 1 and 1, so the hash of a spec written
  // before this rule with grad_accum_steps 1 is unchanged.
  hashed.optimizer.grad_accum_steps = 1;
  hashed.optimizer.micro_batch_size = 1;
  // The spec: section's training-relevant elements (marked hashed in job_spec_fields.h).
  const std::string text =
      EmitYaml(TreeBuilder<JobSpec>::Build(hashed, fields::SpecFields{}, /*hashed_only=*/true));
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, Fnv1a64(text));
  return hex;
}

}  // namespace ulysses::spec
