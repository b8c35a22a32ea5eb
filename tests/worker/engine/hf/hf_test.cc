#include "worker/engine/hf/hf.h"

#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;

using ::ulysses::testing::TempDir;

spec::ModelSpec TinyModel(bool tied) {
  spec::ModelSpec m;
  m.vocab_size = 64;
  m.hidden_size = 32;
  m.intermediate_size = 48;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.rope_theta = 10000.0;
  m.rms_norm_eps = 1e-5;
  m.tie_word_embeddings = tied;
  return m;
}

std::vector<NamedTensor> RandomWeights(const spec::ModelSpec& m, double std) {
  std::vector<NamedTensor> w;
  for (const auto& [name, shape] : HfLlamaShapes(m)) {
    torch::Tensor t =
        name.find("norm") != std::string::npos ? torch::ones(shape) : torch::randn(shape) * std;
    w.push_back({name, t});
  }
  return w;
}

TEST(HfTest, RoundTripDirectory) {
  TempDir dir;
  for (bool tied : {false, true}) {
    spec::ModelSpec m = TinyModel(tied);
    if (tied) m.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
    const auto weights = RandomWeights(m, 0.02);
    const std::string out = dir.Sub(tied ? "tied" : "untied");
    ASSERT_TRUE(WriteHfDirectory(out, m, weights).ok());
    auto config = ReadHfConfig(out);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->vocab_size, 64);
    EXPECT_EQ(config->hidden_size, 32);
    EXPECT_EQ(config->intermediate_size, 48);
    EXPECT_EQ(config->num_hidden_layers, 2);
    EXPECT_EQ(config->num_attention_heads, 4);
    EXPECT_EQ(config->num_key_value_heads, 2);
    EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-5);
    EXPECT_EQ(config->tie_word_embeddings, tied);
    EXPECT_EQ(config->rope_scaling.rope_type, tied ? "llama3" : "none");
    EXPECT_EQ(config->rope_scaling.factor, m.rope_scaling.factor);
    EXPECT_EQ(config->rope_scaling.original_max_position_embeddings,
              m.rope_scaling.original_max_position_embeddings);
    auto loaded = LoadHfWeights(out);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->size(), weights.size());
    std::map<std::string, torch::Tensor> by_name;
    for (const auto& nt : weights) by_name[nt.name] = nt.tensor;
    for (const auto& nt : *loaded) {
      ASSERT_TRUE(by_name.count(nt.name)) << nt.name;
      EXPECT_TRUE(torch::equal(nt.tensor, by_name[nt.name])) << nt.name;
    }
    EXPECT_EQ(tied, !by_name.count("lm_head.weight"));
  }
}

// The writer converts every weight to the dtype asked for and says so in config.json.
TEST(HfTest, WritesTheDtypeAskedFor) {
  TempDir dir;
  const spec::ModelSpec m = TinyModel(false);
  const auto weights = RandomWeights(m, 0.02);
  const std::map<torch::ScalarType, std::pair<std::string, std::string>> cases = {
      {torch::kFloat32, {"F32", "float32"}},
      {torch::kBFloat16, {"BF16", "bfloat16"}},
      {torch::kFloat16, {"F16", "float16"}},
      {torch::kFloat64, {"F64", "float64"}}};
  for (const auto& [dtype, names] : cases) {
    const std::string out = dir.Sub(names.second);
    ASSERT_TRUE(WriteHfDirectory(out, m, weights, dtype).ok()) << names.second;
    std::ifstream config_file(out + "/config.json");
    const nlohmann::json config = nlohmann::json::parse(config_file);
    EXPECT_EQ(config["torch_dtype"], names.second);
    auto stored = ReadSafetensors(out + "/model.safetensors");
    ASSERT_TRUE(stored.ok()) << stored.status();
    ASSERT_EQ(stored->size(), weights.size());
    std::map<std::string, torch::Tensor> by_name;
    for (const auto& nt : weights) by_name[nt.name] = nt.tensor;
    for (const auto& nt : *stored) {
      EXPECT_EQ(nt.tensor.scalar_type(), dtype) << names.first << " " << nt.name;
      // Round to nearest, once: the stored value is the float32 weight converted.
      EXPECT_TRUE(torch::equal(nt.tensor, by_name[nt.name].to(dtype))) << nt.name;
    }
  }
  // bfloat16 keeps 8 mantissa bits: the N(0, 0.02) weights really were rounded.
  auto bf16 = ReadSafetensors(dir.Sub("bfloat16") + "/model.safetensors");
  ASSERT_TRUE(bf16.ok());
  EXPECT_FALSE(torch::equal(bf16->front().tensor.to(torch::kFloat32), weights.front().tensor));
}

// A weight float16 cannot hold is refused naming the tensor, and nothing is written.
TEST(HfTest, WeightBeyondFloat16RangeIsRefused) {
  TempDir dir;
  const spec::ModelSpec m = TinyModel(false);
  auto weights = RandomWeights(m, 0.02);
  weights[1].tensor[0][0] = 1.0e5;  // float16's largest finite value is 65504
  absl::Status s = WriteHfDirectory(dir.Sub("f16"), m, weights, torch::kFloat16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("tensor " + weights[1].name + " has a value of magnitude 100000"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("float16 cannot hold"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(dir.Sub("f16")));
  // bfloat16 has float32's range: the same weight exports.
  EXPECT_TRUE(WriteHfDirectory(dir.Sub("bf16"), m, weights, torch::kBFloat16).ok());
  // Integer dtypes are not weight dtypes.
  EXPECT_NE(WriteHfDirectory(dir.Sub("int"), m, weights, torch::kInt32)
                .message()
                .find("is not a weight dtype"),
            std::string::npos);
}

TEST(HfTest, ReadsBf16F16AndShardedIndex) {
  TempDir dir;
  fs::create_directories(dir.Sub("m"));
  torch::Tensor a = torch::randn({5, 3});
  torch::Tensor b = torch::randn({7});
  ASSERT_TRUE(WriteSafetensors(dir.Sub("m/part-1.safetensors"), {{"a", a.to(torch::kBFloat16)}},
                               {{"format", "pt"}})
                  .ok());
  ASSERT_TRUE(
      WriteSafetensors(dir.Sub("m/part-2.safetensors"), {{"b", b.to(torch::kFloat16)}}).ok());
  ASSERT_TRUE(WriteSafetensors(dir.Sub("m/ignored.safetensors"), {{"zzz", b}}).ok());
  std::ofstream(dir.Sub("m/model.safetensors.index.json"))
      << R"({"metadata": {}, "weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}})";
  auto loaded = LoadHfWeights(dir.Sub("m"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);  // only files named by the index
  EXPECT_EQ((*loaded)[0].name, "a");
  EXPECT_EQ((*loaded)[0].tensor.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal((*loaded)[0].tensor, a.to(torch::kBFloat16).to(torch::kFloat32)));
  EXPECT_FALSE(torch::equal((*loaded)[0].tensor, a));  // bf16 really was stored
  EXPECT_TRUE(torch::equal((*loaded)[1].tensor, b.to(torch::kFloat16).to(torch::kFloat32)));

  // The raw file layout: 8-byte LE header length, JSON, data.
  std::ifstream in(dir.Sub("m/part-1.safetensors"), std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string header(len, '\0');
  in.read(header.data(), len);
  EXPECT_NE(header.find(R"("a":{"data_offsets":[0,30],"dtype":"BF16","shape":[5,3]})"),
            std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("__metadata__":{"format":"pt"})"), std::string::npos);
  EXPECT_EQ(fs::file_size(dir.Sub("m/part-1.safetensors")), 8 + len + 30);
}

void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(data_bytes, '\0');
}

TEST(HfTest, ShapeAndDtypeErrorsNameTheTensor) {
  TempDir dir;
  WriteRaw(dir.Sub("shape.safetensors"),
           R"({"w.bad":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20);
  auto shape = ReadSafetensors(dir.Sub("shape.safetensors"));
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(
      shape.status().message().find("tensor w.bad: shape [2, 3] with dtype F32 needs 24 bytes"),
      std::string::npos)
      << shape.status();
  // A shape far beyond the file is refused before any allocation (once with bytes that
  // overflow int64, once with bytes that fit it but not any machine).
  WriteRaw(dir.Sub("huge.safetensors"),
           R"({"w.huge":{"dtype":"F32","shape":[1099511627776,1099511627776],)"
           R"("data_offsets":[0,16]}})",
           16);
  auto huge = ReadSafetensors(dir.Sub("huge.safetensors"));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("tensor w.huge: shape [1099511627776, 1099511627776] "
                                         "with dtype F32 needs more than 2^63 bytes"),
            std::string::npos)
      << huge.status();
  WriteRaw(dir.Sub("big.safetensors"),
           R"({"w.big":{"dtype":"F32","shape":[1099511627776,1024],"data_offsets":[0,16]}})", 16);
  auto big = ReadSafetensors(dir.Sub("big.safetensors"));
  ASSERT_FALSE(big.ok());
  EXPECT_NE(
      big.status().message().find("tensor w.big: shape [1099511627776, 1024] with dtype "
                                  "F32 needs 4503599627370496 bytes but data_offsets span 16"),
      std::string::npos)
      << big.status();
  WriteRaw(dir.Sub("dtype.safetensors"),
           R"({"w.odd":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2);
  auto dtype = ReadSafetensors(dir.Sub("dtype.safetensors"));
  EXPECT_NE(dtype.status().message().find("tensor w.odd: unsupported dtype F8_E4M3"),
            std::string::npos)
      << dtype.status();
  WriteRaw(dir.Sub("trunc.safetensors"),
           R"({"w.cut":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  auto trunc = ReadSafetensors(dir.Sub("trunc.safetensors"));
  EXPECT_NE(trunc.status().message().find("tensor w.cut"), std::string::npos) << trunc.status();
  // Integer weights are refused by LoadHfWeights.
  fs::create_directories(dir.Sub("int"));
  ASSERT_TRUE(WriteSafetensors(dir.Sub("int/model.safetensors"),
                               {{"w.int", torch::ones({2}, torch::kInt64)}})
                  .ok());
  auto ints = LoadHfWeights(dir.Sub("int"));
  EXPECT_NE(ints.status().message().find("tensor w.int has dtype Long"), std::string::npos)
      << ints.status();
  // The writer checks names and shapes against the config.
  spec::ModelSpec m = TinyModel(false);
  auto weights = RandomWeights(m, 0.02);
  weights[3].tensor = torch::zeros({1, 2});
  auto bad = WriteHfDirectory(dir.Sub("bad"), m, weights);
  EXPECT_NE(bad.message().find("tensor " + weights[3].name + " has shape [1, 2], expected"),
            std::string::npos)
      << bad;
  EXPECT_NE(WriteHfDirectory(dir.Sub("bad"), m, RandomWeights(TinyModel(true), 0.02))
                .message()
                .find("missing"),
            std::string::npos);
}

// An import consumes every tensor of the checkpoint: a stray one (another family's q_norm) and a
// missing one are errors naming them; HF's inv_freq buffers and a tied model's lm_head are not.
TEST(HfTest, ImportConsumesEveryTensorAndNamesAStrayOrMissingOne) {
  TempDir dir;
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied);
    const spec::ModelSpec m = TinyModel(tied);
    const std::string hf = dir.Sub(tied ? "tied" : "untied");
    ASSERT_TRUE(WriteHfDirectory(hf, m, RandomWeights(m, 0.02)).ok());
    std::vector<std::string> names;
    for (const auto& [name, shape] : HfLlamaShapes(m)) names.push_back(name);
    EXPECT_TRUE(CheckHfTensorsConsumed(hf, names).ok());

    std::vector<NamedTensor> leftovers = {
        {"model.layers.0.self_attn.rotary_emb.inv_freq", torch::ones({4})}};
    if (tied) leftovers.push_back({"lm_head.weight", torch::ones({64, 32})});
    ASSERT_TRUE(WriteSafetensors(hf + "/extra.safetensors", leftovers).ok());
    EXPECT_TRUE(CheckHfTensorsConsumed(hf, names).ok()) << CheckHfTensorsConsumed(hf, names);
    fs::remove(hf + "/extra.safetensors");

    ASSERT_TRUE(WriteSafetensors(hf + "/qwen3.safetensors",
                                 {{"model.layers.0.self_attn.q_norm.weight", torch::ones({8})}})
                    .ok());
    absl::Status stray = CheckHfTensorsConsumed(hf, names);
    EXPECT_TRUE(absl::StrContains(stray.message(),
                                  "1 tensor(s) the model has no place for: "
                                  "model.layers.0.self_attn.q_norm.weight"))
        << stray;
    fs::remove(hf + "/qwen3.safetensors");

    names.push_back("model.layers.9.mlp.up_proj.weight");
    absl::Status missing = CheckHfTensorsConsumed(hf, names);
    EXPECT_TRUE(absl::StrContains(missing.message(),
                                  "1 tensor(s) missing: model.layers.9.mlp.up_proj.weight"))
        << missing;
  }
}

// Sharded import: a multi-file checkpoint (index.json) reads like the single-file one, and a rank
// reads only the headers and the byte ranges it keeps.
TEST(HfShareTest, MultiFileEqualsSingleFileAndReadsOnlyKeptRanges) {
  TempDir dir;
  const spec::ModelSpec m = TinyModel(false);
  torch::manual_seed(3);
  const auto weights = RandomWeights(m, 0.02);
  ASSERT_TRUE(WriteHfDirectory(dir.Sub("single"), m, weights, torch::kBFloat16).ok());
  // The same weights in three files: layer 0, layer 1, the rest.
  fs::create_directories(dir.Sub("multi"));
  std::map<std::string, std::vector<NamedTensor>> files;
  nlohmann::json index = {{"metadata", nlohmann::json::object()},
                          {"weight_map", nlohmann::json::object()}};
  for (const NamedTensor& w : weights) {
    const std::string file = w.name.find("layers.0.") != std::string::npos   ? "a.safetensors"
                             : w.name.find("layers.1.") != std::string::npos ? "b.safetensors"
                                                                             : "c.safetensors";
    files[file].push_back({w.name, w.tensor.to(torch::kBFloat16)});
    index["weight_map"][w.name] = file;
  }
  for (const auto& [file, tensors] : files) {
    ASSERT_TRUE(WriteSafetensors(dir.Sub("multi/" + file), tensors).ok());
  }
  std::ofstream(dir.Sub("multi/model.safetensors.index.json")) << index.dump();
  ShareRequest whole;
  for (const auto& [name, shape] : HfLlamaShapes(m)) whole[name].shape = shape;
  LoadStats single_read, multi_read;
  auto single = LoadHfWeightsShare(dir.Sub("single"), whole, &single_read);
  auto multi = LoadHfWeightsShare(dir.Sub("multi"), whole, &multi_read);
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE(multi.ok()) << multi.status();
  ASSERT_EQ(single->size(), weights.size());
  ASSERT_EQ(multi->size(), weights.size());
  int64_t bf16_bytes = 0;
  for (size_t i = 0; i < single->size(); ++i) {
    SCOPED_TRACE((*single)[i].name);
    EXPECT_EQ((*single)[i].name, (*multi)[i].name);
    EXPECT_TRUE(torch::equal((*single)[i].tensor, (*multi)[i].tensor));
    EXPECT_EQ((*single)[i].tensor.scalar_type(), torch::kFloat32);
    bf16_bytes += (*single)[i].tensor.numel() * 2;
  }
  EXPECT_EQ(single_read.data_bytes, bf16_bytes);  // every stored byte once, in bf16
  EXPECT_EQ(multi_read.data_bytes, bf16_bytes);
  EXPECT_EQ(single_read.metadata_bytes + bf16_bytes,
            static_cast<int64_t>(fs::file_size(dir.Sub("single/model.safetensors"))));
  // A rank keeping the elements [100, 300) of the embeddings and nothing else reads 200 of them.
  ShareRequest range;
  range["model.embed_tokens.weight"] = {{64, 32}, 100, 300};
  LoadStats range_read;
  auto part = LoadHfWeightsShare(dir.Sub("multi"), range, &range_read);
  ASSERT_TRUE(part.ok()) << part.status();
  ASSERT_EQ(part->size(), 1u);
  EXPECT_EQ(range_read.data_bytes, 200 * 2);
  EXPECT_EQ((*part)[0].offset, 100);
  EXPECT_TRUE(
      torch::equal((*part)[0].tensor, (*single)[0].name == "lm_head.weight"
                                          ? (*single)[1].tensor.reshape({-1}).narrow(0, 100, 200)
                                          : (*single)[0].tensor.reshape({-1}).narrow(0, 100, 200)));
  // Bad input names the file, the tensor and the fix, before any tensor byte is read.
  ShareRequest wrong;
  wrong["model.norm.weight"] = {{33}};
  auto shape = LoadHfWeightsShare(dir.Sub("multi"), wrong);
  ASSERT_FALSE(shape.ok());
  for (const char* part : {"c.safetensors", "model.norm.weight", "[32]", "[33]", "spec"}) {
    EXPECT_NE(shape.status().message().find(part), std::string::npos) << shape.status();
  }
  index["weight_map"]["model.norm.weight"] = "gone.safetensors";
  std::ofstream(dir.Sub("multi/model.safetensors.index.json")) << index.dump();
  auto missing = LoadHfWeightsShare(dir.Sub("multi"), whole);
  ASSERT_FALSE(missing.ok());
  for (const char* part : {"model.safetensors.index.json", "model.norm.weight", "gone.safetensors",
                           "copy the complete checkpoint"}) {
    EXPECT_NE(missing.status().message().find(part), std::string::npos) << missing.status();
  }
  fs::resize_file(dir.Sub("single/model.safetensors"),
                  fs::file_size(dir.Sub("single/model.safetensors")) - 2);
  auto truncated = LoadHfWeightsShare(dir.Sub("single"), whole);
  ASSERT_FALSE(truncated.ok());
  for (const char* part : {"model.safetensors", "truncated", "copy it again"}) {
    EXPECT_NE(truncated.status().message().find(part), std::string::npos) << truncated.status();
  }
}

TEST(HfTest, ConfigErrors) {
  TempDir dir;
  fs::create_directories(dir.Sub("c"));
  const std::string base =
      R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4)";
  std::ofstream(dir.Sub("c/config.json")) << "{" << base << "}";
  auto ok = ReadHfConfig(dir.Sub("c"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->num_key_value_heads, 4);  // defaults to the query heads
  EXPECT_DOUBLE_EQ(ok->rms_norm_eps, 1e-6);
  auto error = [&](const std::string& extra) {
    std::ofstream(dir.Sub("c/config.json")) << "{" << base << extra << "}";
    return std::string(ReadHfConfig(dir.Sub("c")).status().message());
  };
  const std::string path = dir.Sub("c/config.json");
  EXPECT_EQ(error(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})"),
            path +
                ": rope_scaling.rope_type: 'yarn' is not supported (the engine implements "
                "RoPE scaling of types llama3 and linear; use weights whose config.json has "
                "one of them or no rope_scaling)");
  EXPECT_EQ(error(R"(, "rope_scaling": {"rope_type": "llama3"})"),
            path + ": rope_scaling.factor: missing (a Llama config has it)\n" + path +
                ": rope_scaling.low_freq_factor: missing (a Llama config has it)\n" + path +
                ": rope_scaling.high_freq_factor: missing (a Llama config has it)\n" + path +
                ": rope_scaling.original_max_position_embeddings: missing (a Llama config has "
                "it)");
  EXPECT_EQ(error(R"(, "hidden_act": "gelu")"),
            path +
                ": hidden_act: \"gelu\" is not supported (the engine's Llama MLP is SwiGLU: "
                "silu)");
  EXPECT_EQ(error(R"(, "mlp_bias": true)"),
            path + ": mlp_bias: true is not supported (the engine's MLP projections have no bias)");
  EXPECT_EQ(error(R"(, "head_dim": 15)"),
            path +
                ": head_dim: 15 is odd (RoPE rotates pairs of dimensions, so head_dim must be "
                "even; use 14 or 16)");
  EXPECT_EQ(error(R"(, "architectures": ["GPT2LMHeadModel"])"),
            path +
                ": architectures: 'GPT2LMHeadModel' is not supported (the engine implements "
                "LlamaForCausalLM (llama), MistralForCausalLM (mistral), Qwen2ForCausalLM "
                "(qwen2), Qwen3ForCausalLM (qwen3))");
  std::ofstream(dir.Sub("c/config.json")) << R"({"vocab_size": 64})";
  EXPECT_NE(ReadHfConfig(dir.Sub("c")).status().message().find("hidden_size: missing"),
            std::string::npos);
  EXPECT_EQ(ReadHfConfig(dir.Sub("nope")).status().code(), absl::StatusCode::kNotFound);
}

TEST(HfTest, AcceptsLlama31ConfigJson) {
  // Meta's Llama-3.1-8B config.json: rope_scaling llama3 and keys the engine ignores.
  TempDir dir;
  fs::create_directories(dir.Sub("m"));
  std::ofstream(dir.Sub("m/config.json")) << R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";
  auto config = ReadHfConfig(dir.Sub("m"));
  ASSERT_TRUE(config.ok()) << config.status();
  spec::ModelSpec preset;
  preset.preset = "llama3-8b";
  ASSERT_TRUE(spec::ApplyModelPreset(preset).ok());
  for (const std::string& key : spec::ShapeFieldKeys()) {
    EXPECT_TRUE(spec::ShapeFieldEquals(*config, preset, key)) << key;
  }
  EXPECT_EQ(config->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(config->rope_scaling.factor, 8.0);
}

// Runs scripts/reference_llama.py and returns its "loss".
double RunReference(const std::string& hf, const std::string& tokens, int64_t seq_len) {
  const ::ulysses::testing::Result r = ::ulysses::testing::RunReferenceLlama(hf, tokens, seq_len);
  EXPECT_EQ(r.exit_code, 0) << r.description << "\n" << r.err;
  const std::string& out = r.out;
  auto json = nlohmann::json::parse(out, nullptr, false);
  EXPECT_FALSE(json.is_discarded()) << out;
  if (json.is_discarded()) return NAN;
  return json.value("loss", std::nan(""));  // a double default: NAN alone is a float
}

void WriteTokenFile(const std::string& path, const torch::Tensor& tokens) {
  torch::Tensor t = tokens.to(torch::kInt32).contiguous();  // values < 2^31: same bytes as uint32
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

TEST(ReferenceLlamaTest, RandomTinyModelLossIsNearLnVocab) {
  TempDir dir;
  torch::manual_seed(3);
  const spec::ModelSpec m = TinyModel(false);
  ASSERT_TRUE(WriteHfDirectory(dir.Sub("hf"), m, RandomWeights(m, 0.02)).ok());
  WriteTokenFile(dir.Sub("tokens.bin"), torch::randint(0, m.vocab_size, {100}));
  const double loss = RunReference(dir.Sub("hf"), dir.Sub("tokens.bin"), 16);
  ASSERT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, std::log(64.0), 0.05);
}

TEST(ReferenceLlamaTest, ZeroLayerModelMatchesDirectComputation) {
  // With no decoder layers, logits = rmsnorm(embed[x]) @ lm_head^T: computed here
  // independently, including the masked final target of the last window.
  TempDir dir;
  torch::manual_seed(4);
  spec::ModelSpec m = TinyModel(false);
  m.num_hidden_layers = 0;
  auto weights = RandomWeights(m, 1.0);
  std::map<std::string, torch::Tensor> w;
  for (auto& nt : weights) {
    if (nt.name == "model.norm.weight") nt.tensor = torch::rand({m.hidden_size}) + 0.5;
    w[nt.name] = nt.tensor.to(torch::kFloat64);
  }
  ASSERT_TRUE(WriteHfDirectory(dir.Sub("hf"), m, weights).ok());
  const int64_t n = 40, t = 10;  // 4 windows, the last one lacks its final target
  torch::Tensor tokens = torch::randint(0, m.vocab_size, {n}, torch::kInt64);
  WriteTokenFile(dir.Sub("tokens.bin"), tokens);
  torch::Tensor x = w["model.embed_tokens.weight"].index_select(0, tokens.slice(0, 0, n - 1));
  x = x * torch::rsqrt(x.pow(2).mean(-1, true) + m.rms_norm_eps) * w["model.norm.weight"];
  torch::Tensor logits = x.matmul(w["lm_head.weight"].t());  // [n-1, V]
  torch::Tensor nll = -torch::log_softmax(logits, -1).gather(1, tokens.slice(0, 1).unsqueeze(1));
  const double expected = nll.mean().item<double>();
  const double loss = RunReference(dir.Sub("hf"), dir.Sub("tokens.bin"), t);
  EXPECT_NEAR(loss, expected, 1e-9);
  EXPECT_GT(std::abs(expected - std::log(64.0)), 0.1);  // a non-trivial value
}

}  // namespace
}  // namespace ulysses::engine
