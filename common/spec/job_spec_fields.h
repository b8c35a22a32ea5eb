// The TrainJob field list: every YAML key of a TrainJob document, written once, in document
// order, with how the canonical document shows it. Everything that names spec fields is derived
// from it:
//   - the schema (job_spec_schema.cc: known keys, their kinds, "unknown key" hints, --set paths),
//   - the reader (job_spec_parser.cc: YAML -> JobSpec, one error line per problem),
//   - the canonical tree (job_spec_emit.cc: ToYaml, SpecHash, ToJson for `validate -o json`,
//     AllFieldsJson for `get job -o json`),
//   - field paths in messages and hints (PathOf, below: the validator, the coordinator's path
//     and quota checks, the agent's assignment check, `ulyssesctl plan`).
// The model shape's keys come from their own list (ForEachShapeField, model_shape.h), placed by
// the Shape() element. Validation rules (job_spec_validate.cc) stay hand-written.
//
// Adding a spec field: the member (with its default and doc) in job_spec.h and ONE line here;
// a rule in job_spec_validate.cc if values need checking; docs/JOBSPEC.md. The schema, reader,
// emitter, JSON views and --set follow (tests/common/spec/job_spec_fields_test.cc proves it).
// The order of a list is the document order: ToYaml's key order (hence SpecHash: never reorder
// model, data or optimizer), "valid keys" hints, reading errors.
//
// A section list is a functor `template <class V> void operator()(V& v) const` calling, for a
// section struct S, these elements of `v` in document order:
//   v.Field(key, &S::m, opt)       scalar: int64_t, double, bool, std::string, uint64_t, or
//                                  std::optional of the first three (shown when set);
//   v.Constant(key, &S::m, text)   required string that must equal `text` (apiVersion, kind);
//   v.Pair(key, &S::a, &S::b)      a list of exactly two numbers (betas: [beta1, beta2]);
//   v.IntOrAuto(key, &S::n, &S::a) an integer or the word auto (sets the bool `a`);
//   v.Labels(key, &S::m)           a free-form map of string to string;
//   v.Shape()                      the model shape fields (S is ModelSpec);
//   v.Section(key, &S::m, F{}, opt)  a nested mapping listed by F (`m` may be std::optional:
//                                  present when set); kSelf instead of &S::m nests S itself;
//   v.List(key, &S::m, F{}, list)  a list of mappings listed by F.
#ifndef ULYSSES_COMMON_SPEC_JOB_SPEC_FIELDS_H_
#define ULYSSES_COMMON_SPEC_JOB_SPEC_FIELDS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/spec/job_spec.h"

namespace ulysses::spec::fields {

// When the canonical document (ToYaml, ToJson) shows an element.
enum class Show {
  kAlways,
  // Left out while equal to its default (a section: while all its fields are), so that a spec
  // written before the field existed keeps its text and SpecHash.
  kUnlessDefault,
};

struct Opt {
  Show show = Show::kAlways;
  bool hashed = false;            // spec's elements only: part of SpecHash (training-relevant).
  const char* missing = nullptr;  // Required: "<path>: missing (<missing>)" when absent.
  bool null_is_missing = false;   // With `missing`: an empty value counts as absent.
};
inline constexpr Opt kAlways{};
inline constexpr Opt kUnlessDefault{Show::kUnlessDefault};
inline constexpr Opt kHashed{Show::kAlways, true};

struct ListOpt {
  const char* noun;      // One entry, in messages: "stage".
  const char* fix_list;  // Fix when the value is not a list.
  const char* fix_item;  // Fix when an entry is empty.
};

// Section stands for its own struct (spec: is JobSpec's members, not a member).
struct Self {};
inline constexpr Self kSelf{};

// The struct of a Section element's member (std::optional unwrapped).
template <class T>
struct SectionOf {
  using type = T;
};
template <class T>
struct SectionOf<std::optional<T>> {
  using type = T;
};

struct MetadataFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("name", &Metadata::name, kAlways);
    v.Labels("labels", &Metadata::labels);
  }
};

struct ModelFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("preset", &ModelSpec::preset, kAlways);
    v.Shape();
    v.Field("init_from", &ModelSpec::init_from, kAlways);
    v.Field("dtype", &ModelSpec::dtype, kAlways);
  }
};

struct SyntheticFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("generator", &SyntheticDataSpec::generator, kAlways);
    v.Field("validation_sequences", &SyntheticDataSpec::validation_sequences, kAlways);
  }
};

struct DataFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("train", &DataSpec::train, kUnlessDefault);
    v.Field("validation", &DataSpec::validation, kUnlessDefault);
    v.Section("synthetic", &DataSpec::synthetic, SyntheticFields{}, kAlways);
    v.Field("format", &DataSpec::format, kUnlessDefault);
    v.Field("packing", &DataSpec::packing, kUnlessDefault);
  }
};

struct ParallelismFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("sp_degree", &ParallelismSpec::sp_degree, kAlways);
    v.Field("dp_degree", &ParallelismSpec::dp_degree, kAlways);
    v.Field("zero_stage", &ParallelismSpec::zero_stage, kAlways);
    v.Field("offload_optimizer", &ParallelismSpec::offload_optimizer, kAlways);
    v.Field("offload_activations", &ParallelismSpec::offload_activations, kAlways);
    v.Field("allow_tcp_fabric", &ParallelismSpec::allow_tcp_fabric, kUnlessDefault);
  }
};

struct MemoryFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("activation_checkpointing", &MemorySpec::activation_checkpointing, kAlways);
    v.Field("keep_attention_outputs", &MemorySpec::keep_attention_outputs, kAlways);
    v.Field("tiled_mlp", &MemorySpec::tiled_mlp, kAlways);
    v.Field("tiled_loss", &MemorySpec::tiled_loss, kAlways);
    v.Field("loss_tile_tokens", &MemorySpec::loss_tile_tokens, kAlways);
    v.Field("attention_block_size", &MemorySpec::attention_block_size, kAlways);
  }
};

struct OptimizerFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("type", &OptimizerSpec::type, kAlways);
    v.Field("lr", &OptimizerSpec::lr, kAlways);
    v.Pair("betas", &OptimizerSpec::beta1, &OptimizerSpec::beta2);
    v.Field("weight_decay", &OptimizerSpec::weight_decay, kAlways);
    v.Field("eps", &OptimizerSpec::eps, kAlways);
    v.Field("grad_clip", &OptimizerSpec::grad_clip, kAlways);
    v.Field("warmup_steps", &OptimizerSpec::warmup_steps, kAlways);
    v.Field("schedule", &OptimizerSpec::schedule, kAlways);
    v.Field("min_lr_ratio", &OptimizerSpec::min_lr_ratio, kAlways);
    v.Field("grad_accum_steps", &OptimizerSpec::grad_accum_steps, kAlways);
    v.Field("micro_batch_size", &OptimizerSpec::micro_batch_size, kUnlessDefault);
  }
};

struct EvalFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("max_sequences", &EvalSpec::max_sequences, kAlways);
    v.Field("every_steps", &EvalSpec::every_steps, kAlways);
  }
};

// A stage's rope_scaling: the model's RopeScaling fields (model_shape.h), whole.
struct RopeScalingFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("rope_type", &RopeScaling::rope_type, kAlways);
    v.Field("factor", &RopeScaling::factor, kAlways);
    v.Field("low_freq_factor", &RopeScaling::low_freq_factor, kAlways);
    v.Field("high_freq_factor", &RopeScaling::high_freq_factor, kAlways);
    v.Field("original_max_position_embeddings", &RopeScaling::original_max_position_embeddings,
            kAlways);
  }
};

struct StageRopeFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("rope_theta", &StageRopeSpec::rope_theta, kAlways);
    v.Section("rope_scaling", &StageRopeSpec::rope_scaling, RopeScalingFields{}, kAlways);
  }
};

struct StageFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("seq_len", &StageSpec::seq_len, kAlways);
    v.Field("steps", &StageSpec::steps, kAlways);
    v.Field("lr", &StageSpec::lr, kAlways);
    v.Field("warmup_steps", &StageSpec::warmup_steps, kAlways);
    v.Field("sp_degree", &StageSpec::sp_degree, kAlways);
    v.Field("dp_degree", &StageSpec::dp_degree, kAlways);
    v.Section("eval", &StageSpec::eval, EvalFields{}, kAlways);
    v.Section("rope", &StageSpec::rope, StageRopeFields{}, kUnlessDefault);
  }
};

struct CheckpointFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("dir", &CheckpointSpec::dir, kAlways);
    v.IntOrAuto("every_steps", &CheckpointSpec::every_steps, &CheckpointSpec::every_steps_auto);
    v.Field("every_seconds", &CheckpointSpec::every_seconds, kUnlessDefault);
    v.Field("keep_last", &CheckpointSpec::keep_last, kAlways);
    v.Field("async", &CheckpointSpec::async, kAlways);
    v.Field("adopt", &CheckpointSpec::adopt, kUnlessDefault);
  }
};

struct SchedulingFields {
  template <class V>
  void operator()(V& v) const {
    v.Field("priority", &SchedulingSpec::priority, kAlways);
    v.Field("max_failures", &SchedulingSpec::max_failures, kAlways);
    v.Field("max_preemptions", &SchedulingSpec::max_preemptions, kAlways);
    v.Field("node_label", &SchedulingSpec::node_label, kAlways);
    v.Field("max_infra_failures", &SchedulingSpec::max_infra_failures, kUnlessDefault);
    v.Field("failure_window_s", &SchedulingSpec::failure_window_s, kUnlessDefault);
    v.Field("preemptible", &SchedulingSpec::preemptible, kUnlessDefault);
  }
};

// spec: (the JobSpec's own members).
struct SpecFields {
  template <class V>
  void operator()(V& v) const {
    v.Section("model", &JobSpec::model, ModelFields{},
              Opt{Show::kAlways, true, "add model: {preset: tiny} or the shape fields"});
    v.Section("data", &JobSpec::data, DataFields{}, kHashed);
    v.Section("parallelism", &JobSpec::parallelism, ParallelismFields{}, kAlways);
    v.Section("memory", &JobSpec::memory, MemoryFields{}, kAlways);
    v.Section("optimizer", &JobSpec::optimizer, OptimizerFields{}, kHashed);
    v.List("stages", &JobSpec::stages, StageFields{},
           ListOpt{"stage", "write stages: [{seq_len: 1024, steps: 100}]",
                   "write {seq_len: N, steps: S}"});
    v.Section("checkpoint", &JobSpec::checkpoint, CheckpointFields{}, kAlways);
    v.Section("scheduling", &JobSpec::scheduling, SchedulingFields{}, kAlways);
    v.Section("eval", &JobSpec::eval, EvalFields{}, kUnlessDefault);
    v.Field("seed", &JobSpec::seed, kHashed);
  }
};

// The whole document.
struct DocumentFields {
  template <class V>
  void operator()(V& v) const {
    v.Constant("apiVersion", &JobSpec::api_version, kApiVersion);
    v.Constant("kind", &JobSpec::kind, kKind);
    v.Section("metadata", &JobSpec::metadata, MetadataFields{},
              Opt{Show::kAlways, false, "add metadata: {name: my-job}"});
    v.Section("spec", kSelf, SpecFields{},
              Opt{Show::kAlways, false, "add spec: with model, data and stages", true});
  }
};

// Finds the path of a field given by member pointer (PathOf, below).
template <class Target, class T, class S>
class PathFinder {
 public:
  PathFinder(T Target::*target, std::string path, std::string* found)
      : target_(target), path_(std::move(path)), found_(found) {}

  template <class M>
  void Field(const char* key, M S::*member, Opt) {
    Match(key, member);
  }
  void Constant(const char* key, std::string S::*member, const char*) { Match(key, member); }
  void Pair(const char* key, double S::*first, double S::*second) {
    Match(key, first);
    Match(key, second);
  }
  void IntOrAuto(const char* key, int64_t S::*value, bool S::*is_auto) {
    Match(key, value);
    Match(key, is_auto);
  }
  void Labels(const char* key, std::map<std::string, std::string> S::*member) {
    Match(key, member);
  }
  void Shape() {}
  template <class M, class F>
  void Section(const char* key, M S::*member, F list, Opt) {
    Match(key, member);
    PathFinder<Target, T, typename SectionOf<M>::type> child(target_, Join(key), found_);
    list(child);
  }
  template <class F>
  void Section(const char* key, Self, F list, Opt) {
    PathFinder<Target, T, S> child(target_, Join(key), found_);
    list(child);
  }
  template <class E, class F>
  void List(const char* key, std::vector<E> S::*member, F list, ListOpt) {
    Match(key, member);
    PathFinder<Target, T, E> child(target_, Join(key) + "[]", found_);
    list(child);
  }

 private:
  std::string Join(const char* key) const {
    return path_.empty() ? std::string(key) : path_ + "." + key;
  }
  template <class M>
  void Match(const char* key, M S::*member) {
    if constexpr (std::is_same_v<S, Target> && std::is_same_v<M, T>) {
      if (member == target_ && found_->empty()) {
        *found_ = Join(key);
      }
    }
  }

  T Target::*target_;
  std::string path_;
  std::string* found_;
};

// The document path of a listed field or section, as --set and error messages write it:
// PathOf(&MemorySpec::tiled_mlp) is "spec.memory.tiled_mlp"; a field of a list entry takes
// `index` (PathOf(&StageSpec::sp_degree, 2) is "spec.stages[2].sp_degree"). A section type used
// twice (EvalSpec) gives its first place in document order. "" for a member the list does not name.
template <class S, class T>
std::string PathOf(T S::*member, size_t index = 0) {
  std::string found;
  PathFinder<S, T, JobSpec> finder(member, "", &found);
  DocumentFields{}(finder);
  const size_t list = found.find("[]");
  if (list != std::string::npos) {
    found.replace(list, 2, "[" + std::to_string(index) + "]");
  }
  return found;
}

// The document path of a model shape field, a key of ForEachShapeField (model_shape.h; the shape
// is listed there, not here): ShapePathOf("vocab_size") is "spec.model.vocab_size".
inline std::string ShapePathOf(const std::string& key) {
  return PathOf(&JobSpec::model) + "." + key;
}

}  // namespace ulysses::spec::fields

#endif  // ULYSSES_COMMON_SPEC_JOB_SPEC_FIELDS_H_
