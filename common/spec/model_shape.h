// The model shape: ONE struct for the decoder's shape (Hugging Face config.json
// names) of every supported model family (ModelFamily below: llama, mistral, qwen2,
// qwen3), with the one place for each thing done with it:
//   - the field list (ForEachShapeField), which every reader, printer and
//     comparison iterates instead of naming fields by hand;
//   - presets and defaults (ApplyModelPreset, FinishModelSpec);
//   - validation (ModelShapeErrors / ModelShape::Validate), lines of the form
//     `spec.model.<field>: <value> <problem> (<fix>)`;
//   - JSON read/write with HF names (config.json, a checkpoint's model_config), the
//     family read from `architectures` / `model_type` (the ONE config.json reader:
//     the engine's init_from and the CLI's plan/validate both call ModelShapeFromJson);
//   - init_from resolution: a spec's shape against a config.json
//     (ResolveModelShape: unset fields filled, disagreements are errors);
//   - the Ulysses head rule (CheckUlyssesHeads, UlyssesKvHeadsExchanged).
// spec::ModelSpec (below; spec.model of job_spec.h) is a ModelShape plus preset,
// init_from and dtype; the engine's model::LlamaConfig is this struct. No torch,
// no filesystem: callers read the files. Stateless; every function is thread-safe.
#ifndef ULYSSES_COMMON_SPEC_MODEL_SHAPE_H_
#define ULYSSES_COMMON_SPEC_MODEL_SHAPE_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ulysses::spec {

// RoPE frequency scaling (HF LlamaConfig.rope_scaling).
//   none:   inv_freq_i = rope_theta^(-2i/D), no scaling (the numbers below stay 0).
//   llama3: Llama 3.1's rule. With L = original_max_position_embeddings and the
//           wavelength w_i = 2*pi / inv_freq_i: w_i < L / high_freq_factor keeps
//           inv_freq_i; w_i > L / low_freq_factor divides it by `factor`; in
//           between, s = (L / w_i - low_freq_factor) / (high_freq_factor -
//           low_freq_factor) blends the two: (1 - s) * inv_freq_i / factor + s * inv_freq_i.
//   linear: position interpolation (HF's "linear"): every inv_freq_i divided by `factor`; the
//           other numbers stay 0.
struct RopeScaling {
  std::string rope_type = "none";                // "none" | "llama3" | "linear".
  double factor = 0;                             // llama3: >= 1 (8 for Llama 3.1, 32 for 3.2).
  double low_freq_factor = 0;                    // llama3: > 0 (1 in Llama 3.1).
  double high_freq_factor = 0;                   // llama3: > low_freq_factor (4 in Llama 3.1).
  int64_t original_max_position_embeddings = 0;  // llama3: > 0 (8192 in Llama 3.1).
};

inline constexpr char kRopeNone[] = "none";
inline constexpr char kRopeLlama3[] = "llama3";
inline constexpr char kRopeLinear[] = "linear";

// A model family: how one Hugging Face architecture differs from the Llama layout. The
// families are data (kModelFamilies); the engine, the HF reader/writer, the planner and
// validation read these features instead of naming architectures.
struct ModelFamily {
  const char* name;          // spec.model.family
  const char* architecture;  // config.json architectures[0]
  const char* model_type;    // config.json model_type
  bool qkv_bias;             // q_proj, k_proj, v_proj have a bias (o_proj and the MLP none)
  bool qk_norm;              // RMSNorm over head_dim on q and k before RoPE (q_norm, k_norm)
  bool sliding_window;       // config.json's sliding_window applies to every layer
};

// llama: LlamaForCausalLM. mistral: the Llama layout, with config.json sliding_window (null or
// at least the longest stage: the engine attends over the whole causal prefix). qwen2
// (Qwen2 / Qwen2.5): q/k/v biases. qwen3 (dense): per-head q_norm / k_norm, explicit head_dim.
inline constexpr ModelFamily kModelFamilies[] = {
    {"llama", "LlamaForCausalLM", "llama", false, false, false},
    {"mistral", "MistralForCausalLM", "mistral", false, false, true},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", true, false, false},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", false, true, false},
};
inline constexpr char kFamilyLlama[] = "llama";

// The family named `name` (spec.model.family), or nullptr.
const ModelFamily* FindModelFamily(const std::string& name);
// "llama, mistral, qwen2, qwen3".
std::string ModelFamilyList();

// Shape of the decoder. Field names are the YAML keys of spec.model and the
// config.json keys (family, attention_bias and qk_norm excepted: config.json says them
// with architectures / model_type). Defaults are those of a spec without preset.
struct ModelShape {
  std::string family = kFamilyLlama;  // ModelFamily name (llama | mistral | qwen2 | qwen3).
  int64_t vocab_size = 0;             // Token vocabulary size.
  int64_t hidden_size = 0;            // Model width H.
  int64_t intermediate_size = 0;      // SwiGLU inner width.
  int64_t num_hidden_layers = 0;      // Decoder layers.
  int64_t num_attention_heads = 0;    // Query heads Hq.
  int64_t num_key_value_heads = 0;    // KV heads Hkv (GQA); defaults to Hq.
  // Per-head width D; 0 = hidden_size / num_attention_heads. Qwen3 sets it apart from them
  // (Qwen3-4B: hidden 2560, 32 heads, head_dim 128): q_proj is [Hq*D, H], o_proj [H, Hq*D].
  int64_t head_dim = 0;
  double rope_theta = 10000.0;       // RoPE base.
  double rms_norm_eps = 1e-5;        // RMSNorm epsilon.
  bool tie_word_embeddings = false;  // Share embed_tokens and lm_head weights.
  bool attention_bias = false;       // q/k/v biases: the family's (qwen2 true, others false).
  bool qk_norm = false;              // q_norm / k_norm: the family's (qwen3 true, others false).
  int64_t sliding_window = 0;        // Attention window (mistral only); 0 = none.
  RopeScaling rope_scaling;          // RoPE frequency scaling (none | llama3).

  // The head width D: head_dim when set, else hidden_size / num_attention_heads (whole
  // and even, checked by Validate); 0 while the heads are unknown.
  int64_t HeadDim() const {
    if (head_dim > 0) return head_dim;
    return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
  }
  // The family's features (nullptr for an unknown family: Validate refuses it).
  const ModelFamily* Family() const { return FindModelFamily(family); }
  // Every field known and valid; InvalidArgument with one line per problem
  // (`spec.model.<field>: ...`) otherwise.
  absl::Status Validate() const;
};

// The field list. Calls fn(key, value) for every shape field in document order,
// `value` a reference to the field (int64_t, double, bool or std::string, const
// when `shape` is). Keys are the YAML / config.json names; rope_scaling's fields
// come as "rope_scaling.<name>".
template <typename Shape, typename Fn>
void ForEachShapeField(Shape& shape, Fn&& fn) {
  fn("family", shape.family);
  fn("vocab_size", shape.vocab_size);
  fn("hidden_size", shape.hidden_size);
  fn("intermediate_size", shape.intermediate_size);
  fn("num_hidden_layers", shape.num_hidden_layers);
  fn("num_attention_heads", shape.num_attention_heads);
  fn("num_key_value_heads", shape.num_key_value_heads);
  fn("head_dim", shape.head_dim);
  fn("rope_theta", shape.rope_theta);
  fn("rms_norm_eps", shape.rms_norm_eps);
  fn("tie_word_embeddings", shape.tie_word_embeddings);
  fn("attention_bias", shape.attention_bias);
  fn("qk_norm", shape.qk_norm);
  fn("sliding_window", shape.sliding_window);
  fn("rope_scaling.rope_type", shape.rope_scaling.rope_type);
  fn("rope_scaling.factor", shape.rope_scaling.factor);
  fn("rope_scaling.low_freq_factor", shape.rope_scaling.low_freq_factor);
  fn("rope_scaling.high_freq_factor", shape.rope_scaling.high_freq_factor);
  fn("rope_scaling.original_max_position_embeddings",
     shape.rope_scaling.original_max_position_embeddings);
}

// The keys of ForEachShapeField, in order.
const std::vector<std::string>& ShapeFieldKeys();

// A field's value as text for messages: "4096", "500000.0", "true", "'llama3'".
std::string ShapeFieldText(const ModelShape& shape, const std::string& key);

// True when the two shapes agree on `key` (exact: values come from decimal text; head_dim
// compares HeadDim(), so 0 equals the derived width it stands for).
bool ShapeFieldEquals(const ModelShape& a, const ModelShape& b, const std::string& key);

// The model part of a job spec (spec.model): a shape plus where it and the
// weights come from.
struct ModelSpec : ModelShape {
  std::string preset;             // ModelPresetNames() or "" (explicit).
  std::string init_from;          // HF directory (config.json + *.safetensors), or "".
  std::string dtype = "float32";  // float32 | bfloat16 | float16 | float64 (float64: tests).
  // Shape keys (ShapeFieldKeys) the document left out while init_from is set and no
  // preset is given: the engine reads them from init_from's config.json
  // (ResolveModelShape); until then they hold the struct defaults. Empty otherwise.
  std::set<std::string> from_init;
};

// The preset names, in the order of messages ("tiny", "llama3-1b", "llama3-8b", "llama3-70b",
// "mistral-7b-v0.3", "qwen2.5-7b", "qwen3-4b", "qwen3-8b"), each with its published config.json
// numbers.
std::vector<std::string> ModelPresetNames();

// Overwrites every shape field with the preset's; "" does nothing; an unknown
// name is an error naming the choices.
absl::Status ApplyModelPreset(ModelSpec& model);

// Completes a parsed spec.model after the preset and the document's fields were
// applied; `given` holds the shape keys the document set. With init_from and no
// preset, every key not given goes to from_init; otherwise num_key_value_heads
// defaults to num_attention_heads (when neither it nor a preset set it), and
// attention_bias / qk_norm not given take the family's.
void FinishModelSpec(ModelSpec& model, const std::set<std::string>& given);

// True when a document shows `key` of `model` (ToYaml, printers): not a from_init
// field, not part of a rope_scaling of type none outside init_from (no
// scaling is written by leaving rope_scaling out), and not a family field at its
// default (family llama, head_dim 0, attention_bias / qk_norm the family's,
// sliding_window 0).
bool ShapeFieldShown(const ModelSpec& model, const std::string& key);

// Validation lines (`spec.model.<key>: <value> <problem> (<fix>)`) for `model`.
// Keys in model.from_init are unknown: they are skipped, and so are the rules
// that need them. `missing_fix` is the fix for a shape integer that is 0.
std::vector<std::string> ModelShapeErrors(const ModelSpec& model, const std::string& missing_fix);

// Shape -> JSON with HF config names: architectures and model_type (the family's),
// the fields, head_dim (HeadDim()), sliding_window (null for 0; mistral only),
// attention_bias (false; not for qwen2, whose config has no such key), and rope_scaling
// (null for none, else {rope_type, factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings}). The checkpoint's model_config and the
// shape keys of an exported config.json.
nlohmann::json ModelShapeToJson(const ModelShape& shape);

// JSON (HF names) -> validated shape. `source` prefixes every error (e.g.
// "/m/config.json"). The family comes from architectures[0] and model_type (both
// optional: absent = llama; an unknown one, or the two disagreeing, is an error
// listing the supported architectures); attention_bias and qk_norm are the family's.
// kHfDefaults: absent optional keys take the HF config's
// defaults (num_key_value_heads = heads, rope_theta 10000, rms_norm_eps 1e-6,
// no tie, no rope_scaling); kRequireAll: only rope_scaling, head_dim,
// sliding_window and the family keys may be absent.
// rope_scaling: null, {rope_type|type: "default"} = none, "llama3" with its four
// numbers; any other rope type is refused. head_dim: any even width (absent or null =
// hidden_size / num_attention_heads). sliding_window: read for mistral (null = 0);
// for qwen2/qwen3 use_sliding_window true is refused. attention_bias true is refused
// for llama, mistral and qwen3 (HF puts a bias on o_proj too, which the engine has not).
// Keys that do not change the shape are ignored; hidden_act and mlp_bias are the
// HF reader's (worker/engine/hf).
enum class JsonDefaults { kHfDefaults, kRequireAll };
absl::StatusOr<ModelShape> ModelShapeFromJson(const nlohmann::json& json, const std::string& source,
                                              JsonDefaults defaults = JsonDefaults::kHfDefaults);

// init_from resolution: the spec's shape against the shape read from init_from's
// config.json (`hf`, read from `source`). Fields in model.from_init take hf's
// value; every other field must equal it, else InvalidArgument with one line per
// field naming both values and the fix. The result is validated.
absl::StatusOr<ModelShape> ResolveModelShape(const ModelSpec& model, const ModelShape& hf,
                                             const std::string& source);

// The sliding-window rule: the engine attends over the whole causal prefix, which is
// sliding-window attention only when no stage is longer than the window. OK for window 0
// (none) or window >= every seq_len; else InvalidArgument `spec.model.sliding_window: <w>
// [(from <source>)] is shorter than stages[i].seq_len <n> (<fix>)`.
absl::Status CheckSlidingWindow(int64_t window, const std::vector<int64_t>& stage_seq_lens,
                                const std::string& source);

// The Ulysses head rule for hq query and hkv kv heads over sp ranks: hq % sp == 0
// (each rank takes whole query heads), and kv heads are sharded (hkv % sp == 0)
// or replicated (sp % hkv == 0, each kv head copied sp/hkv times). Also needs
// hq, hkv, sp >= 1 and hq % hkv == 0. InvalidArgument
// `<field>: <sp> <problem> (<fix>)` naming the numbers and the sp values that work.
absl::Status CheckUlyssesHeads(int64_t hq, int64_t hkv, int64_t sp,
                               const std::string& field = "sp_degree");

// KV heads entering the Ulysses exchange: hkv when sharded, sp when replicated
// (assumes CheckUlyssesHeads passed; 0 when hkv is unknown).
int64_t UlyssesKvHeadsExchanged(int64_t hkv, int64_t sp);

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_MODEL_SHAPE_H_
