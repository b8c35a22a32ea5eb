#include "common/spec/model_math.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/spec/model_shape.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"
#include "tests/testing/subprocess.h"

namespace ulysses::spec {
namespace {

// The Python the benches run with (scripts/bootstrap.sh installs python3); -S: no site packages.
constexpr char kPython[] = "/usr/bin/python3";

// What `kPython args...` prints on stdout; a test failure when it does not exit 0.
std::string PythonOutput(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kPython};
  argv.insert(argv.end(), args.begin(), args.end());
  const testing::Result r = testing::Run(argv);
  EXPECT_EQ(r.exit_code, 0) << r.description << "\n" << r.err;
  return r.out;
}

ModelShape Shape(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads,
                 int64_t kv_heads, bool tied) {
  ModelShape s;
  s.vocab_size = vocab;
  s.hidden_size = hidden;
  s.intermediate_size = inter;
  s.num_hidden_layers = layers;
  s.num_attention_heads = heads;
  s.num_key_value_heads = kv_heads;
  s.tie_word_embeddings = tied;
  return s;
}

ModelShape Tiny() { return Shape(100, 8, 16, 2, 2, 1, false); }
ModelShape Llama1B() { return Shape(128256, 2048, 8192, 16, 32, 8, true); }
ModelShape Llama8B() { return Shape(128256, 4096, 14336, 32, 32, 8, false); }

TEST(ModelMathTest, FlopsPerTokenOfTheTinyShapeByHand) {
  // Layer: q 8*2*4 + k,v 2*8*1*4 + o 2*4*8 + MLP 3*8*16 + norms 2*8 = 592; two layers 1184;
  // lm_head 100*8 = 800; 6 * 1984 = 11904; attention 6 * 2 layers * 8 * seq 10 = 960.
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(Tiny(), 10), 11904 + 960);
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(Tiny(), 0), 11904);
}

TEST(ModelMathTest, LmHeadCountsAlsoWhenTied) {
  ModelShape tied = Tiny();
  tied.tie_word_embeddings = true;
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(tied, 10), ModelFlopsPerToken(Tiny(), 10));
  // Llama-3.2-1B at 32k: the lm_head is 6 * 128256 * 2048 of the figure (about 12 %), what the
  // benches used to leave out.
  const double with_head = ModelFlopsPerToken(Llama1B(), 32768);
  const double head = 6.0 * 128256 * 2048;
  EXPECT_GT(head / with_head, 0.10);
  EXPECT_LT(head / with_head, 0.14);
}

TEST(ModelMathTest, RecomputeAddsWhatTheMemoryOptionsRunAgain) {
  const ModelShape s = Tiny();
  EXPECT_DOUBLE_EQ(RecomputeFlopsPerToken(s, 10, {}), 0);
  // One more forward: 2 * 1184 parameters' FLOPs + the forward third of attention 2 * 2 * 8 * 10.
  EXPECT_DOUBLE_EQ(RecomputeFlopsPerToken(s, 10, {true, false, false}), 2368 + 320);
  // Checkpointing already reruns the MLP: tiled_mlp adds nothing more.
  EXPECT_DOUBLE_EQ(RecomputeFlopsPerToken(s, 10, {true, true, false}), 2368 + 320);
  EXPECT_DOUBLE_EQ(RecomputeFlopsPerToken(s, 10, {false, true, false}), 2 * 2 * 3 * 8 * 16);
  EXPECT_DOUBLE_EQ(RecomputeFlopsPerToken(s, 10, {false, false, true}), 2 * 100 * 8);
  // Kept attention outputs: the layers again without attention's forward third.
  EXPECT_DOUBLE_EQ(RecomputeFlopsPerToken(s, 10, {true, false, false, true}), 2368);
}

TEST(ModelMathTest, MfuIsModelFlopsOverDevicesTimesPeak) {
  // 1e6 FLOPs per token x 4e5 tokens/s over 4 devices x 1e12 peak = 0.1.
  std::optional<double> mfu = Mfu(1e6, 4e5, 4, 1e12);
  ASSERT_TRUE(mfu.has_value());
  EXPECT_DOUBLE_EQ(*mfu, 0.1);
  EXPECT_FALSE(Mfu(1e6, 4e5, 4, 0).has_value()) << "unknown peak";
  EXPECT_FALSE(Mfu(0, 4e5, 4, 1e12).has_value()) << "unknown FLOPs per token";
  EXPECT_FALSE(Mfu(1e6, 4e5, 0, 1e12).has_value()) << "no devices";
  EXPECT_FALSE(Mfu(1e6, std::numeric_limits<double>::infinity(), 4, 1e12).has_value());
}

// The FLOP-rate form (the worker's gauge) is the same ratio: Mfu is MfuOfFlopRate of the product.
TEST(ModelMathTest, MfuOfFlopRateIsMfuOfTheProduct) {
  std::optional<double> rate = MfuOfFlopRate(1e6 * 4e5, 4, 1e12);
  ASSERT_TRUE(rate.has_value());
  EXPECT_DOUBLE_EQ(*rate, *Mfu(1e6, 4e5, 4, 1e12));
  EXPECT_DOUBLE_EQ(*MfuOfFlopRate(2.5e11, 1, 1e12), 0.25);
  EXPECT_FALSE(MfuOfFlopRate(2.5e11, 1, 0).has_value()) << "unknown peak";
  EXPECT_FALSE(MfuOfFlopRate(2.5e11, 0, 1e12).has_value()) << "no devices";
  EXPECT_FALSE(MfuOfFlopRate(-1, 1, 1e12).has_value()) << "negative rate";
  EXPECT_FALSE(MfuOfFlopRate(std::numeric_limits<double>::quiet_NaN(), 1, 1e12).has_value());
}

// bench/gpu/model_math.py (hf_bench.py's formula) gives the same figures as this one.
TEST(ModelMathTest, PythonCopyAgreesWithTheCxxDefinition) {
  const char* source = std::getenv("ULYSSES_SOURCE_DIR");
  if (source == nullptr) GTEST_SKIP() << "ULYSSES_SOURCE_DIR unset (run through ctest)";
  if (!testing::IsExecutable(kPython)) GTEST_SKIP() << kPython << " missing";
  // One python run (-S: no site packages) for every case: [[shape, seq_len], ...].
  std::vector<std::pair<ModelShape, int64_t>> cases;
  for (const ModelShape& s : {Tiny(), Llama1B(), Llama8B()}) {
    for (int64_t seq : {int64_t{10}, int64_t{8192}, int64_t{131072}}) cases.emplace_back(s, seq);
  }
  std::string json = "[";
  for (const auto& [s, seq] : cases) {
    absl::StrAppend(
        &json, json.size() > 1 ? ", " : "",
        absl::StrFormat("[{\"vocab_size\": %d, \"hidden_size\": %d, "
                        "\"intermediate_size\": %d, \"num_hidden_layers\": %d, "
                        "\"num_attention_heads\": %d, \"num_key_value_heads\": %d}, %d]",
                        s.vocab_size, s.hidden_size, s.intermediate_size, s.num_hidden_layers,
                        s.num_attention_heads, s.num_key_value_heads, seq));
  }
  json += "]";
  const std::string out =
      PythonOutput({"-S", absl::StrCat(source, "/bench/gpu/model_math.py"), json});
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), cases.size()) << out;
  for (size_t i = 0; i < cases.size(); ++i) {
    double python = 0;
    ASSERT_TRUE(absl::SimpleAtod(lines[i], &python)) << lines[i];
    EXPECT_DOUBLE_EQ(python, ModelFlopsPerToken(cases[i].first, cases[i].second))
        << "case " << i << " seq " << cases[i].second;
  }
}

// bench/gpu/hf_bench.py builds transformers' model from its own SHAPES (it cannot link the C++):
// they are the spec presets engine_bench takes, field for field (rope scaling aside: it changes
// the inverse frequencies computed once, not a step's work).
TEST(ModelMathTest, HfBenchShapesAreTheSpecPresets) {
  const char* source = std::getenv("ULYSSES_SOURCE_DIR");
  if (source == nullptr) GTEST_SKIP() << "ULYSSES_SOURCE_DIR unset (run through ctest)";
  if (!testing::IsExecutable(kPython)) GTEST_SKIP() << kPython << " missing";
  // The SHAPES literal, read without importing the file (it imports torch and transformers).
  const std::string out = PythonOutput(
      {"-S", "-c",
       "import ast, json, sys\n"
       "for n in ast.parse(open(sys.argv[1]).read()).body:\n"
       "    if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'SHAPES':\n"
       "        print(json.dumps(ast.literal_eval(n.value)))",
       absl::StrCat(source, "/bench/gpu/hf_bench.py")});
  const nlohmann::json shapes = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(shapes.is_object()) << out;
  const std::pair<const char*, const char*> kNames[] = {{"llama3.2-1b", "llama3-1b"},
                                                        {"llama3.1-8b", "llama3-8b"}};
  ASSERT_EQ(shapes.size(), std::size(kNames)) << out;
  for (const auto& [hf_name, preset] : kNames) {
    SCOPED_TRACE(hf_name);
    ASSERT_TRUE(shapes.contains(hf_name)) << out;
    const nlohmann::json& h = shapes[hf_name];
    ModelSpec m;
    m.preset = preset;
    ASSERT_TRUE(ApplyModelPreset(m).ok());
    EXPECT_EQ(h.value("vocab_size", 0), m.vocab_size);
    EXPECT_EQ(h.value("hidden_size", 0), m.hidden_size);
    EXPECT_EQ(h.value("intermediate_size", 0), m.intermediate_size);
    EXPECT_EQ(h.value("num_hidden_layers", 0), m.num_hidden_layers);
    EXPECT_EQ(h.value("num_attention_heads", 0), m.num_attention_heads);
    EXPECT_EQ(h.value("num_key_value_heads", 0), m.num_key_value_heads);
    EXPECT_EQ(h.value("head_dim", 0), m.hidden_size / m.num_attention_heads);
    EXPECT_EQ(h.value("rope_theta", 0.0), m.rope_theta);
    EXPECT_EQ(h.value("rms_norm_eps", 0.0), m.rms_norm_eps);
    EXPECT_EQ(h.value("tie_word_embeddings", !m.tie_word_embeddings), m.tie_word_embeddings);
  }
}

}  // namespace
}  // namespace ulysses::spec
