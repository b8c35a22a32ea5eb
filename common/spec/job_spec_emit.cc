// ToYaml (canonical, fully defaulted YAML) and SpecHash (FNV-1a 64 of the
// canonical YAML of the training-relevant sections).
#include <cinttypes>
#include <cstdio>
#include <string>

#include "common/spec/job_spec_parser.h"
#include "common/spec/spec_util.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::spec {
namespace {

using internal::FormatDouble;

void EmitValue(YAML::Emitter& out, int64_t v) { out << v; }
void EmitValue(YAML::Emitter& out, double v) { out << FormatDouble(v); }
void EmitValue(YAML::Emitter& out, bool v) { out << v; }
void EmitValue(YAML::Emitter& out, const std::string& v) { out << v; }

void EmitModel(YAML::Emitter& out, const ModelSpec& m) {
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "preset" << YAML::Value << m.preset;
  std::string group;  // The nested mapping open now ("rope_scaling"), or "".
  ForEachShapeField(m, [&](const std::string& key, const auto& value) {
    if (!ShapeFieldShown(m, key)) {
      return;
    }
    const size_t dot = key.find('.');
    const std::string key_group = dot == std::string::npos ? "" : key.substr(0, dot);
    if (key_group != group) {
      if (!group.empty()) {
        out << YAML::EndMap;
      }
      if (!key_group.empty()) {
        out << YAML::Key << key_group << YAML::Value << YAML::BeginMap;
      }
      group = key_group;
    }
    out << YAML::Key << (dot == std::string::npos ? key : key.substr(dot + 1)) << YAML::Value;
    EmitValue(out, value);
  });
  if (!group.empty()) {
    out << YAML::EndMap;
  }
  out << YAML::Key << "init_from" << YAML::Value << m.init_from;
  out << YAML::Key << "dtype" << YAML::Value << m.dtype;
  out << YAML::EndMap;
}

void EmitData(YAML::Emitter& out, const DataSpec& d) {
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  if (!d.train.empty()) {
    out << YAML::Key << "train" << YAML::Value << d.train;
  }
  if (!d.validation.empty()) {
    out << YAML::Key << "validation" << YAML::Value << d.validation;
  }
  if (d.synthetic) {
    out << YAML::Key << "synthetic" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "generator" << YAML::Value << d.synthetic->generator;
    out << YAML::Key << "validation_sequences" << YAML::Value << d.synthetic->validation_sequences;
    out << YAML::EndMap;
  }
  // Emitted only when set, so the hash of a spec without them is unchanged.
  if (d.format != "flat") {
    out << YAML::Key << "format" << YAML::Value << d.format;
  }
  if (!d.packing) {
    out << YAML::Key << "packing" << YAML::Value << d.packing;
  }
  out << YAML::EndMap;
}

void EmitParallelismAndMemory(YAML::Emitter& out, const JobSpec& s) {
  const ParallelismSpec& p = s.parallelism;
  out << YAML::Key << "parallelism" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "sp_degree" << YAML::Value << p.sp_degree;
  out << YAML::Key << "dp_degree" << YAML::Value << p.dp_degree;
  out << YAML::Key << "zero_stage" << YAML::Value << p.zero_stage;
  out << YAML::Key << "offload_optimizer" << YAML::Value << p.offload_optimizer;
  out << YAML::Key << "offload_activations" << YAML::Value << p.offload_activations;
  out << YAML::EndMap;
  const MemorySpec& m = s.memory;
  out << YAML::Key << "memory" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "activation_checkpointing" << YAML::Value << m.activation_checkpointing;
  out << YAML::Key << "tiled_mlp" << YAML::Value << m.tiled_mlp;
  out << YAML::Key << "tiled_loss" << YAML::Value << m.tiled_loss;
  out << YAML::Key << "loss_tile_tokens" << YAML::Value << m.loss_tile_tokens;
  out << YAML::Key << "attention_block_size" << YAML::Value << m.attention_block_size;
  out << YAML::EndMap;
}

void EmitOptimizer(YAML::Emitter& out, const OptimizerSpec& o) {
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value << o.type;
  out << YAML::Key << "lr" << YAML::Value << FormatDouble(o.lr);
  out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
      << FormatDouble(o.beta1) << FormatDouble(o.beta2) << YAML::EndSeq;
  out << YAML::Key << "weight_decay" << YAML::Value << FormatDouble(o.weight_decay);
  out << YAML::Key << "eps" << YAML::Value << FormatDouble(o.eps);
  out << YAML::Key << "grad_clip" << YAML::Value << FormatDouble(o.grad_clip);
  out << YAML::Key << "warmup_steps" << YAML::Value << o.warmup_steps;
  out << YAML::Key << "schedule" << YAML::Value << o.schedule;
  out << YAML::Key << "min_lr_ratio" << YAML::Value << FormatDouble(o.min_lr_ratio);
  out << YAML::Key << "grad_accum_steps" << YAML::Value << o.grad_accum_steps;
  if (o.micro_batch_size != 1) {  // only when set: the hash of older specs is unchanged
    out << YAML::Key << "micro_batch_size" << YAML::Value << o.micro_batch_size;
  }
  out << YAML::EndMap;
}

void EmitStages(YAML::Emitter& out, const std::vector<StageSpec>& stages) {
  out << YAML::Key << "stages" << YAML::Value << YAML::BeginSeq;
  for (const StageSpec& st : stages) {
    out << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "seq_len" << YAML::Value << st.seq_len;
    out << YAML::Key << "steps" << YAML::Value << st.steps;
    if (st.lr) {
      out << YAML::Key << "lr" << YAML::Value << FormatDouble(*st.lr);
    }
    if (st.warmup_steps) {
      out << YAML::Key << "warmup_steps" << YAML::Value << *st.warmup_steps;
    }
    if (st.sp_degree) {
      out << YAML::Key << "sp_degree" << YAML::Value << *st.sp_degree;
    }
    if (st.dp_degree) {
      out << YAML::Key << "dp_degree" << YAML::Value << *st.dp_degree;
    }
    if (st.eval) {
      out << YAML::Key << "eval" << YAML::Value << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "max_sequences" << YAML::Value << st.eval->max_sequences;
      out << YAML::Key << "every_steps" << YAML::Value << st.eval->every_steps;
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

void EmitCheckpointAndScheduling(YAML::Emitter& out, const JobSpec& s) {
  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "dir" << YAML::Value << s.checkpoint.dir;
  if (s.checkpoint.every_steps_auto) {
    out << YAML::Key << "every_steps" << YAML::Value << "auto";
  } else {
    out << YAML::Key << "every_steps" << YAML::Value << s.checkpoint.every_steps;
  }
  if (s.checkpoint.every_seconds != 0) {
    out << YAML::Key << "every_seconds" << YAML::Value << s.checkpoint.every_seconds;
  }
  out << YAML::Key << "keep_last" << YAML::Value << s.checkpoint.keep_last;
  if (s.checkpoint.async.has_value()) {
    out << YAML::Key << "async" << YAML::Value << *s.checkpoint.async;
  }
  out << YAML::EndMap;
  out << YAML::Key << "scheduling" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "priority" << YAML::Value << s.scheduling.priority;
  out << YAML::Key << "max_failures" << YAML::Value << s.scheduling.max_failures;
  out << YAML::Key << "max_preemptions" << YAML::Value << s.scheduling.max_preemptions;
  out << YAML::Key << "node_label" << YAML::Value << s.scheduling.node_label;
  // Printed only when not at their defaults: specs written before they existed read back
  // byte-identical.
  const SchedulingSpec defaults;
  if (s.scheduling.max_infra_failures != defaults.max_infra_failures) {
    out << YAML::Key << "max_infra_failures" << YAML::Value << s.scheduling.max_infra_failures;
  }
  if (s.scheduling.failure_window_s != defaults.failure_window_s) {
    out << YAML::Key << "failure_window_s" << YAML::Value << s.scheduling.failure_window_s;
  }
  if (s.scheduling.preemptible != defaults.preemptible) {
    out << YAML::Key << "preemptible" << YAML::Value << s.scheduling.preemptible;
  }
  out << YAML::EndMap;
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

std::string ToYaml(const JobSpec& s) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "apiVersion" << YAML::Value << s.api_version;
  out << YAML::Key << "kind" << YAML::Value << s.kind;
  out << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << s.metadata.name;
  out << YAML::Key << "labels" << YAML::Value << YAML::BeginMap;
  for (const auto& [key, value] : s.metadata.labels) {
    out << YAML::Key << key << YAML::Value << value;
  }
  out << YAML::EndMap << YAML::EndMap;
  out << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  EmitModel(out, s.model);
  EmitData(out, s.data);
  EmitParallelismAndMemory(out, s);
  EmitOptimizer(out, s.optimizer);
  EmitStages(out, s.stages);
  EmitCheckpointAndScheduling(out, s);
  if (s.eval.max_sequences != 0 || s.eval.every_steps != 0) {
    out << YAML::Key << "eval" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "max_sequences" << YAML::Value << s.eval.max_sequences;
    out << YAML::Key << "every_steps" << YAML::Value << s.eval.every_steps;
    out << YAML::EndMap;
  }
  out << YAML::Key << "seed" << YAML::Value << s.seed;
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string SpecHash(const JobSpec& s) {
  // The preset name is left out: the expanded shape fields already say what it meant.
  ModelSpec model = s.model;
  model.preset.clear();
  // How a step's batch is cut (micro_batch_size x grad_accum_steps x dp, like sp) is layout,
  // not training: a checkpoint resumes under another cut, and the data cursor it stores keeps
  // the sequence stream exact (docs/DATA.md). Hashed as 1 and 1, so the hash of a spec written
  // before this rule with grad_accum_steps 1 is unchanged.
  OptimizerSpec optimizer = s.optimizer;
  optimizer.grad_accum_steps = 1;
  optimizer.micro_batch_size = 1;
  YAML::Emitter out;
  out << YAML::BeginMap;
  EmitModel(out, model);
  EmitData(out, s.data);
  EmitOptimizer(out, optimizer);
  out << YAML::Key << "seed" << YAML::Value << s.seed;
  out << YAML::EndMap;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, Fnv1a64(out.c_str()));
  return hex;
}

}  // namespace ulysses::spec
