// common/spec/model_shape: the field list, JSON (config.json / checkpoint
// model_config) read and write, init_from resolution against config.json, and the
// Ulysses head rule.
#include "common/spec/model_shape.h"

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ulysses::spec {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// Meta's Llama-3.1-8B config.json, as published (keys the engine ignores included).
constexpr char kLlama31_8b[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Meta's Llama-3.2-1B config.json (has head_dim, tied embeddings, factor 32).
constexpr char kLlama32_1b[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
})";

ModelSpec Preset(const std::string& name) {
  ModelSpec m;
  m.preset = name;
  EXPECT_TRUE(ApplyModelPreset(m).ok());
  return m;
}

void ExpectShapeEq(const ModelShape& a, const ModelShape& b) {
  for (const std::string& key : ShapeFieldKeys()) {
    EXPECT_TRUE(ShapeFieldEquals(a, b, key))
        << key << ": " << ShapeFieldText(a, key) << " != " << ShapeFieldText(b, key);
  }
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ModelShapeTest, FieldListCoversEveryMember) {
  // Structured bindings need exactly one name per data member: adding a member to
  // ModelShape or RopeScaling breaks this line until the field list (and this
  // test) name it too.
  const ModelShape shape;
  const auto& [family, vocab, hidden, inter, layers, heads, kv, head_dim, theta, eps, tied, bias,
               qk_norm, window, rope] = shape;
  const auto& [type, factor, low, high, original] = rope;
  (void)vocab, (void)hidden, (void)inter, (void)layers, (void)heads, (void)kv, (void)theta;
  (void)eps, (void)tied, (void)type, (void)factor, (void)low, (void)high, (void)original;
  (void)family, (void)head_dim, (void)bias, (void)qk_norm, (void)window;
  EXPECT_EQ(ShapeFieldKeys().size(), 14u + 5u);
  // Each key reaches its own field.
  ModelShape a, b;
  int n = 0;
  ForEachShapeField(b, [&](const char* key, auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::string>) {
      value = "changed";
    } else if constexpr (std::is_same_v<T, bool>) {
      value = !value;
    } else {
      value += 1 + n;
    }
    ++n;
    EXPECT_FALSE(ShapeFieldEquals(a, b, key)) << key;
  });
  EXPECT_EQ(b.family, "changed");
  EXPECT_EQ(b.vocab_size, 2);
  EXPECT_EQ(b.rope_scaling.original_max_position_embeddings, 19);
  EXPECT_EQ(b.rope_scaling.rope_type, "changed");
}

TEST(ModelShapeTest, Llama31ConfigJsonReadsAsThePreset) {
  absl::StatusOr<ModelShape> shape = ModelShapeFromJson(json::parse(kLlama31_8b), "8b/config.json");
  ASSERT_TRUE(shape.ok()) << shape.status();
  ExpectShapeEq(*shape, Preset("llama3-8b"));
  shape = ModelShapeFromJson(json::parse(kLlama32_1b), "1b/config.json");
  ASSERT_TRUE(shape.ok()) << shape.status();
  ExpectShapeEq(*shape, Preset("llama3-1b"));
}

// The published config.json of each family's model (keys the engine ignores included).
constexpr char kQwen25_7b[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_mrope": false,
  "use_sliding_window": false, "vocab_size": 152064
})";
constexpr char kQwen3_4b[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 9728,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";
constexpr char kMistral7b03[] = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
  "use_cache": true, "vocab_size": 32768
})";

TEST(ModelShapeTest, EachFamilysConfigJsonReadsAsItsPreset) {
  absl::StatusOr<ModelShape> qwen25 = ModelShapeFromJson(json::parse(kQwen25_7b), "q");
  ASSERT_TRUE(qwen25.ok()) << qwen25.status();
  ExpectShapeEq(*qwen25, Preset("qwen2.5-7b"));
  EXPECT_EQ(qwen25->family, "qwen2");
  EXPECT_TRUE(qwen25->attention_bias);   // Qwen2's q/k/v biases: no config key, always there
  EXPECT_EQ(qwen25->sliding_window, 0);  // use_sliding_window false: no window

  absl::StatusOr<ModelShape> qwen3 = ModelShapeFromJson(json::parse(kQwen3_4b), "q3");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  ExpectShapeEq(*qwen3, Preset("qwen3-4b"));
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_EQ(qwen3->HeadDim(), 128);  // not 2560 / 32 = 80
  // Qwen3-8B: head_dim 128 = 4096 / 32, still qwen3 (its q_norm / k_norm are not dropped).
  json q8 = json::parse(kQwen3_4b);
  q8.merge_patch(
      {{"hidden_size", 4096}, {"intermediate_size", 12288}, {"tie_word_embeddings", false}});
  absl::StatusOr<ModelShape> qwen3_8b = ModelShapeFromJson(q8, "q8");
  ASSERT_TRUE(qwen3_8b.ok()) << qwen3_8b.status();
  ExpectShapeEq(*qwen3_8b, Preset("qwen3-8b"));
  EXPECT_EQ(qwen3_8b->family, "qwen3");

  absl::StatusOr<ModelShape> mistral = ModelShapeFromJson(json::parse(kMistral7b03), "m");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  ExpectShapeEq(*mistral, Preset("mistral-7b-v0.3"));
  json windowed = json::parse(kMistral7b03);
  windowed["sliding_window"] = 4096;  // Mistral 7B v0.1
  mistral = ModelShapeFromJson(windowed, "m");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->sliding_window, 4096);

  // The export names the family again: architectures, model_type, and no attention_bias key for
  // qwen2 (whose biases have none).
  const json out = ModelShapeToJson(*qwen25);
  EXPECT_EQ(out.at("architectures"), json({"Qwen2ForCausalLM"}));
  EXPECT_EQ(out.at("model_type"), "qwen2");
  EXPECT_FALSE(out.contains("attention_bias"));
  EXPECT_EQ(ModelShapeToJson(*qwen3).at("head_dim"), 128);
  EXPECT_TRUE(ModelShapeToJson(*mistral).at("sliding_window") == 4096);
}

TEST(ModelShapeTest, FamilyFieldsAreValidatedAgainstTheFamily) {
  ModelShape s = Preset("tiny");
  s.family = "gemma";
  EXPECT_THAT(Message(s.Validate()),
              HasSubstr("spec.model.family: 'gemma' is not a supported model family (use one "
                        "of llama, mistral, qwen2, qwen3)"));
  s = Preset("tiny");
  s.attention_bias = true;
  EXPECT_THAT(Message(s.Validate()),
              HasSubstr("spec.model.attention_bias: true is not what family 'llama' has"));
  s = Preset("qwen3-4b");
  s.qk_norm = false;
  EXPECT_THAT(Message(s.Validate()),
              HasSubstr("spec.model.qk_norm: false is not what family 'qwen3' has (family qwen3 "
                        "always normalises q and k per head"));
  s = Preset("qwen3-4b");
  s.head_dim = 129;
  EXPECT_THAT(Message(s.Validate()), HasSubstr("spec.model.head_dim: 129 is odd"));
  s = Preset("tiny");
  s.sliding_window = 64;
  EXPECT_THAT(Message(s.Validate()),
              HasSubstr("spec.model.sliding_window: 64 is set but family 'llama' has no "
                        "sliding-window attention"));
  // A decoupled head_dim lifts the hidden / heads rule (Qwen3-4B's 2560 / 32 = 80 is unused).
  s = Preset("qwen3-4b");
  s.hidden_size = 3000;
  EXPECT_TRUE(s.Validate().ok()) << s.Validate();
  // The family's features follow the family when the document does not state them.
  ModelSpec spec = Preset("tiny");
  spec.family = "qwen2";
  FinishModelSpec(spec, {"family"});
  EXPECT_TRUE(spec.attention_bias);
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
  EXPECT_TRUE(ShapeFieldShown(spec, "family"));
  EXPECT_FALSE(ShapeFieldShown(spec, "attention_bias"));  // the family's: not written
}

TEST(ModelShapeTest, JsonRoundTripsEveryPreset) {
  for (const std::string& name : ModelPresetNames()) {
    SCOPED_TRACE(name);
    const ModelSpec preset = Preset(name);
    const json j = ModelShapeToJson(preset);
    EXPECT_EQ(j.at("head_dim"), preset.HeadDim());
    EXPECT_EQ(j.at("rope_scaling").is_null(), preset.rope_scaling.rope_type == "none");
    absl::StatusOr<ModelShape> back = ModelShapeFromJson(j, "x", JsonDefaults::kRequireAll);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectShapeEq(*back, preset);
  }
}

TEST(ModelShapeTest, JsonDefaultsAndRopeTypeSpellings) {
  const json base = {{"vocab_size", 64},
                     {"hidden_size", 32},
                     {"intermediate_size", 48},
                     {"num_hidden_layers", 2},
                     {"num_attention_heads", 4}};
  absl::StatusOr<ModelShape> shape = ModelShapeFromJson(base, "c");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_key_value_heads, 4);  // = heads
  EXPECT_EQ(shape->rms_norm_eps, 1e-6);      // transformers' LlamaConfig default
  EXPECT_EQ(shape->rope_theta, 10000.0);
  EXPECT_EQ(shape->rope_scaling.rope_type, "none");
  // Our own checkpoints must say everything (rope_scaling may predate it).
  EXPECT_THAT(Message(ModelShapeFromJson(base, "ckpt", JsonDefaults::kRequireAll).status()),
              HasSubstr("ckpt: num_key_value_heads: missing"));
  // The older "type" key and transformers' "default" are understood.
  json legacy = base;
  legacy["rope_scaling"] = {{"type", "llama3"},
                            {"factor", 8},
                            {"low_freq_factor", 1},
                            {"high_freq_factor", 4},
                            {"original_max_position_embeddings", 8192}};
  shape = ModelShapeFromJson(legacy, "c");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(shape->rope_scaling.factor, 8.0);
  json plain = base;
  plain["rope_scaling"] = {{"rope_type", "default"}};
  shape = ModelShapeFromJson(plain, "c");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rope_scaling.rope_type, "none");
  // linear (position interpolation): the factor alone, read and written back as transformers
  // writes it.
  json linear = base;
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  shape = ModelShapeFromJson(linear, "c");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rope_scaling.rope_type, "linear");
  EXPECT_EQ(shape->rope_scaling.factor, 2.0);
  EXPECT_EQ(ModelShapeToJson(*shape)["rope_scaling"],
            json({{"rope_type", "linear"}, {"factor", 2.0}}));
}

TEST(ModelShapeTest, JsonErrorsNameSourceFieldAndValue) {
  const json base = json::parse(kLlama31_8b);
  struct Case {
    const char* name;
    json patch;  // merged into the Llama 3.1 config
    const char* expected;
  } cases[] = {
      {"yarn",
       {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}},
       "f: rope_scaling.rope_type: 'yarn' is not supported (the engine implements RoPE scaling of "
       "types llama3 and linear"},
      {"linear_without_factor",
       {{"rope_scaling", {{"type", "linear"}}}},
       "f: rope_scaling.factor: missing"},
      {"types_disagree",
       {{"rope_scaling", {{"type", "linear"}, {"rope_type", "llama3"}}}},
       "f: rope_scaling: rope_type 'llama3' and type 'linear' disagree"},
      {"no_type", {{"rope_scaling", {{"factor", 8.0}}}}, "f: rope_scaling.rope_type: missing"},
      {"missing_factor",
       {{"rope_scaling",
         {{"rope_type", "llama3"},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", 8192}}}},
       "f: rope_scaling.factor: missing"},
      {"factor_text",
       {{"rope_scaling", {{"rope_type", "llama3"}, {"factor", "8"}}}},
       "f: rope_scaling.factor: \"8\" is not a number"},
      {"rope_scaling_list",
       {{"rope_scaling", {1, 2}}},
       "f: rope_scaling: [1,2] is not an object or null"},
      {"high_below_low",
       {{"rope_scaling",
         {{"rope_type", "llama3"},
          {"factor", 8.0},
          {"low_freq_factor", 4.0},
          {"high_freq_factor", 1.0},
          {"original_max_position_embeddings", 8192}}}},
       "f: rope_scaling.high_freq_factor: 1.0 must be greater than low_freq_factor 4.0"},
      {"heads_text",
       {{"num_attention_heads", "32"}},
       "f: num_attention_heads: \"32\" is not an integer"},
      {"heads_float",
       {{"num_attention_heads", 32.5}},
       "f: num_attention_heads: 32.5 is not an integer"},
      {"heads_zero", {{"num_attention_heads", 0}}, "f: num_attention_heads: 0 must be > 0"},
      {"head_dim_odd", {{"head_dim", 127}}, "f: head_dim: 127 is odd"},
      {"head_dim_zero", {{"head_dim", 0}}, "f: head_dim: 0 must be > 0"},
      {"architecture",
       {{"architectures", {"GPT2LMHeadModel"}}},
       "f: architectures: 'GPT2LMHeadModel' is not supported (the engine implements "
       "LlamaForCausalLM (llama), MistralForCausalLM (mistral), Qwen2ForCausalLM (qwen2), "
       "Qwen3ForCausalLM (qwen3))"},
      {"model_type", {{"model_type", "gemma"}}, "f: model_type: 'gemma' is not supported"},
      {"type_disagrees",
       {{"model_type", "qwen3"}},
       "f: model_type: 'qwen3' disagrees with architectures 'LlamaForCausalLM'"},
      {"llama_bias",
       {{"attention_bias", true}},
       "f: attention_bias: true is not supported for LlamaForCausalLM"},
      {"qwen_window",
       {{"architectures", {"Qwen2ForCausalLM"}},
        {"model_type", "qwen2"},
        {"use_sliding_window", true}},
       "f: use_sliding_window: true is not supported for Qwen2ForCausalLM"},
      {"kv_not_dividing",
       {{"num_key_value_heads", 5}},
       "f: num_key_value_heads: 5 does not divide num_attention_heads 32"},
      {"tie_text",
       {{"tie_word_embeddings", "no"}},
       "f: tie_word_embeddings: \"no\" is not a boolean"},
      {"huge",
       {{"vocab_size", 18446744073709551615ULL}},
       "f: vocab_size: 18446744073709551615 is not an integer"},
      {"missing_hidden", {{"hidden_size", nullptr}}, "f: hidden_size: missing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    json j = base;
    j.merge_patch(c.patch);
    if (c.patch.contains("rope_scaling") && c.patch["rope_scaling"].is_object()) {
      j["rope_scaling"] = c.patch["rope_scaling"];  // replace, not merge
    }
    absl::StatusOr<ModelShape> shape = ModelShapeFromJson(j, "f");
    ASSERT_FALSE(shape.ok());
    EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(shape.status()), HasSubstr(c.expected));
  }
  EXPECT_THAT(Message(ModelShapeFromJson(json::array(), "f").status()),
              HasSubstr("f: [] is not a JSON object"));
}

TEST(ModelShapeTest, PresetThatDisagreesWithConfigJsonNamesFieldAndBothValues) {
  // Llama 3 (not 3.1) 8B: no rope_scaling. The llama3-8b preset is Llama 3.1's.
  json llama3 = json::parse(kLlama31_8b);
  llama3["rope_scaling"] = nullptr;
  llama3["rope_theta"] = 250000.0;
  absl::StatusOr<ModelShape> hf = ModelShapeFromJson(llama3, "/m/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  ModelSpec spec = Preset("llama3-8b");
  spec.init_from = "/m";
  absl::StatusOr<ModelShape> resolved = ResolveModelShape(spec, *hf, "/m/config.json");
  ASSERT_FALSE(resolved.ok());
  const std::string message = Message(resolved.status());
  EXPECT_THAT(message, HasSubstr("spec.model.rope_theta: 500000.0 disagrees with 250000.0 in "
                                 "/m/config.json (set rope_theta: 250000.0 after preset "
                                 "'llama3-8b', or drop the preset to take every field from "
                                 "init_from)"));
  EXPECT_THAT(message, HasSubstr("spec.model.rope_scaling.rope_type: 'llama3' disagrees with "
                                 "'none' in /m/config.json"));
  // One line per field: the scaling numbers of a type config.json does not have add nothing.
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 1) << message;
  EXPECT_THAT(message, ::testing::Not(HasSubstr("rope_scaling.factor")));

  // Agreeing numbers but another scaling factor: that number is named.
  hf = ModelShapeFromJson(json::parse(kLlama31_8b), "/m/config.json");
  ASSERT_TRUE(hf.ok());
  spec.rope_scaling.factor = 16.0;
  EXPECT_THAT(Message(ResolveModelShape(spec, *hf, "/m/config.json").status()),
              HasSubstr("spec.model.rope_scaling.factor: 16.0 disagrees with 8.0 in "
                        "/m/config.json"));
  spec.rope_scaling.factor = 8.0;
  resolved = ResolveModelShape(spec, *hf, "/m/config.json");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ExpectShapeEq(*resolved, *hf);
}

TEST(ModelShapeTest, UnsetFieldsFillFromConfigJson) {
  absl::StatusOr<ModelShape> hf = ModelShapeFromJson(json::parse(kLlama32_1b), "c");
  ASSERT_TRUE(hf.ok()) << hf.status();
  ModelSpec spec;
  spec.init_from = "/m";
  spec.num_hidden_layers = 16;  // given, agrees
  FinishModelSpec(spec, {"num_hidden_layers"});
  EXPECT_EQ(spec.from_init.size(), ShapeFieldKeys().size() - 1);
  absl::StatusOr<ModelShape> resolved = ResolveModelShape(spec, *hf, "c");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ExpectShapeEq(*resolved, *hf);
  // A given field that disagrees, without a preset: the fix is to leave it out.
  spec.num_hidden_layers = 12;
  EXPECT_THAT(Message(ResolveModelShape(spec, *hf, "c").status()),
              HasSubstr("spec.model.num_hidden_layers: 12 disagrees with 16 in c (set "
                        "num_hidden_layers: 16, or leave it out to take it from init_from)"));
}

TEST(ModelShapeTest, UlyssesHeadRule) {
  EXPECT_TRUE(CheckUlyssesHeads(32, 8, 8).ok());   // kv sharded
  EXPECT_TRUE(CheckUlyssesHeads(32, 8, 32).ok());  // kv replicated 4x
  EXPECT_TRUE(CheckUlyssesHeads(8, 2, 4).ok());
  EXPECT_TRUE(CheckUlyssesHeads(8, 8, 1).ok());
  EXPECT_EQ(Message(CheckUlyssesHeads(8, 8, 3)),
            "sp_degree: 3 does not divide num_attention_heads 8 (each rank needs whole query "
            "heads, so sp_degree is at most 8; use one of 1, 2, 4, 8)");
  EXPECT_EQ(Message(CheckUlyssesHeads(12, 6, 4, "spec.stages[1].sp_degree")),
            "spec.stages[1].sp_degree: 4 is incompatible with num_key_value_heads 6: neither "
            "divides the other (kv heads are sharded when 6 % sp == 0 or replicated when sp % 6 "
            "== 0; with 12 query and 6 kv heads use one of 1, 2, 3, 6, 12)");
  EXPECT_THAT(Message(CheckUlyssesHeads(8, 3, 2)),
              HasSubstr("num_key_value_heads: 3 does not divide num_attention_heads 8"));
  EXPECT_THAT(Message(CheckUlyssesHeads(8, 2, 0)), HasSubstr("sp_degree: 0 must be >= 1"));
  EXPECT_THAT(Message(CheckUlyssesHeads(0, 2, 2)), HasSubstr("cannot split 0 query and 2 kv"));
  EXPECT_EQ(CheckUlyssesHeads(8, 3, 2).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(UlyssesKvHeadsExchanged(8, 4), 8);    // sharded: 2 per rank
  EXPECT_EQ(UlyssesKvHeadsExchanged(8, 32), 32);  // replicated: one copy per rank
  EXPECT_EQ(UlyssesKvHeadsExchanged(2, 4), 4);
  EXPECT_EQ(UlyssesKvHeadsExchanged(0, 4), 0);  // unknown shape
}

TEST(ModelShapeTest, ValidateCollectsEveryProblem) {
  ModelShape s = Preset("tiny");
  EXPECT_TRUE(s.Validate().ok());
  s.vocab_size = 0;
  s.num_key_value_heads = 3;
  s.rms_norm_eps = 0;
  const std::string message = Message(s.Validate());
  EXPECT_THAT(message, HasSubstr("spec.model.vocab_size: 0 must be > 0"));
  EXPECT_THAT(message, HasSubstr("spec.model.num_key_value_heads: 3 does not divide"));
  EXPECT_THAT(message, HasSubstr("spec.model.rms_norm_eps: 0.0 must be > 0"));
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 2) << message;
}

}  // namespace
}  // namespace ulysses::spec
