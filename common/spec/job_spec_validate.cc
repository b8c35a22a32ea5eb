// ValidateJobSpec: every rule of docs/JOBSPEC.md, all errors collected, each line
// `<path>: <value> <problem> (<fix>)`. Paths come from the field list (fields::PathOf).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/needle_limits.h"
#include "common/spec/spec_util.h"

namespace ulysses::spec {
namespace {

using fields::PathOf;
using internal::FormatDouble;
using internal::Quote;

// `prefix`.<key of member>: a field of a section listed in several places (EvalSpec).
template <class S, class T>
std::string At(const std::string& prefix, T S::*member) {
  const std::string path = PathOf(member);
  return prefix + path.substr(path.rfind('.'));
}

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
// Ten years: a larger interval is a typo (and keeps the seconds exact in a double).
constexpr int64_t kMaxCheckpointSeconds = int64_t{10} * 365 * 86400;

class Errors {
 public:
  void Add(const std::string& path, const std::string& value, const std::string& problem,
           const std::string& fix) {
    lines_.push_back(absl::StrCat(path, ": ", value, " ", problem, " (", fix, ")"));
  }
  void AddLine(const std::string& line) { lines_.push_back(line); }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
};

bool IsDns1123Label(const std::string& name) {
  if (name.empty() || name.size() > 63) {
    return false;
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
      return false;
    }
  }
  return name.front() != '-' && name.back() != '-';
}

bool OneOf(const std::string& value, const std::vector<std::string>& choices) {
  for (const std::string& c : choices) {
    if (value == c) {
      return true;
    }
  }
  return false;
}

void CheckChoice(Errors& e, const std::string& path, const std::string& value,
                 const std::vector<std::string>& choices, const std::string& what) {
  if (!OneOf(value, choices)) {
    e.Add(path, Quote(value), absl::StrCat("is not a supported ", what),
          absl::StrCat("use ", internal::JoinChoices(choices)));
  }
}

void CheckPositive(Errors& e, const std::string& path, int64_t value, const std::string& fix) {
  if (value <= 0) {
    e.Add(path, absl::StrCat(value), "must be > 0", fix);
  }
}

void CheckMetadata(const JobSpec& s, Errors& e) {
  if (s.api_version != kApiVersion) {
    e.Add("apiVersion", Quote(s.api_version), "is not supported",
          absl::StrCat("use ", kApiVersion));
  }
  if (s.kind != kKind) {
    e.Add("kind", Quote(s.kind), "is not supported", absl::StrCat("use ", kKind));
  }
  if (s.metadata.name.empty()) {
    e.Add(PathOf(&Metadata::name), "''", "is missing", "set a DNS-1123 name, e.g. name: tiny-demo");
  } else if (!IsDns1123Label(s.metadata.name)) {
    e.Add(PathOf(&Metadata::name), Quote(s.metadata.name), "is not a DNS-1123 label",
          "use at most 63 lowercase letters, digits and '-', starting and ending with a letter "
          "or digit, e.g. tiny-demo");
  }
  // Labels are shown in terminals and logs: no control characters (NUL, ESC, newlines).
  for (const auto& [key, value] : s.metadata.labels) {
    for (const std::string* text : {&key, &value}) {
      const bool control = std::any_of(text->begin(), text->end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
      });
      if (control) {
        e.Add(absl::StrCat(PathOf(&Metadata::labels), ".", absl::CEscape(key)),
              Quote(absl::CEscape(*text)), "has a control character",
              "use printable text in label keys and values");
        break;
      }
    }
  }
}

void CheckModel(const JobSpec& s, Errors& e) {
  const ModelSpec& m = s.model;
  const std::string fix =
      m.init_from.empty()
          ? absl::StrCat("set it, or use a preset: ", internal::JoinChoices(ModelPresetNames()))
          : "set it > 0, or leave it out to read it from init_from";
  for (const std::string& line : ModelShapeErrors(m, fix)) {
    e.AddLine(line);
  }
  if (m.init_from.empty()) {
    for (const std::string& key : m.from_init) {
      e.Add(absl::StrCat(PathOf(&JobSpec::model), ".", key), "(unset)",
            "is left to init_from, but init_from is empty", "set the field, or set init_from");
    }
  }
  // A sliding window the engine can honour: no stage longer than it (then every token's window
  // holds its whole causal prefix, which is what the engine computes).
  if (m.from_init.count("sliding_window") == 0 && m.sliding_window > 0) {
    std::vector<int64_t> lengths;
    for (const StageSpec& stage : s.stages) lengths.push_back(stage.seq_len);
    absl::Status window = CheckSlidingWindow(m.sliding_window, lengths, "");
    if (!window.ok()) e.AddLine(std::string(window.message()));
  }
  std::vector<std::string> weight_dtypes;  // common/dtype.h
  for (const DtypeInfo& d : kDtypes) {
    if (d.weight) weight_dtypes.emplace_back(d.name);
  }
  CheckChoice(e, PathOf(&ModelSpec::dtype), m.dtype, weight_dtypes, "dtype");
}

// sp_degree at `path` against the head counts (skipped when heads are unknown or
// invalid: CheckModel reports those).
void CheckSpAgainstHeads(const JobSpec& s, const std::string& path, int64_t sp, Errors& e) {
  const int64_t hq = s.model.num_attention_heads;
  const int64_t hkv = s.model.num_key_value_heads;
  if (sp < 1 || hq <= 0 || hkv <= 0 || hq % hkv != 0 ||
      s.model.from_init.count("num_attention_heads") != 0 ||
      s.model.from_init.count("num_key_value_heads") != 0) {
    return;
  }
  absl::Status heads = CheckUlyssesHeads(hq, hkv, sp, path);
  if (!heads.ok()) {
    e.AddLine(std::string(heads.message()));
  }
}

void CheckDegree(Errors& e, const std::string& path, int64_t value, const char* what) {
  if (value < 1) {
    e.Add(path, absl::StrCat(value), "must be >= 1", absl::StrCat("use 1 for no ", what));
  }
}

void CheckParallelism(const JobSpec& s, Errors& e) {
  const ParallelismSpec& p = s.parallelism;
  CheckDegree(e, PathOf(&ParallelismSpec::sp_degree), p.sp_degree, "sequence parallelism");
  CheckDegree(e, PathOf(&ParallelismSpec::dp_degree), p.dp_degree, "data parallelism");
  CheckSpAgainstHeads(s, PathOf(&ParallelismSpec::sp_degree), p.sp_degree, e);
  if (p.zero_stage < 0 || p.zero_stage > 3) {
    e.Add(PathOf(&ParallelismSpec::zero_stage), absl::StrCat(p.zero_stage), "is out of range 0..3",
          "use 0 (replicated), 1 (optimizer state sharded), 2 (+ gradients) or 3 (+ parameters)");
  } else if (p.zero_stage == 3 && !s.memory.activation_checkpointing) {
    e.Add(PathOf(&ParallelismSpec::zero_stage), "3",
          "needs memory.activation_checkpointing (ZeRO-3 re-gathers each layer's weights in "
          "backward by recomputing the layer)",
          "set memory.activation_checkpointing: true, or use zero_stage 2");
  }
  if (p.offload_optimizer && p.zero_stage < 1) {
    e.Add(PathOf(&ParallelismSpec::offload_optimizer), "true",
          "needs zero_stage >= 1 (the host-side update runs on the ZeRO optimizer shards)",
          "set parallelism.zero_stage: 1 (or higher), or offload_optimizer: false");
  }
  if (p.offload_activations && !s.memory.activation_checkpointing) {
    e.Add(PathOf(&ParallelismSpec::offload_activations), "true",
          "needs memory.activation_checkpointing (what is offloaded is each checkpointed layer's "
          "saved input)",
          "set memory.activation_checkpointing: true, or offload_activations: false");
  }
}

void CheckMemory(const JobSpec& s, Errors& e) {
  if (s.memory.keep_attention_outputs && !s.memory.activation_checkpointing) {
    e.Add(PathOf(&MemorySpec::keep_attention_outputs), "true",
          "needs memory.activation_checkpointing (it keeps the attention outputs that "
          "checkpointing would recompute; without checkpointing every activation is kept anyway)",
          "set memory.activation_checkpointing: true, or keep_attention_outputs: false");
  }
  CheckPositive(e, PathOf(&MemorySpec::loss_tile_tokens), s.memory.loss_tile_tokens,
                "use e.g. 4096");
  CheckPositive(e, PathOf(&MemorySpec::attention_block_size), s.memory.attention_block_size,
                "use e.g. 512");
}

void CheckOptimizer(const JobSpec& s, Errors& e) {
  const OptimizerSpec& o = s.optimizer;
  CheckChoice(e, PathOf(&OptimizerSpec::type), o.type, {"adamw"}, "optimizer");
  if (o.lr <= 0) {
    e.Add(PathOf(&OptimizerSpec::lr), FormatDouble(o.lr), "must be > 0", "use e.g. 3.0e-4");
  }
  const std::pair<std::string, double> betas[] = {
      {absl::StrCat(PathOf(&OptimizerSpec::beta1), "[0]"), o.beta1},
      {absl::StrCat(PathOf(&OptimizerSpec::beta2), "[1]"), o.beta2}};
  for (const auto& [path, beta] : betas) {
    if (beta < 0 || beta >= 1) {
      e.Add(path, FormatDouble(beta), "is outside [0, 1)", "use e.g. betas: [0.9, 0.95]");
    }
  }
  if (o.weight_decay < 0) {
    e.Add(PathOf(&OptimizerSpec::weight_decay), FormatDouble(o.weight_decay), "must be >= 0",
          "use e.g. 0.1, or 0 for none");
  }
  if (o.eps <= 0) {
    e.Add(PathOf(&OptimizerSpec::eps), FormatDouble(o.eps), "must be > 0", "use 1e-8");
  }
  if (o.grad_clip < 0) {
    e.Add(PathOf(&OptimizerSpec::grad_clip), FormatDouble(o.grad_clip), "must be >= 0",
          "use e.g. 1.0, or 0 to disable clipping");
  }
  if (o.warmup_steps < 0) {
    e.Add(PathOf(&OptimizerSpec::warmup_steps), absl::StrCat(o.warmup_steps), "must be >= 0",
          "use 0 for no warmup");
  }
  CheckChoice(e, PathOf(&OptimizerSpec::schedule), o.schedule, {"constant", "linear", "cosine"},
              "schedule");
  if (o.min_lr_ratio < 0 || o.min_lr_ratio > 1) {
    e.Add(PathOf(&OptimizerSpec::min_lr_ratio), FormatDouble(o.min_lr_ratio), "is outside [0, 1]",
          "use e.g. 0.1");
  }
  if (o.grad_accum_steps < 1) {
    e.Add(PathOf(&OptimizerSpec::grad_accum_steps), absl::StrCat(o.grad_accum_steps),
          "must be >= 1", "use 1 for no accumulation");
  }
  if (o.micro_batch_size < 1 || o.micro_batch_size > 4096) {
    e.Add(PathOf(&OptimizerSpec::micro_batch_size), absl::StrCat(o.micro_batch_size),
          "is outside 1..4096", "use 1, or a few sequences per micro-batch");
  }
}

void CheckEval(const std::string& p, const EvalSpec& ev, Errors& e) {
  if (ev.max_sequences < 0) {
    e.Add(At(p, &EvalSpec::max_sequences), absl::StrCat(ev.max_sequences), "must be >= 0",
          "use 0 for the whole validation set, or a bound such as 64");
  }
  if (ev.every_steps < 0) {
    e.Add(At(p, &EvalSpec::every_steps), absl::StrCat(ev.every_steps), "must be >= 0",
          "use 0 to evaluate at stage ends only");
  }
}

// Nearest multiples of the sequence unit around `seq_len`: the unit keeps N/P a
// multiple of 1024 when the sequence is long enough, else it is P itself.
std::string SeqLenSuggestion(int64_t seq_len, int64_t sp) {
  const int64_t unit = sp <= INT64_MAX / 1024 && seq_len >= sp * 1024 ? sp * 1024 : sp;
  return internal::NearestMultiples(seq_len, unit);
}

constexpr int64_t kMaxSeqLen = int64_t{1} << 30;
constexpr int64_t kMaxSteps = 1000000000;

// stages[i].rope: a positive rope_theta, and a rope_scaling the engine implements with the
// numbers its type needs (the model's own rope_scaling rules, model_shape.h RopeScaling).
void CheckStageRope(const StageRopeSpec& rope, size_t i, Errors& e) {
  if (rope.rope_theta && !(std::isfinite(*rope.rope_theta) && *rope.rope_theta > 0)) {
    e.Add(PathOf(&StageRopeSpec::rope_theta, i), FormatDouble(*rope.rope_theta), "must be > 0",
          "use the base this stage trains with, e.g. 8000000.0 for a 4x longer context than a "
          "500000.0 base");
  }
  if (!rope.rope_scaling) return;
  const RopeScaling& r = *rope.rope_scaling;
  if (r.rope_type == kRopeNone) {
    if (r.factor != 0 || r.low_freq_factor != 0 || r.high_freq_factor != 0 ||
        r.original_max_position_embeddings != 0) {
      e.Add(PathOf(&RopeScaling::rope_type, i), Quote(r.rope_type),
            "takes no factors, but some are set", "set rope_type: llama3, or remove the factors");
    }
    return;
  }
  if (r.rope_type != kRopeLlama3 && r.rope_type != kRopeLinear) {
    e.Add(PathOf(&RopeScaling::rope_type, i), Quote(r.rope_type), "is not supported",
          "use none, llama3 or linear");
    return;
  }
  if (!(std::isfinite(r.factor) && r.factor >= 1)) {
    e.Add(PathOf(&RopeScaling::factor, i), FormatDouble(r.factor), "must be >= 1",
          "use e.g. 8 (Llama 3.1)");
  }
  if (r.rope_type == kRopeLinear) {
    if (r.low_freq_factor != 0 || r.high_freq_factor != 0 ||
        r.original_max_position_embeddings != 0) {
      e.Add(PathOf(&RopeScaling::rope_type, i), Quote(r.rope_type), "takes only factor",
            "remove low_freq_factor, high_freq_factor and original_max_position_embeddings, or "
            "use rope_type: llama3");
    }
    return;
  }
  if (!(std::isfinite(r.low_freq_factor) && r.low_freq_factor > 0)) {
    e.Add(PathOf(&RopeScaling::low_freq_factor, i), FormatDouble(r.low_freq_factor), "must be > 0",
          "use e.g. 1 (Llama 3.1)");
  } else if (!(std::isfinite(r.high_freq_factor) && r.high_freq_factor > r.low_freq_factor)) {
    e.Add(PathOf(&RopeScaling::high_freq_factor, i), FormatDouble(r.high_freq_factor),
          absl::StrCat("must be > low_freq_factor ", FormatDouble(r.low_freq_factor)),
          "use e.g. 4 (Llama 3.1)");
  }
  if (r.original_max_position_embeddings <= 0) {
    e.Add(PathOf(&RopeScaling::original_max_position_embeddings, i),
          absl::StrCat(r.original_max_position_embeddings), "must be > 0",
          "use the context the base model was trained at, e.g. 8192 (Llama 3.1)");
  }
}

void CheckStage(const JobSpec& s, size_t i, Errors& e) {
  const StageSpec& st = s.stages[i];
  const std::string p = absl::StrCat(PathOf(&JobSpec::stages), "[", i, "]");
  const int64_t sp = s.StageSp(i);
  if (st.seq_len <= 0) {
    e.Add(PathOf(&StageSpec::seq_len, i), absl::StrCat(st.seq_len), "must be > 0",
          "use e.g. seq_len: 4096");
  } else if (sp >= 1 && st.seq_len % sp != 0) {
    e.Add(PathOf(&StageSpec::seq_len, i), absl::StrCat(st.seq_len),
          absl::StrCat("is not divisible by sp_degree ", sp), SeqLenSuggestion(st.seq_len, sp));
  }
  if (i > 0 && st.seq_len > 0 && st.seq_len <= s.stages[i - 1].seq_len) {
    e.Add(PathOf(&StageSpec::seq_len, i), absl::StrCat(st.seq_len),
          absl::StrCat("is not greater than stages[", i - 1, "].seq_len ", s.stages[i - 1].seq_len),
          "stages expand the context: order them by strictly increasing seq_len");
  }
  if (st.seq_len > kMaxSeqLen) {  // Sane upper bounds: a spec that can never run is refused.
    e.Add(PathOf(&StageSpec::seq_len, i), absl::StrCat(st.seq_len),
          absl::StrCat("is more than ", kMaxSeqLen),
          "no run holds more than 2^30 tokens per sequence; use a smaller seq_len");
  }
  if (st.steps <= 0) {
    e.Add(PathOf(&StageSpec::steps, i), absl::StrCat(st.steps), "must be > 0",
          "use e.g. steps: 100");
  } else if (st.steps > kMaxSteps) {
    e.Add(PathOf(&StageSpec::steps, i), absl::StrCat(st.steps),
          absl::StrCat("is more than ", kMaxSteps),
          "split the run into stages or jobs of at most 10^9 steps");
  }
  if (st.lr && *st.lr <= 0) {
    e.Add(PathOf(&StageSpec::lr, i), FormatDouble(*st.lr), "must be > 0",
          "use e.g. 1.0e-4, or leave it out to use optimizer.lr");
  }
  if (st.warmup_steps && *st.warmup_steps < 0) {
    e.Add(PathOf(&StageSpec::warmup_steps, i), absl::StrCat(*st.warmup_steps), "must be >= 0",
          "use 0 for no warmup");
  }
  if (st.sp_degree) {
    CheckDegree(e, PathOf(&StageSpec::sp_degree, i), *st.sp_degree, "sequence parallelism");
    CheckSpAgainstHeads(s, PathOf(&StageSpec::sp_degree, i), *st.sp_degree, e);
  }
  if (st.dp_degree) {
    CheckDegree(e, PathOf(&StageSpec::dp_degree, i), *st.dp_degree, "data parallelism");
  }
  if (st.rope) CheckStageRope(*st.rope, i, e);
  const int64_t dp = s.StageDp(i);
  if (sp >= 1 && dp >= 1 && (sp > kMaxWorldSize || dp > kMaxWorldSize / sp)) {
    e.Add(p, absl::StrCat("sp_degree ", sp, " x dp_degree ", dp),
          absl::StrCat("is more than ", kMaxWorldSize, " ranks"), "use fewer ranks");
  }
  if (s.data.synthetic && s.data.synthetic->generator == "needle" && st.seq_len > 0 &&
      st.seq_len < kNeedleMinSeqLen) {
    e.Add(PathOf(&StageSpec::seq_len, i), absl::StrCat(st.seq_len),
          "is too short for the needle generator",
          absl::StrCat("use seq_len >= ", kNeedleMinSeqLen, " or generator: random"));
  }
}

void CheckStages(const JobSpec& s, Errors& e) {
  if (s.stages.empty()) {
    e.Add(PathOf(&JobSpec::stages), "[]", "is empty",
          "add at least one stage, e.g. stages: [{seq_len: 1024, steps: 100}]");
  }
  if (static_cast<int64_t>(s.stages.size()) > kMaxStages) {
    // One line, not one per stage: the message must stay readable (and fit an RPC).
    e.AddLine(internal::TooManyStages(s.stages.size()));
    return;
  }
  for (size_t i = 0; i < s.stages.size(); ++i) {
    CheckStage(s, i, e);
  }
}

void CheckData(const JobSpec& s, Errors& e) {
  const DataSpec& d = s.data;
  CheckChoice(e, PathOf(&DataSpec::format), d.format, {"flat", "indexed"}, "format");
  if (d.synthetic && (d.format != "flat" || !d.packing)) {
    e.Add(PathOf(&DataSpec::format), Quote(d.format),
          "format/packing are given together with "
          "data.synthetic",
          "they apply to token files only; remove them");
  }
  if (!d.packing && d.format != "indexed") {
    e.Add(PathOf(&DataSpec::packing), "false",
          "needs format: indexed (a flat file has no documents)",
          "set data.format: indexed with a packed dataset, or remove packing");
  }
  if (d.synthetic) {
    if (!d.train.empty()) {
      e.Add(PathOf(&DataSpec::train), Quote(d.train), "is given together with data.synthetic",
            "use either token files or a synthetic generator");
    }
    if (!d.validation.empty()) {
      e.Add(PathOf(&DataSpec::validation), Quote(d.validation),
            "is given together with data.synthetic",
            "synthetic data brings its own validation set; remove data.validation");
    }
    CheckChoice(e, PathOf(&SyntheticDataSpec::generator), d.synthetic->generator,
                {"random", "needle"}, "generator");
    if (d.synthetic->validation_sequences < 0) {
      e.Add(PathOf(&SyntheticDataSpec::validation_sequences),
            absl::StrCat(d.synthetic->validation_sequences), "must be >= 0",
            "use e.g. 8, or 0 for no validation");
    }
    if (d.synthetic->generator == "needle" && s.model.vocab_size > 0 &&
        s.model.vocab_size < kNeedleMinVocab) {
      e.Add(PathOf(&SyntheticDataSpec::generator), "'needle'",
            absl::StrCat("needs vocab_size >= ", kNeedleMinVocab, ", got ", s.model.vocab_size),
            "use a larger vocab_size or generator: random");
    }
    return;
  }
  if (d.train.empty() && !d.validation.empty()) {
    e.Add(PathOf(&DataSpec::validation), Quote(d.validation), "is given without data.train",
          "set data.train to the training token file");
  } else if (d.train.empty()) {
    e.Add(PathOf(&JobSpec::data), "{}", "has no training data",
          "set data.train to a uint32 token file, or data.synthetic.generator: random|needle");
  }
}

void CheckCheckpointAndScheduling(const JobSpec& s, Errors& e) {
  if (s.checkpoint.every_steps < 0) {
    e.Add(PathOf(&CheckpointSpec::every_steps), absl::StrCat(s.checkpoint.every_steps),
          "must be >= 0", "use 0 to checkpoint only at stage ends");
  }
  if (s.checkpoint.every_seconds < 0 || s.checkpoint.every_seconds > kMaxCheckpointSeconds) {
    e.Add(PathOf(&CheckpointSpec::every_seconds), absl::StrCat(s.checkpoint.every_seconds),
          absl::StrCat("is outside 0..", kMaxCheckpointSeconds),
          "use e.g. 1800 (seconds between checkpoints), or 0 for none by time");
  }
  if (s.checkpoint.every_steps_auto && s.checkpoint.every_seconds != 0) {
    e.Add(PathOf(&CheckpointSpec::every_steps), "auto",
          absl::StrCat("is given with spec.checkpoint.every_seconds: ", s.checkpoint.every_seconds,
                       " (auto picks the interval itself)"),
          "keep one of the two: every_steps: auto, or every_seconds: N");
  }
  if (s.checkpoint.keep_last < 1) {
    e.Add(PathOf(&CheckpointSpec::keep_last), absl::StrCat(s.checkpoint.keep_last), "must be >= 1",
          "use e.g. 2");
  }
  // The coordinator counts both in 32 bits: a larger value is refused, never truncated.
  if (s.scheduling.max_failures < 0) {
    e.Add(PathOf(&SchedulingSpec::max_failures), absl::StrCat(s.scheduling.max_failures),
          "must be >= 0", "use e.g. 3, or 0 to fail on the first failure");
  } else if (s.scheduling.max_failures > kMaxInt32) {
    e.Add(PathOf(&SchedulingSpec::max_failures), absl::StrCat(s.scheduling.max_failures),
          absl::StrCat("is more than ", kMaxInt32), "use e.g. 3");
  }
  if (s.scheduling.max_infra_failures < 0) {
    e.Add(PathOf(&SchedulingSpec::max_infra_failures),
          absl::StrCat(s.scheduling.max_infra_failures), "must be >= 0",
          "use e.g. 20, or 0 to fail on the first lost worker or killed rank");
  } else if (s.scheduling.max_infra_failures > kMaxInt32) {
    e.Add(PathOf(&SchedulingSpec::max_infra_failures),
          absl::StrCat(s.scheduling.max_infra_failures), absl::StrCat("is more than ", kMaxInt32),
          "use e.g. 20");
  }
  if (s.scheduling.failure_window_s < 0) {
    e.Add(PathOf(&SchedulingSpec::failure_window_s), absl::StrCat(s.scheduling.failure_window_s),
          "must be >= 0", "use e.g. 86400 (one day), or 0 for no window");
  } else if (s.scheduling.failure_window_s > kMaxInt32) {
    e.Add(PathOf(&SchedulingSpec::failure_window_s), absl::StrCat(s.scheduling.failure_window_s),
          absl::StrCat("is more than ", kMaxInt32), "use e.g. 86400, or 0 for no window");
  }
  if (s.scheduling.priority < -kMaxPriority || s.scheduling.priority > kMaxPriority) {
    e.Add(PathOf(&SchedulingSpec::priority), absl::StrCat(s.scheduling.priority),
          absl::StrCat("is outside -", kMaxPriority, "..", kMaxPriority),
          "use a small number such as 0 or 10; the coordinator also caps it per role");
  }
  if (s.scheduling.max_preemptions < -1) {
    e.Add(PathOf(&SchedulingSpec::max_preemptions), absl::StrCat(s.scheduling.max_preemptions),
          "must be >= -1", "use -1 for unlimited");
  } else if (s.scheduling.max_preemptions > kMaxInt32) {
    e.Add(PathOf(&SchedulingSpec::max_preemptions), absl::StrCat(s.scheduling.max_preemptions),
          absl::StrCat("is more than ", kMaxInt32), "use -1 for unlimited");
  }
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  Errors e;
  CheckMetadata(spec, e);
  CheckModel(spec, e);
  CheckData(spec, e);
  CheckParallelism(spec, e);
  CheckMemory(spec, e);
  CheckOptimizer(spec, e);
  CheckStages(spec, e);
  CheckCheckpointAndScheduling(spec, e);
  CheckEval(PathOf(&JobSpec::eval), spec.eval, e);
  for (size_t i = 0; i < spec.stages.size(); ++i) {
    if (spec.stages[i].eval) {
      CheckEval(PathOf(&StageSpec::eval, i), *spec.stages[i].eval, e);
    }
  }
  return internal::ErrorsToStatus(e.lines());
}

}  // namespace ulysses::spec
