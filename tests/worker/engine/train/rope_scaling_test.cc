// Llama 3 RoPE scaling and init_from's config.json, end to end through the ulysses-train
// binary and the independent reference (scripts/reference_llama.py), in float64:
//   - an HF directory with rope_scaling llama3 and sharp random weights: `eval --init-from`
//     (shape taken from config.json) == the reference; the same weights without the
//     scaling give a clearly different loss, so the equality is about the scaling;
//   - train from it at sp 4, export: the checkpoint and the exported config.json keep the
//     scaling; the exported directory's reference loss == `eval --init-from` of it, and
//     == `eval --checkpoint` up to the export's F32 rounding;
//   - a spec (preset or explicit fields) that disagrees with config.json is refused
//     with exit 2, naming the field and both values, before any weight is read.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/file_tree.h"
#include "tests/testing/documents.h"
#include "tests/testing/files.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "worker/engine/hf/hf.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using ::ulysses::testing::ReadFile;
using ::ulysses::testing::Result;
using ::ulysses::testing::RunTrainer;
using ::ulysses::testing::WriteRandomTokens;

// The reference loss of an HF directory on the token file (float64).
double ReferenceLoss(const fs::path& hf, const fs::path& tokens) {
  Result r = ::ulysses::testing::RunReferenceLlama(hf.string(), tokens.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  if (j.is_discarded() || !j.contains("loss")) {
    ADD_FAILURE() << "reference printed: " << r.out;
    return NAN;
  }
  return j["loss"].get<double>();
}

// The loss of `ulysses-train eval` (its first stdout line).
double EvalLoss(const Result& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out.substr(0, r.out.find('\n')), nullptr, false);
  if (j.is_discarded() || !j.contains("loss")) {
    ADD_FAILURE() << "eval printed: " << r.out << r.err;
    return NAN;
  }
  return j["loss"].get<double>();
}

// d = 16, so with original_max_position_embeddings 32 one frequency is kept (wavelength
// 6.3 < 32/4), one is blended (19.9) and six are divided by the factor (> 32).
spec::ModelShape ScaledShape() {
  spec::ModelShape m;
  m.vocab_size = 64;
  m.hidden_size = 64;
  m.intermediate_size = 96;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.rope_theta = 10000.0;
  m.rms_norm_eps = 1e-5;
  m.rope_scaling = {"llama3", 4.0, 1.0, 4.0, 32};
  return m;
}

// Random weights large enough that attention depends on position (hence on RoPE).
std::vector<NamedTensor> SharpWeights(const spec::ModelShape& m) {
  torch::manual_seed(11);
  std::vector<NamedTensor> w;
  for (const auto& [name, shape] : HfLlamaShapes(m)) {
    const bool norm = name.find("norm") != std::string::npos;
    w.push_back({name, norm ? torch::ones(shape) : torch::randn(shape) * 0.35});
  }
  return w;
}

class RopeScalingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::ulysses::testing::FreshTestDir("ulysses-rope");
    ASSERT_TRUE(WriteRandomTokens(dir_ / "train.bin", 4096, 1));
    ASSERT_TRUE(WriteRandomTokens(dir_ / "val.bin", 512, 2));
  }
  void TearDown() override {
    if (!HasFailure()) ulysses::RemoveTree(dir_).IgnoreError();
  }

  // A job on the token files with `model` as its spec.model (flow YAML).
  std::string Job(const std::string& name, const std::string& model) {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata: {name: rope}\n"
                           "spec:\n  model: "
                        << model << "\n  data: {train: " << (dir_ / "train.bin").string()
                        << ", validation: " << (dir_ / "val.bin").string()
                        << "}\n  memory: {attention_block_size: 32}\n"
                           "  optimizer: {lr: 1.0e-3, warmup_steps: 0}\n"
                           "  stages: [{seq_len: 128, steps: 2}]\n  seed: 3\n";
    return path;
  }

  fs::path dir_;
};

TEST_F(RopeScalingTest, Llama3ScalingMatchesTheReferenceThroughEvalTrainAndExport) {
  const spec::ModelShape shape = ScaledShape();
  const auto weights = SharpWeights(shape);
  ASSERT_TRUE(WriteHfDirectory((dir_ / "init").string(), shape, weights).ok());
  spec::ModelShape plain = shape;
  plain.rope_scaling = {};
  ASSERT_TRUE(WriteHfDirectory((dir_ / "plain").string(), plain, weights).ok());
  const json written = json::parse(ReadFile(dir_ / "init" / "config.json"));
  ASSERT_EQ(written["rope_scaling"]["rope_type"], "llama3") << written.dump();

  // The whole shape (with the scaling) comes from config.json.
  const std::string job =
      Job("job", "{init_from: " + (dir_ / "init").string() + ", dtype: float64}");
  const double ours = EvalLoss(RunTrainer({"eval", "-f", job}));
  const double ref = ReferenceLoss(dir_ / "init", dir_ / "val.bin");
  const double ref_plain = ReferenceLoss(dir_ / "plain", dir_ / "val.bin");
  ASSERT_TRUE(std::isfinite(ours) && std::isfinite(ref) && std::isfinite(ref_plain));
  EXPECT_NEAR(ours, ref, 1e-9 * ref);
  // Without the scaling the loss is another number: the match above is about the scaling.
  EXPECT_GT(std::abs(ref - ref_plain), 1e-3 * ref) << ref << " vs unscaled " << ref_plain;

  // Train from it (4 ranks), export: the scaling survives the checkpoint and the export.
  Result train = RunTrainer({"train", "-f", job, "--out", (dir_ / "run").string(), "--set",
                             "spec.parallelism.sp_degree=4"});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  std::string ckpt;
  for (const auto& e : fs::directory_iterator(dir_ / "run" / "checkpoints")) {
    ckpt = std::max(ckpt, e.path().string());
  }
  ASSERT_FALSE(ckpt.empty());
  Result exported = RunTrainer(
      {"export", "--checkpoint", ckpt, "--hf-out", (dir_ / "out").string(), "--dtype", "fp32"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const json out = json::parse(ReadFile(dir_ / "out" / "config.json"));
  EXPECT_EQ(out["rope_scaling"], written["rope_scaling"]);
  // The export is F32 (--dtype; the job is fp64): the reference and `eval --init-from` read the
  // same F32 weights and agree exactly; the checkpoint agrees to F32 rounding.
  const double exported_ours =
      EvalLoss(RunTrainer({"eval", "-f", job, "--init-from", (dir_ / "out").string()}));
  const double trained_ref = ReferenceLoss(dir_ / "out", dir_ / "val.bin");
  EXPECT_NEAR(exported_ours, trained_ref, 1e-9 * trained_ref);
  const double trained = EvalLoss(RunTrainer({"eval", "-f", job, "--checkpoint", ckpt}));
  EXPECT_NEAR(trained, trained_ref, 1e-6 * trained_ref);
  EXPECT_NE(trained, ours);  // it did train
}

TEST_F(RopeScalingTest, SpecThatDisagreesWithConfigJsonIsRefusedNamingTheField) {
  // Only config.json: the shape is checked before any weight is read.
  fs::create_directories(dir_ / "llama31");
  json config = spec::ModelShapeToJson(ScaledShape());
  config["architectures"] = {"LlamaForCausalLM"};
  config["torch_dtype"] = "bfloat16";
  std::ofstream(dir_ / "llama31" / "config.json") << config.dump(2);
  const std::string config_path = (dir_ / "llama31" / "config.json").string();

  // The silent bug this guards against: the same shape without the scaling.
  const std::string explicit_shape =
      "{vocab_size: 64, hidden_size: 64, intermediate_size: 96, num_hidden_layers: 2, "
      "num_attention_heads: 4, num_key_value_heads: 2, dtype: float64}";
  Result r = RunTrainer(
      {"eval", "-f", Job("explicit", explicit_shape), "--init-from", (dir_ / "llama31").string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("spec.model.rope_scaling.rope_type: 'none' disagrees with 'llama3' in " +
                       config_path),
            std::string::npos)
      << r.err;

  // A preset: every field it sets is checked; each disagreement is one line.
  Result p =
      RunTrainer({"eval", "-f",
                  Job("preset", "{preset: tiny, init_from: " + (dir_ / "llama31").string() + "}")});
  EXPECT_EQ(p.exit_code, 2) << p.err;
  EXPECT_NE(p.err.find("spec.model.vocab_size: 256 disagrees with 64 in " + config_path +
                       " (set vocab_size: 64 after preset 'tiny', or drop the preset to take "
                       "every field from init_from)"),
            std::string::npos)
      << p.err;
  EXPECT_NE(p.err.find("spec.model.num_hidden_layers: 4 disagrees with 2"), std::string::npos)
      << p.err;
  EXPECT_NE(p.err.find("spec.model.rope_scaling.rope_type: 'none' disagrees with 'llama3'"),
            std::string::npos)
      << p.err;
  EXPECT_EQ(p.err.find("rope_theta"), std::string::npos) << "rope_theta agrees: " << p.err;
}

}  // namespace
}  // namespace ulysses::engine
