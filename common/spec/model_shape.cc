#include "common/spec/model_shape.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/spec_util.h"
#include "common/status.h"

namespace ulysses::spec {
namespace {

using internal::FormatDouble;
using internal::Quote;
using json = nlohmann::json;

// Lists of valid head/sp values are only spelled out up to this many heads.
constexpr int64_t kMaxListedHeads = 1 << 16;
constexpr char kRopePrefix[] = "rope_scaling.";

std::string Line(const std::string& path, const std::string& value, const std::string& problem,
                 const std::string& fix) {
  return absl::StrCat(path, ": ", value, " ", problem, " (", fix, ")");
}

bool IsRopeKey(const std::string& key) { return absl::StartsWith(key, kRopePrefix); }

// Shape integers where 0 means "none" or "derived" (not "missing").
bool ZeroAllowed(const std::string& key) { return key == "head_dim" || key == "sliding_window"; }

// The keys a family decides, which config.json spells otherwise (architectures / model_type)
// or not at all.
bool FamilyKey(const std::string& key) {
  return key == "family" || key == "attention_bias" || key == "qk_norm";
}

// "LlamaForCausalLM (llama), ...": the architectures the readers accept.
std::string ArchitectureList() {
  std::vector<std::string> names;
  for (const ModelFamily& f : kModelFamilies) {
    names.push_back(absl::StrCat(f.architecture, " (", f.model_type, ")"));
  }
  return absl::StrJoin(names, ", ");
}

// A read-only reference to one field of a shape.
using FieldRef = std::variant<const int64_t*, const double*, const bool*, const std::string*>;

FieldRef Field(const ModelShape& shape, const std::string& key) {
  FieldRef ref;
  bool found = false;
  ForEachShapeField(shape, [&](const char* k, const auto& value) {
    if (key == k) {
      ref = &value;
      found = true;
    }
  });
  if (!found) {
    // Keys come from ShapeFieldKeys(); anything else is a programming error.
    std::abort();
  }
  return ref;
}

std::string Text(const int64_t* v) { return absl::StrCat(*v); }
std::string Text(const double* v) { return FormatDouble(*v); }
std::string Text(const bool* v) { return *v ? "true" : "false"; }
std::string Text(const std::string* v) { return Quote(*v); }

// Sets `key` of `to` to the value it has in `from`.
void CopyField(const ModelShape& from, ModelShape& to, const std::string& key) {
  const FieldRef source = Field(from, key);
  ForEachShapeField(to, [&](const char* k, auto& value) {
    if (key == k) {
      value = *std::get<const std::decay_t<decltype(value)>*>(source);
    }
  });
}

// "1, 2, 4, 8": the divisors of n (a phrase for very large n).
std::string Divisors(int64_t n) {
  if (n > kMaxListedHeads) {
    return absl::StrCat("the divisors of ", n);
  }
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) {
      divisors.push_back(d);
    }
  }
  return absl::StrJoin(divisors, ", ");
}

// "1, 2, 4, 8": the sequence-parallel degrees that work with these head counts.
std::string ValidSpDegrees(int64_t hq, int64_t hkv) {
  if (hq > kMaxListedHeads) {
    return "the divisors of num_attention_heads";
  }
  std::vector<int64_t> valid;
  for (int64_t p = 1; p <= hq; ++p) {
    if (hq % p == 0 && (hkv % p == 0 || p % hkv == 0)) {
      valid.push_back(p);
    }
  }
  return absl::StrJoin(valid, ", ");
}

// Appends the validation lines of `s` (keys in `unknown` skipped, with the rules
// that need them). `prefix` starts each path ("spec.model." or "<file>: ").
namespace {

// What ShapeErrors' parts share: the fields left out of the check and how a field is named.
struct ShapeCheck {
  const std::set<std::string>& unknown;
  const std::string& prefix;
  bool known(const char* key) const { return unknown.count(key) == 0; }
  std::string path(const std::string& key) const { return prefix + key; }
};

// family and what it fixes: attention_bias, qk_norm, sliding_window.
void FamilyErrors(const ModelShape& s, const ShapeCheck& c, std::vector<std::string>* out) {
  auto known = [&](const char* key) { return c.known(key); };
  auto path = [&](const std::string& key) { return c.path(key); };
  const ModelFamily* family = FindModelFamily(s.family);
  if (known("family") && family == nullptr) {
    out->push_back(Line(path("family"), Quote(s.family), "is not a supported model family",
                        absl::StrCat("use one of ", ModelFamilyList())));
  }
  if (known("family") && family != nullptr) {
    if (known("attention_bias") && s.attention_bias != family->qkv_bias) {
      out->push_back(Line(
          path("attention_bias"), s.attention_bias ? "true" : "false",
          absl::StrCat("is not what family ", Quote(family->name), " has"),
          family->qkv_bias
              ? absl::StrCat("family ", family->name,
                             " always has q/k/v biases: set attention_bias: true or leave it out")
              : "q/k/v biases are family qwen2's (HF's attention_bias of the other families "
                "also biases o_proj, which the engine does not implement): set family: qwen2, "
                "or attention_bias: false"));
    }
    if (known("qk_norm") && s.qk_norm != family->qk_norm) {
      out->push_back(Line(
          path("qk_norm"), s.qk_norm ? "true" : "false",
          absl::StrCat("is not what family ", Quote(family->name), " has"),
          family->qk_norm
              ? absl::StrCat("family ", family->name,
                             " always normalises q and k per head: set qk_norm: true or leave "
                             "it out")
              : "per-head q/k RMSNorm is family qwen3's: set family: qwen3, or qk_norm: false"));
    }
    if (known("sliding_window") && s.sliding_window > 0 && !family->sliding_window) {
      out->push_back(Line(path("sliding_window"), absl::StrCat(s.sliding_window),
                          absl::StrCat("is set but family ", Quote(family->name),
                                       " has no sliding-window attention"),
                          "remove sliding_window (only family mistral reads it)"));
    }
  }
}

// The head layout: head_dim (explicit or hidden / heads, even) and the kv-head grouping.
void HeadErrors(const ModelShape& s, const ShapeCheck& c, std::vector<std::string>* out) {
  auto known = [&](const char* key) { return c.known(key); };
  auto path = [&](const std::string& key) { return c.path(key); };
  const int64_t hq = s.num_attention_heads, hkv = s.num_key_value_heads, h = s.hidden_size;
  const bool heads_known = known("num_attention_heads") && hq > 0;
  const bool explicit_head_dim = known("head_dim") && s.head_dim > 0;
  if (explicit_head_dim) {
    if (s.head_dim % 2 != 0) {
      out->push_back(Line(path("head_dim"), absl::StrCat(s.head_dim), "is odd",
                          absl::StrCat("RoPE rotates pairs of dimensions, so head_dim must be "
                                       "even; use ",
                                       s.head_dim - 1, " or ", s.head_dim + 1)));
    }
  } else if (heads_known && known("hidden_size") && h > 0 && known("head_dim")) {
    if (h % hq != 0) {
      out->push_back(Line(path("hidden_size"), absl::StrCat(h),
                          absl::StrCat("is not divisible by num_attention_heads ", hq),
                          absl::StrCat("head_dim = hidden_size / num_attention_heads must be "
                                       "whole; ",
                                       internal::NearestMultiples(h, hq))));
    } else if ((h / hq) % 2 != 0) {
      out->push_back(Line(path("hidden_size"), absl::StrCat(h),
                          absl::StrCat("gives an odd head_dim ", h / hq,
                                       " (hidden_size / num_attention_heads ", hq, ")"),
                          absl::StrCat("RoPE rotates pairs of dimensions, so head_dim must be "
                                       "even; ",
                                       hq <= INT64_MAX / 2 ? internal::NearestMultiples(h, 2 * hq)
                                                           : "use fewer heads")));
    }
  }
  if (heads_known && known("num_key_value_heads") && hkv > 0 && hq % hkv != 0) {
    out->push_back(Line(path("num_key_value_heads"), absl::StrCat(hkv),
                        absl::StrCat("does not divide num_attention_heads ", hq),
                        absl::StrCat("each kv head serves a whole group of query heads; use one "
                                     "of ",
                                     Divisors(hq))));
  }
}

// rope_theta, rms_norm_eps and the rope_scaling numbers for its type.
void RopeErrors(const ModelShape& s, const ShapeCheck& c, std::vector<std::string>* out) {
  auto known = [&](const char* key) { return c.known(key); };
  auto path = [&](const std::string& key) { return c.path(key); };
  if (known("rope_theta") && !(std::isfinite(s.rope_theta) && s.rope_theta > 0)) {
    out->push_back(Line(path("rope_theta"), FormatDouble(s.rope_theta), "must be > 0",
                        "Llama 3 uses 500000.0, Llama 2 10000.0"));
  }
  if (known("rms_norm_eps") && !(std::isfinite(s.rms_norm_eps) && s.rms_norm_eps > 0)) {
    out->push_back(
        Line(path("rms_norm_eps"), FormatDouble(s.rms_norm_eps), "must be > 0", "use 1e-5"));
  }
  if (!known("rope_scaling.rope_type")) {
    return;  // The rope numbers' rules depend on the type.
  }
  const RopeScaling& r = s.rope_scaling;
  if (r.rope_type == kRopeNone) {
    ForEachShapeField(s, [&](const char* key, const auto& value) {
      if constexpr (!std::is_same_v<std::decay_t<decltype(value)>, std::string>) {
        if (IsRopeKey(key) && known(key) && value != 0) {
          const std::string name = std::string(key).substr(sizeof(kRopePrefix) - 1);
          out->push_back(
              Line(path(key), Text(&value), "is set but rope_scaling.rope_type is 'none'",
                   absl::StrCat("set rope_scaling.rope_type: llama3, or remove ", name)));
        }
      }
    });
    return;
  }
  if (r.rope_type != kRopeLlama3 && r.rope_type != kRopeLinear) {
    out->push_back(Line(path("rope_scaling.rope_type"), Quote(r.rope_type),
                        "is not a supported rope type", "use none, llama3 or linear"));
    return;
  }
  if (known("rope_scaling.factor") && !(std::isfinite(r.factor) && r.factor >= 1)) {
    out->push_back(Line(path("rope_scaling.factor"), FormatDouble(r.factor), "must be >= 1",
                        "Llama 3.1 uses 8.0, Llama 3.2 32.0"));
  }
  if (r.rope_type == kRopeLinear) {
    // Position interpolation takes the factor alone: a llama3 number would be ignored.
    ForEachShapeField(s, [&](const char* key, const auto& value) {
      if constexpr (!std::is_same_v<std::decay_t<decltype(value)>, std::string>) {
        const std::string k = key;
        if (IsRopeKey(k) && k != "rope_scaling.factor" && known(key) && value != 0) {
          out->push_back(Line(path(k), Text(&value),
                              "is set but rope_type linear takes only factor",
                              absl::StrCat("remove ", k.substr(sizeof(kRopePrefix) - 1),
                                           ", or use rope_type: llama3")));
        }
      }
    });
    return;
  }
  const bool low_known = known("rope_scaling.low_freq_factor");
  const bool high_known = known("rope_scaling.high_freq_factor");
  if (low_known && !(std::isfinite(r.low_freq_factor) && r.low_freq_factor > 0)) {
    out->push_back(Line(path("rope_scaling.low_freq_factor"), FormatDouble(r.low_freq_factor),
                        "must be > 0", "Llama 3 uses 1.0"));
  } else if (high_known &&
             !(std::isfinite(r.high_freq_factor) && r.high_freq_factor > r.low_freq_factor)) {
    out->push_back(
        Line(path("rope_scaling.high_freq_factor"), FormatDouble(r.high_freq_factor),
             absl::StrCat("must be greater than low_freq_factor ", FormatDouble(r.low_freq_factor)),
             "Llama 3 uses high_freq_factor 4.0 and low_freq_factor 1.0"));
  }
  if (known("rope_scaling.original_max_position_embeddings") &&
      r.original_max_position_embeddings <= 0) {
    out->push_back(Line(path("rope_scaling.original_max_position_embeddings"),
                        absl::StrCat(r.original_max_position_embeddings), "must be > 0",
                        "the context length the model was pre-trained at; Llama 3 uses 8192"));
  }
}

}  // namespace

void ShapeErrors(const ModelShape& s, const std::set<std::string>& unknown,
                 const std::string& prefix, const std::string& missing_fix,
                 std::vector<std::string>* out) {
  const ShapeCheck c{unknown, prefix};
  auto known = [&](const char* key) { return c.known(key); };
  auto path = [&](const std::string& key) { return c.path(key); };
  ForEachShapeField(s, [&](const char* key, const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, int64_t>) {
      if (!IsRopeKey(key) && known(key) && (ZeroAllowed(key) ? value < 0 : value <= 0)) {
        const std::string k = key;
        out->push_back(Line(path(key), absl::StrCat(value),
                            ZeroAllowed(key) ? "must be >= 0" : "must be > 0",
                            k == "head_dim" ? "use 0 for hidden_size / num_attention_heads, or the "
                                              "model's head width"
                            : k == "sliding_window" ? "use 0 for no window"
                                                    : missing_fix));
      }
    }
  });
  FamilyErrors(s, c, out);
  HeadErrors(s, c, out);
  RopeErrors(s, c, out);
}

// One JSON value into a field; false (with an error line) when it has the wrong type.
bool FromJsonValue(const json& v, int64_t* out) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})) {
    return false;
  }
  *out = v.get<int64_t>();
  return true;
}
bool FromJsonValue(const json& v, double* out) {
  if (!v.is_number()) {
    return false;
  }
  *out = v.get<double>();
  return true;
}
bool FromJsonValue(const json& v, bool* out) {
  if (!v.is_boolean()) {
    return false;
  }
  *out = v.get<bool>();
  return true;
}
bool FromJsonValue(const json& v, std::string* out) {
  if (!v.is_string()) {
    return false;
  }
  *out = v.get<std::string>();
  return true;
}
const char* JsonKind(const int64_t*) { return "an integer"; }
const char* JsonKind(const double*) { return "a number"; }
const char* JsonKind(const bool*) { return "a boolean"; }
const char* JsonKind(const std::string*) { return "a string"; }

// JSON value text for messages, cut when long.
std::string JsonText(const json& v) {
  std::string text = v.dump();
  constexpr size_t kMaxShown = 80;
  if (text.size() > kMaxShown) {
    text = text.substr(0, kMaxShown) + "...";
  }
  return text;
}

// The models of the other families, with the numbers of their published config.json.
void AddFamilyPresets(std::vector<std::pair<std::string, ModelShape>>* p) {
  ModelShape mistral;  // mistralai/Mistral-7B-v0.3 (sliding_window null)
  mistral.family = "mistral";
  mistral.vocab_size = 32768;
  mistral.hidden_size = 4096;
  mistral.intermediate_size = 14336;
  mistral.num_hidden_layers = 32;
  mistral.num_attention_heads = 32;
  mistral.num_key_value_heads = 8;
  mistral.rope_theta = 1000000.0;
  mistral.rms_norm_eps = 1e-5;
  p->emplace_back("mistral-7b-v0.3", mistral);
  ModelShape qwen25;  // Qwen/Qwen2.5-7B (use_sliding_window false: no window)
  qwen25.family = "qwen2";
  qwen25.attention_bias = true;
  qwen25.vocab_size = 152064;
  qwen25.hidden_size = 3584;
  qwen25.intermediate_size = 18944;
  qwen25.num_hidden_layers = 28;
  qwen25.num_attention_heads = 28;
  qwen25.num_key_value_heads = 4;
  qwen25.rope_theta = 1000000.0;
  qwen25.rms_norm_eps = 1e-6;
  p->emplace_back("qwen2.5-7b", qwen25);
  ModelShape qwen3_4b;  // Qwen/Qwen3-4B (head_dim 128 != 2560 / 32, tied embeddings)
  qwen3_4b.family = "qwen3";
  qwen3_4b.qk_norm = true;
  qwen3_4b.vocab_size = 151936;
  qwen3_4b.hidden_size = 2560;
  qwen3_4b.intermediate_size = 9728;
  qwen3_4b.num_hidden_layers = 36;
  qwen3_4b.num_attention_heads = 32;
  qwen3_4b.num_key_value_heads = 8;
  qwen3_4b.head_dim = 128;
  qwen3_4b.rope_theta = 1000000.0;
  qwen3_4b.rms_norm_eps = 1e-6;
  qwen3_4b.tie_word_embeddings = true;
  p->emplace_back("qwen3-4b", qwen3_4b);
  ModelShape qwen3_8b = qwen3_4b;  // Qwen/Qwen3-8B (head_dim 128 = 4096 / 32)
  qwen3_8b.hidden_size = 4096;
  qwen3_8b.intermediate_size = 12288;
  qwen3_8b.tie_word_embeddings = false;
  p->emplace_back("qwen3-8b", qwen3_8b);
}

const std::vector<std::pair<std::string, ModelShape>>& Presets() {
  static const auto* presets = [] {
    auto* p = new std::vector<std::pair<std::string, ModelShape>>;
    ModelShape tiny;
    tiny.vocab_size = 256;
    tiny.hidden_size = 256;
    tiny.intermediate_size = 688;
    tiny.num_hidden_layers = 4;
    tiny.num_attention_heads = 8;
    tiny.num_key_value_heads = 4;
    tiny.rope_theta = 10000.0;
    tiny.rms_norm_eps = 1e-5;
    p->emplace_back("tiny", tiny);
    // Llama 3.1/3.2 RoPE scaling (config.json rope_scaling of Meta's checkpoints).
    RopeScaling llama3{kRopeLlama3, 8.0, 1.0, 4.0, 8192};
    ModelShape llama3_1b;  // Llama-3.2-1B
    llama3_1b.vocab_size = 128256;
    llama3_1b.hidden_size = 2048;
    llama3_1b.intermediate_size = 8192;
    llama3_1b.num_hidden_layers = 16;
    llama3_1b.num_attention_heads = 32;
    llama3_1b.num_key_value_heads = 8;
    llama3_1b.rope_theta = 500000.0;
    llama3_1b.rms_norm_eps = 1e-5;
    llama3_1b.tie_word_embeddings = true;
    llama3_1b.rope_scaling = llama3;
    llama3_1b.rope_scaling.factor = 32.0;
    p->emplace_back("llama3-1b", llama3_1b);
    ModelShape llama3_8b = llama3_1b;  // Llama-3.1-8B
    llama3_8b.hidden_size = 4096;
    llama3_8b.intermediate_size = 14336;
    llama3_8b.num_hidden_layers = 32;
    llama3_8b.tie_word_embeddings = false;
    llama3_8b.rope_scaling = llama3;
    p->emplace_back("llama3-8b", llama3_8b);
    ModelShape llama3_70b = llama3_8b;  // Llama-3.1-70B
    llama3_70b.hidden_size = 8192;
    llama3_70b.intermediate_size = 28672;
    llama3_70b.num_hidden_layers = 80;
    llama3_70b.num_attention_heads = 64;
    llama3_70b.num_key_value_heads = 8;
    p->emplace_back("llama3-70b", llama3_70b);
    AddFamilyPresets(p);
    return p;
  }();
  return *presets;
}

}  // namespace

const ModelFamily* FindModelFamily(const std::string& name) {
  for (const ModelFamily& f : kModelFamilies) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::string ModelFamilyList() {
  std::vector<std::string> names;
  for (const ModelFamily& f : kModelFamilies) names.emplace_back(f.name);
  return absl::StrJoin(names, ", ");
}

const std::vector<std::string>& ShapeFieldKeys() {
  static const auto* keys = [] {
    auto* k = new std::vector<std::string>;
    ModelShape shape;
    ForEachShapeField(shape, [&](const char* key, const auto&) { k->push_back(key); });
    return k;
  }();
  return *keys;
}

std::string ShapeFieldText(const ModelShape& shape, const std::string& key) {
  if (key == "head_dim") return absl::StrCat(shape.HeadDim());
  return std::visit([](const auto* v) { return Text(v); }, Field(shape, key));
}

bool ShapeFieldEquals(const ModelShape& a, const ModelShape& b, const std::string& key) {
  if (key == "head_dim") return a.HeadDim() == b.HeadDim();
  return std::visit(
      [&](const auto* va) {
        using T = std::decay_t<decltype(*va)>;
        return *va == *std::get<const T*>(Field(b, key));
      },
      Field(a, key));
}

absl::Status ModelShape::Validate() const {
  std::vector<std::string> errors;
  ShapeErrors(*this, {}, "spec.model.", "set it, or use a preset", &errors);
  return internal::ErrorsToStatus(errors);
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, shape] : Presets()) {
    names.push_back(name);
  }
  return names;
}

absl::Status ApplyModelPreset(ModelSpec& model) {
  if (model.preset.empty()) {
    return absl::OkStatus();
  }
  for (const auto& [name, shape] : Presets()) {
    if (model.preset == name) {
      static_cast<ModelShape&>(model) = shape;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.model.preset: ", Quote(model.preset), " is not a known preset (use ",
      internal::JoinChoices(ModelPresetNames()), ", or no preset and the shape fields)"));
}

void FinishModelSpec(ModelSpec& model, const std::set<std::string>& given) {
  model.from_init.clear();
  // An explicit rope_type none drops a preset's scaling numbers (the document's
  // own numbers stay, for validation to refuse) and leaves nothing to read.
  const bool rope_none_given =
      given.count("rope_scaling.rope_type") != 0 && model.rope_scaling.rope_type == kRopeNone;
  if (rope_none_given) {
    for (const std::string& key : ShapeFieldKeys()) {
      if (IsRopeKey(key) && given.count(key) == 0) {
        CopyField(ModelShape{}, model, key);
      }
    }
  }
  if (!model.init_from.empty() && model.preset.empty()) {
    for (const std::string& key : ShapeFieldKeys()) {
      if (given.count(key) == 0 && !(rope_none_given && IsRopeKey(key))) {
        model.from_init.insert(key);
      }
    }
    return;
  }
  if (model.preset.empty() && given.count("num_key_value_heads") == 0) {
    model.num_key_value_heads = model.num_attention_heads;
  }
  // The family's features, unless the document states them (validation compares).
  if (const ModelFamily* family = model.Family(); family != nullptr) {
    if (given.count("attention_bias") == 0) model.attention_bias = family->qkv_bias;
    if (given.count("qk_norm") == 0) model.qk_norm = family->qk_norm;
  }
}

bool ShapeFieldShown(const ModelSpec& model, const std::string& key) {
  if (model.from_init.count(key) != 0) {
    return false;
  }
  const ModelFamily* family = model.Family();
  if (key == "family") return model.family != kFamilyLlama;
  if (key == "head_dim") return model.head_dim != 0;
  if (key == "sliding_window") return model.sliding_window != 0;
  if (key == "attention_bias") return family == nullptr || model.attention_bias != family->qkv_bias;
  if (key == "qk_norm") return family == nullptr || model.qk_norm != family->qk_norm;
  if (IsRopeKey(key) && model.rope_scaling.rope_type == kRopeNone) {
    // No scaling is the absence of rope_scaling, except that with init_from an
    // explicit rope_type none is a claim about config.json to keep.
    return key == "rope_scaling.rope_type" && !model.init_from.empty();
  }
  return true;
}

std::vector<std::string> ModelShapeErrors(const ModelSpec& model, const std::string& missing_fix) {
  std::vector<std::string> errors;
  ShapeErrors(model, model.from_init, "spec.model.", missing_fix, &errors);
  return errors;
}

nlohmann::json ModelShapeToJson(const ModelShape& shape) {
  json out = json::object();
  const ModelFamily* family = shape.Family();
  if (family != nullptr) {
    out["architectures"] = {family->architecture};
    out["model_type"] = family->model_type;
  }
  ForEachShapeField(shape, [&](const char* key, const auto& value) {
    if (!IsRopeKey(key) && !FamilyKey(key) && !ZeroAllowed(key)) {
      out[key] = value;
    }
  });
  out["head_dim"] = shape.HeadDim();
  if (family == nullptr || !family->qkv_bias) out["attention_bias"] = false;
  if (family != nullptr && family->sliding_window) {
    out["sliding_window"] = shape.sliding_window > 0 ? json(shape.sliding_window) : json(nullptr);
  }
  const RopeScaling& r = shape.rope_scaling;
  if (r.rope_type == kRopeNone) {
    out["rope_scaling"] = nullptr;
  } else if (r.rope_type == kRopeLinear) {
    out["rope_scaling"] = {{"rope_type", r.rope_type}, {"factor", r.factor}};
  } else {
    out["rope_scaling"] = {
        {"rope_type", r.rope_type},
        {"factor", r.factor},
        {"low_freq_factor", r.low_freq_factor},
        {"high_freq_factor", r.high_freq_factor},
        {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  return out;
}

namespace {

// Reads `name` of `object` into `field`: false when absent or null (an error when required) or
// of the wrong kind (an error naming the file, the key shown and the value).
struct JsonFieldReader {
  const std::string& source;
  std::vector<std::string>& errors;
  template <typename T>
  bool operator()(const json& object, const std::string& shown, const char* name, T* field,
                  bool required) const {
    auto it = object.find(name);
    if (it == object.end() || it->is_null()) {
      if (required) {
        errors.push_back(absl::StrCat(source, ": ", shown, ": missing (a Llama config has it)"));
      }
      return false;
    }
    if (!FromJsonValue(*it, field)) {
      errors.push_back(absl::StrCat(source, ": ", shown, ": ", JsonText(*it), " is not ",
                                    JsonKind(field), " (fix the file)"));
      return false;
    }
    return true;
  }
};

// The family: architectures[0] and model_type, each optional, agreeing when both given;
// llama when neither names one.
const ModelFamily* FamilyOfJson(const json& j, const std::string& source,
                                std::vector<std::string>& errors) {
  const ModelFamily* by_arch = nullptr;
  const ModelFamily* by_type = nullptr;
  bool bad = false;
  auto arch = j.find("architectures");
  if (arch != j.end() && !arch->is_null()) {
    if (!arch->is_array() || arch->size() != 1 || !(*arch)[0].is_string()) {
      errors.push_back(absl::StrCat(source, ": architectures: ", JsonText(*arch),
                                    " is not a list of one architecture name (give one of ",
                                    ArchitectureList(), ")"));
      bad = true;
    } else {
      const std::string name = (*arch)[0].get<std::string>();
      for (const ModelFamily& f : kModelFamilies) {
        if (name == f.architecture) by_arch = &f;
      }
      if (by_arch == nullptr) {
        errors.push_back(absl::StrCat(source, ": architectures: ", Quote(name),
                                      " is not supported (the engine implements ",
                                      ArchitectureList(), ")"));
        bad = true;
      }
    }
  }
  auto type = j.find("model_type");
  if (type != j.end() && !type->is_null()) {
    const std::string name = type->is_string() ? type->get<std::string>() : type->dump();
    for (const ModelFamily& f : kModelFamilies) {
      if (name == f.model_type) by_type = &f;
    }
    if (by_type == nullptr) {
      errors.push_back(absl::StrCat(source, ": model_type: ", Quote(name),
                                    " is not supported (the engine implements ", ArchitectureList(),
                                    ")"));
      bad = true;
    }
  }
  if (!bad && by_arch != nullptr && by_type != nullptr && by_arch != by_type) {
    errors.push_back(absl::StrCat(source, ": model_type: ", Quote(by_type->model_type),
                                  " disagrees with architectures ", Quote(by_arch->architecture),
                                  " (fix the file: ", by_arch->architecture, " has model_type ",
                                  by_arch->model_type, ")"));
  }
  if (by_arch != nullptr) return by_arch;
  if (by_type != nullptr) return by_type;
  return FindModelFamily(kFamilyLlama);
}

// The keys whose meaning depends on the family: attention_bias, sliding_window.
void ReadFamilyKeys(const json& j, const std::string& source, const ModelFamily* family,
                    ModelShape& s, std::vector<std::string>& errors) {
  if (!family->qkv_bias) {
    auto bias = j.find("attention_bias");
    if (bias != j.end() && !bias->is_null() && *bias != false) {
      errors.push_back(absl::StrCat(
          source, ": attention_bias: ", JsonText(*bias), " is not supported for ",
          family->architecture,
          " (it biases q/k/v and o_proj, and the engine has no o_proj bias; use weights "
          "without attention biases)"));
    }
  }
  if (family->sliding_window) {
    auto window = j.find("sliding_window");
    if (window != j.end() && !window->is_null() && !FromJsonValue(*window, &s.sliding_window)) {
      errors.push_back(absl::StrCat(source, ": sliding_window: ", JsonText(*window),
                                    " is not an integer or null (fix the file)"));
    }
  } else {
    auto use = j.find("use_sliding_window");
    if (use != j.end() && !use->is_null() && *use != false) {
      errors.push_back(absl::StrCat(
          source, ": use_sliding_window: ", JsonText(*use), " is not supported for ",
          family->architecture,
          " (the engine attends over the whole causal prefix; use_sliding_window: false is how "
          "these models are published)"));
    }
  }
}

// rope_scaling (an object): {rope_type (or the older "type"), ...}; none or llama3.
void ReadRopeScaling(const json* rope, const JsonFieldReader& read, ModelShape& s) {
  const std::string& source = read.source;
  std::vector<std::string>& errors = read.errors;
  if (!rope->is_object()) {
    errors.push_back(absl::StrCat(source, ": rope_scaling: ", JsonText(*rope),
                                  " is not an object or null (fix the file)"));
  } else {
    std::string type, legacy;
    const bool has_type = read(*rope, "rope_scaling.rope_type", "rope_type", &type, false);
    const bool has_legacy = read(*rope, "rope_scaling.type", "type", &legacy, false);
    if (has_type && has_legacy && type != legacy) {
      errors.push_back(absl::StrCat(source, ": rope_scaling: rope_type ", Quote(type), " and type ",
                                    Quote(legacy), " disagree (keep one of them)"));
    } else if (!has_type && !has_legacy) {
      errors.push_back(absl::StrCat(source,
                                    ": rope_scaling.rope_type: missing (give "
                                    "rope_type: llama3, or rope_scaling: null for none)"));
    }
    if (!has_type) {
      type = legacy;
    }
    if (type == "default" || type == kRopeNone) {
      s.rope_scaling = RopeScaling{};  // transformers' name for no scaling
    } else if (type == kRopeLlama3) {
      RopeScaling& r = s.rope_scaling;
      r.rope_type = kRopeLlama3;
      read(*rope, "rope_scaling.factor", "factor", &r.factor, true);
      read(*rope, "rope_scaling.low_freq_factor", "low_freq_factor", &r.low_freq_factor, true);
      read(*rope, "rope_scaling.high_freq_factor", "high_freq_factor", &r.high_freq_factor, true);
      read(*rope, "rope_scaling.original_max_position_embeddings",
           "original_max_position_embeddings", &r.original_max_position_embeddings, true);
    } else if (type == kRopeLinear) {
      s.rope_scaling = RopeScaling{};
      s.rope_scaling.rope_type = kRopeLinear;
      read(*rope, "rope_scaling.factor", "factor", &s.rope_scaling.factor, true);
    } else if (has_type || has_legacy) {
      errors.push_back(absl::StrCat(
          source, ": rope_scaling.rope_type: ", Quote(type),
          " is not supported (the engine implements RoPE scaling of types llama3 and linear; use "
          "weights whose config.json has one of them or no rope_scaling)"));
    }
  }
}

}  // namespace

absl::StatusOr<ModelShape> ModelShapeFromJson(const nlohmann::json& j, const std::string& source,
                                              JsonDefaults defaults) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", JsonText(j), " is not a JSON object (give a Llama config)"));
  }
  const bool hf = defaults == JsonDefaults::kHfDefaults;
  ModelShape s;
  if (hf) {
    s.rms_norm_eps = 1e-6;  // transformers' LlamaConfig default
  }
  std::vector<std::string> errors;
  bool kv_given = false;
  const JsonFieldReader read{source, errors};
  const ModelFamily* family = FamilyOfJson(j, source, errors);
  s.family = family->name;
  s.attention_bias = family->qkv_bias;
  s.qk_norm = family->qk_norm;
  ReadFamilyKeys(j, source, family, s, errors);
  ForEachShapeField(s, [&](const char* key, auto& value) {
    if (IsRopeKey(key) || FamilyKey(key) || ZeroAllowed(key)) {
      return;
    }
    const std::string k = key;
    const bool always = k == "vocab_size" || k == "hidden_size" || k == "intermediate_size" ||
                        k == "num_hidden_layers" || k == "num_attention_heads";
    const bool got = read(j, k, key, &value, always || !hf);
    if (k == "num_key_value_heads") {
      kv_given = got;
    }
  });
  if (!kv_given) {
    s.num_key_value_heads = s.num_attention_heads;
  }
  // rope_scaling: null/absent = none.
  auto rope = j.find("rope_scaling");
  if (rope != j.end() && !rope->is_null()) ReadRopeScaling(&*rope, read, s);
  RETURN_IF_ERROR(internal::ErrorsToStatus(errors));
  auto head_dim = j.find("head_dim");
  if (head_dim != j.end() && !head_dim->is_null()) {
    int64_t d = 0;
    if (!FromJsonValue(*head_dim, &d)) {
      errors.push_back(absl::StrCat(source, ": head_dim: ", JsonText(*head_dim),
                                    " is not an integer (fix the file)"));
    } else if (d <= 0) {
      errors.push_back(
          absl::StrCat(source, ": head_dim: ", d, " must be > 0 (fix the file, or remove it)"));
    } else if (s.num_attention_heads <= 0 || s.hidden_size % s.num_attention_heads != 0 ||
               d != s.hidden_size / s.num_attention_heads) {
      s.head_dim = d;  // decoupled from hidden / heads (0 keeps the derived width)
    }
  }
  ShapeErrors(s, {}, source + ": ", "fix the file", &errors);
  RETURN_IF_ERROR(internal::ErrorsToStatus(errors));
  return s;
}

absl::StatusOr<ModelShape> ResolveModelShape(const ModelSpec& model, const ModelShape& hf,
                                             const std::string& source) {
  ModelShape out = model;
  for (const std::string& key : model.from_init) {
    CopyField(hf, out, key);
  }
  std::vector<std::string> errors;
  const bool both_llama3 =
      out.rope_scaling.rope_type == kRopeLlama3 && hf.rope_scaling.rope_type == kRopeLlama3;
  for (const std::string& key : ShapeFieldKeys()) {
    if (model.from_init.count(key) != 0 || ShapeFieldEquals(out, hf, key)) {
      continue;
    }
    if (IsRopeKey(key) && key != "rope_scaling.rope_type" && !both_llama3) {
      continue;  // The rope_type line says it; the numbers of another type mean nothing.
    }
    const std::string want = ShapeFieldText(hf, key);
    const std::string fix =
        model.preset.empty()
            ? absl::StrCat("set ", key, ": ", want, ", or leave it out to take it from init_from")
            : absl::StrCat("set ", key, ": ", want, " after preset ", Quote(model.preset),
                           ", or drop the preset to take every field from init_from");
    errors.push_back(absl::StrCat("spec.model.", key, ": ", ShapeFieldText(out, key),
                                  " disagrees with ", want, " in ", source, " (", fix, ")"));
  }
  RETURN_IF_ERROR(internal::ErrorsToStatus(errors));
  RETURN_IF_ERROR(out.Validate());
  return out;
}

absl::Status CheckSlidingWindow(int64_t window, const std::vector<int64_t>& stage_seq_lens,
                                const std::string& source) {
  if (window <= 0) return absl::OkStatus();
  for (size_t i = 0; i < stage_seq_lens.size(); ++i) {
    if (stage_seq_lens[i] > window) {
      return absl::InvalidArgumentError(
          Line("spec.model.sliding_window",
               absl::StrCat(window, source.empty() ? "" : absl::StrCat(" (from ", source, ")")),
               absl::StrCat("is shorter than stages[", i, "].seq_len ", stage_seq_lens[i]),
               "the engine attends over the whole causal prefix, which is sliding-window attention "
               "only when no stage is longer than the window; lower that stage's seq_len, or use "
               "weights without a window (Mistral 7B v0.2 and later have sliding_window: null)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUlyssesHeads(int64_t hq, int64_t hkv, int64_t sp, const std::string& field) {
  if (sp < 1) {
    return absl::InvalidArgumentError(
        Line(field, absl::StrCat(sp), "must be >= 1", "use 1 for no sequence parallelism"));
  }
  if (hq < 1 || hkv < 1) {
    return absl::InvalidArgumentError(Line(
        field, absl::StrCat(sp), absl::StrCat("cannot split ", hq, " query and ", hkv, " kv heads"),
        "num_attention_heads and num_key_value_heads must be >= 1"));
  }
  if (hq % hkv != 0) {
    return absl::InvalidArgumentError(
        Line("num_key_value_heads", absl::StrCat(hkv),
             absl::StrCat("does not divide num_attention_heads ", hq),
             absl::StrCat("each kv head serves a whole group of query heads; use one of ",
                          Divisors(hq))));
  }
  const std::string valid = ValidSpDegrees(hq, hkv);
  if (hq % sp != 0) {
    return absl::InvalidArgumentError(
        Line(field, absl::StrCat(sp), absl::StrCat("does not divide num_attention_heads ", hq),
             absl::StrCat("each rank needs whole query heads, so sp_degree is at most ", hq,
                          "; use one of ", valid)));
  }
  if (hkv % sp != 0 && sp % hkv != 0) {
    return absl::InvalidArgumentError(Line(
        field, absl::StrCat(sp),
        absl::StrCat("is incompatible with num_key_value_heads ", hkv,
                     ": neither divides the other"),
        absl::StrCat("kv heads are sharded when ", hkv, " % sp == 0 or replicated when sp % ", hkv,
                     " == 0; with ", hq, " query and ", hkv, " kv heads use one of ", valid)));
  }
  return absl::OkStatus();
}

int64_t UlyssesKvHeadsExchanged(int64_t hkv, int64_t sp) {
  if (hkv <= 0 || sp <= 0) {
    return hkv > 0 ? hkv : 0;
  }
  return hkv % sp == 0 ? hkv : sp;
}

}  // namespace ulysses::spec
