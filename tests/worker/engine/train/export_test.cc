// `ulysses-train export --dtype`, through the ulysses-train binary on checkpoints that real
// (tiny, 3-step) bf16 and fp32 training runs wrote:
//   - every --dtype spelling writes that dtype (safetensors and config.json's torch_dtype);
//   - without --dtype the export is in the job's spec.model.dtype, the stored weights as trained;
//   - an fp32 export of a bf16 job is the fp32 masters (optim/master/<name>) bit for bit, and not
//     the bf16 weights upcast; an fp16 export rounds the masters once;
//   - a bad --dtype is exit 2 naming the flag, the value and the choices, and writes nothing;
//   - --checkpoint takes a job's --out directory or a checkpoint root as its newest committed step;
//   - the tokenizer files of the job's init_from model (or --tokenizer-from) travel with it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/testing/documents.h"
#include "tests/testing/files.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/hf/hf.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::ulysses::testing::TempDir;

using ::ulysses::testing::ReadFile;
using ::ulysses::testing::WriteRandomTokens;

using ::ulysses::testing::Result;
using ::ulysses::testing::RunTrainer;

// A committed checkpoint of a 3-step run of a tiny model in `dtype`.
std::string TrainCheckpoint(const fs::path& dir, const std::string& dtype) {
  const fs::path job = dir / (dtype + ".yaml");
  std::ofstream(job) << "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata: {name: export}\n"
                        "spec:\n  model: {vocab_size: 64, hidden_size: 32, intermediate_size: 64, "
                        "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
                        "dtype: "
                     << dtype << "}\n  data: {train: " << (dir / "train.bin").string()
                     << ", validation: " << (dir / "val.bin").string()
                     << "}\n  memory: {attention_block_size: 32}\n"
                        "  optimizer: {lr: 1.0e-3, warmup_steps: 0}\n"
                        "  stages: [{seq_len: 64, steps: 3}]\n  seed: 5\n";
  const fs::path out = dir / ("run-" + dtype);
  Result r = RunTrainer({"train", "-f", job.string(), "--out", out.string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string ckpt;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out / "checkpoints", ec)) {
    ckpt = std::max(ckpt, e.path().string());
  }
  EXPECT_FALSE(ckpt.empty()) << "no checkpoint under " << out;
  return ckpt;
}

std::map<std::string, torch::Tensor> ByName(const std::vector<NamedTensor>& tensors,
                                            const std::string& prefix = "") {
  std::map<std::string, torch::Tensor> out;
  for (const NamedTensor& t : tensors) {
    if (t.name.rfind(prefix, 0) == 0) out[t.name.substr(prefix.size())] = t.tensor;
  }
  return out;
}

class ExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("ulysses-export");
    ASSERT_TRUE(WriteRandomTokens(dir_->Sub("train.bin"), 2048, 1));
    ASSERT_TRUE(WriteRandomTokens(dir_->Sub("val.bin"), 256, 2));
    bf16_ckpt_ = new std::string(TrainCheckpoint(dir_->path(), "bfloat16"));
    fp32_ckpt_ = new std::string(TrainCheckpoint(dir_->path(), "float32"));
  }
  static void TearDownTestSuite() {
    delete bf16_ckpt_;
    delete fp32_ckpt_;
    delete dir_;
  }

  // Exports `ckpt` into a fresh directory (with `--dtype flag` unless flag is empty); checks the
  // exit code and returns the export's stdout JSON, with the directory in out["hf_out"].
  static json Export(const std::string& ckpt, const std::string& flag, const std::string& tag) {
    const fs::path dir(dir_->path());
    std::vector<std::string> args = {"export", "--checkpoint", ckpt, "--hf-out",
                                     (dir / ("hf-" + tag)).string()};
    if (!flag.empty()) args.insert(args.end(), {"--dtype", flag});
    Result r = RunTrainer(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    json j = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
  }

  static std::vector<NamedTensor> Written(const json& exported) {
    auto t = ReadSafetensors(exported["hf_out"].get<std::string>() + "/model.safetensors");
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : std::vector<NamedTensor>{};
  }

  static CheckpointState Checkpoint(const std::string& ckpt) {
    auto st = LoadCheckpoint(ckpt, "");
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : CheckpointState{};
  }

  static TempDir* dir_;
  static std::string* bf16_ckpt_;
  static std::string* fp32_ckpt_;
};

TempDir* ExportTest::dir_ = nullptr;
std::string* ExportTest::bf16_ckpt_ = nullptr;
std::string* ExportTest::fp32_ckpt_ = nullptr;

TEST_F(ExportTest, EveryDtypeSpellingWritesThatDtype) {
  const std::vector<std::pair<std::string, torch::ScalarType>> cases = {
      {"bf16", torch::kBFloat16},   {"bfloat16", torch::kBFloat16}, {"fp16", torch::kFloat16},
      {"float16", torch::kFloat16}, {"fp32", torch::kFloat32},      {"float32", torch::kFloat32},
      {"fp64", torch::kFloat64},    {"float64", torch::kFloat64}};
  const size_t weights = ByName(Checkpoint(*bf16_ckpt_).tensors, "model/").size();
  ASSERT_GT(weights, 0u);
  for (const auto& [flag, dtype] : cases) {
    json exported = Export(*bf16_ckpt_, flag, "flag-" + flag);
    const std::string name = c10::toString(dtype);
    EXPECT_EQ(exported["tensors"], weights) << flag;
    const std::vector<NamedTensor> written = Written(exported);
    EXPECT_EQ(written.size(), weights) << flag;
    for (const NamedTensor& t : written) {
      EXPECT_EQ(t.tensor.scalar_type(), dtype) << flag << " " << t.name;
    }
    const json config =
        json::parse(ReadFile(exported["hf_out"].get<std::string>() + "/config.json"));
    EXPECT_EQ(config["torch_dtype"], exported["dtype"]) << flag;
    // The reader takes every spelling back to float32 weights of the same names.
    auto loaded = LoadHfWeights(exported["hf_out"].get<std::string>());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->size(), weights);
  }
  EXPECT_EQ(Export(*bf16_ckpt_, "fp16", "name-fp16")["dtype"], "float16");
  EXPECT_EQ(Export(*bf16_ckpt_, "bf16", "name-bf16")["dtype"], "bfloat16");
}

TEST_F(ExportTest, DefaultIsTheJobDtypeWithTheWeightsAsTrained) {
  for (const auto& [ckpt, dtype] : {std::make_pair(*bf16_ckpt_, torch::kBFloat16),
                                    std::make_pair(*fp32_ckpt_, torch::kFloat32)}) {
    const std::string tag = dtype == torch::kBFloat16 ? "bf16" : "fp32";
    json exported = Export(ckpt, "", "default-" + tag);
    EXPECT_EQ(exported["dtype"], tag == "bf16" ? "bfloat16" : "float32");
    EXPECT_EQ(exported["from_masters"], 0) << "the job's own dtype is written as trained";
    auto stored = ByName(Checkpoint(ckpt).tensors, "model/");
    const std::vector<NamedTensor> written = Written(exported);
    ASSERT_EQ(written.size(), stored.size());
    for (const NamedTensor& t : written) {
      EXPECT_EQ(t.tensor.scalar_type(), dtype) << t.name;
      ASSERT_TRUE(stored.count(t.name)) << t.name;
      EXPECT_TRUE(torch::equal(t.tensor, stored[t.name])) << tag << " " << t.name;
    }
  }
  // An fp32 job has no masters (its weights are their own): --dtype fp32 is the default's copy.
  EXPECT_TRUE(ByName(Checkpoint(*fp32_ckpt_).tensors, "optim/master/").empty());
}

TEST_F(ExportTest, Float32ExportOfABfloat16JobIsTheMastersBitForBit) {
  const CheckpointState st = Checkpoint(*bf16_ckpt_);
  auto weights = ByName(st.tensors, "model/");
  auto masters = ByName(st.tensors, "optim/master/");
  ASSERT_EQ(masters.size(), weights.size()) << "after 3 steps every bf16 weight has a master";
  json exported = Export(*bf16_ckpt_, "fp32", "masters");
  EXPECT_EQ(exported["from_masters"], weights.size());
  int64_t differs_from_upcast = 0, elements = 0;
  for (const NamedTensor& t : Written(exported)) {
    ASSERT_TRUE(masters.count(t.name)) << t.name;
    ASSERT_EQ(masters[t.name].scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(t.tensor, masters[t.name])) << t.name;
    differs_from_upcast += t.tensor.ne(weights[t.name].to(torch::kFloat32)).sum().item<int64_t>();
    elements += t.tensor.numel();
  }
  // The masters carry bits the bf16 weights lost: most elements of the export differ from the
  // bf16 weights upcast (if the export were the upcast, none would).
  EXPECT_GT(differs_from_upcast, elements / 2) << differs_from_upcast << " of " << elements;
  // The bf16 weights are the masters rounded: the export's source is the same training state.
  for (const auto& [name, w] : weights) {
    EXPECT_TRUE(torch::equal(w, masters[name].to(torch::kBFloat16))) << name;
  }
  // float16 from the masters: rounded once, not bf16-rounded then fp16-rounded.
  json f16 = Export(*bf16_ckpt_, "fp16", "masters-fp16");
  for (const NamedTensor& t : Written(f16)) {
    EXPECT_TRUE(torch::equal(t.tensor, masters[t.name].to(torch::kFloat16))) << t.name;
  }
}

// Above --max-file-bytes the export is HF shards + index.json, holding exactly the single-file
// export's weights; the export holds one tensor at a time and reads each stored weight once.
TEST_F(ExportTest, ShardedExportAboveTheSizeLimitEqualsTheSingleFile) {
  const fs::path dir(dir_->path());
  json single = Export(*fp32_ckpt_, "fp32", "single");
  Result r =
      RunTrainer({"export", "--checkpoint", *fp32_ckpt_, "--hf-out", (dir / "hf-sharded").string(),
                  "--dtype", "fp32", "--max-file-bytes", "20000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json sharded = json::parse(r.out);
  ASSERT_GT(sharded["files"].size(), 2u);
  char first[64];
  std::snprintf(first, sizeof(first), "model-00001-of-%05zu.safetensors", sharded["files"].size());
  EXPECT_EQ(sharded["files"][0], first);
  const std::string out = (dir / "hf-sharded").string();
  const json index = json::parse(ReadFile(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), sharded["tensors"].get<size_t>());
  int64_t largest = 0, total = 0;
  for (const auto& file : sharded["files"]) {
    const int64_t size = static_cast<int64_t>(fs::file_size(out + "/" + file.get<std::string>()));
    auto tensors = ReadSafetensors(out + "/" + file.get<std::string>());
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    int64_t data = 0;
    for (const NamedTensor& t : *tensors) {
      EXPECT_EQ(index["weight_map"][t.name], file) << t.name;
      data += static_cast<int64_t>(t.tensor.nbytes());
      largest = std::max<int64_t>(largest, static_cast<int64_t>(t.tensor.nbytes()));
    }
    EXPECT_TRUE(data <= 20000 || tensors->size() == 1u) << file << " holds " << data;
    total += data;
    EXPECT_GT(size, data);
  }
  EXPECT_EQ(sharded["largest_tensor_bytes"], largest);
  EXPECT_EQ(sharded["bytes_read"], total);  // fp32 weights, fp32 export: each byte read once
  auto a = LoadHfWeights(single["hf_out"].get<std::string>());
  auto b = LoadHfWeights(out);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].name, (*b)[i].name);
    EXPECT_TRUE(torch::equal((*a)[i].tensor, (*b)[i].tensor)) << (*a)[i].name;
  }
}

TEST_F(ExportTest, BadDtypeIsRefusedNamingFlagValueAndChoicesAndWritesNothing) {
  const fs::path dir(dir_->path());
  for (const std::string& bad : {std::string("int8"), std::string("half"), std::string("")}) {
    const fs::path out = dir / "hf-bad";
    Result r = RunTrainer(
        {"export", "--checkpoint", *bf16_ckpt_, "--hf-out", out.string(), "--dtype=" + bad});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--dtype: '" + bad + "' is not an export dtype"), std::string::npos)
        << r.err;
    for (const char* choice : {"bf16", "fp16", "fp32"}) {
      EXPECT_NE(r.err.find(choice), std::string::npos) << r.err;
    }
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_FALSE(fs::exists(out)) << "a refused export writes nothing";
  }
  // The checkpoint is untouched: it still loads and exports.
  EXPECT_EQ(Export(*bf16_ckpt_, "bf16", "after-bad")["dtype"], "bfloat16");
}

// --checkpoint of a job's --out directory or of its checkpoint root exports the newest committed
// step (an uncommitted newer step directory is passed over); a directory with none is refused
// naming the flag and writes nothing.
TEST_F(ExportTest, AJobDirectoryOrCheckpointRootExportsItsNewestCommittedStep) {
  const fs::path dir(dir_->path());
  const fs::path step(*fp32_ckpt_);
  const fs::path root = dir / "root-copy";
  fs::copy(step.parent_path(), root, fs::copy_options::recursive);
  fs::create_directories(root / "step-99999999");  // a save that never committed
  const json direct = Export(*fp32_ckpt_, "fp32", "by-step");
  EXPECT_EQ(direct["checkpoint"], *fp32_ckpt_);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {step.parent_path().parent_path().string(), *fp32_ckpt_},  // the job's --out
      {step.parent_path().string(), *fp32_ckpt_},                // its checkpoints/ root
      {root.string(), (root / step.filename()).string()}};
  int n = 0;
  for (const auto& [given, expected] : cases) {
    const json exported = Export(given, "fp32", "by-dir-" + std::to_string(n++));
    EXPECT_EQ(exported["checkpoint"], expected) << given;
    auto a = LoadHfWeights(direct["hf_out"].get<std::string>());
    auto b = LoadHfWeights(exported["hf_out"].get<std::string>());
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    for (size_t i = 0; i < a->size(); ++i) {
      EXPECT_TRUE(torch::equal((*a)[i].tensor, (*b)[i].tensor)) << given << " " << (*a)[i].name;
    }
  }
  const fs::path empty = dir / "no-checkpoints";
  fs::create_directories(empty / "checkpoints");
  const fs::path out = dir / "hf-from-empty";
  Result r = RunTrainer({"export", "--checkpoint", empty.string(), "--hf-out", out.string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--checkpoint: " + empty.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no committed step-* directory"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out)) << "a refused export writes nothing";
}

// A job that started from an HF model exports with that model's tokenizer files (byte for byte,
// nothing else of the directory); --tokenizer-from names them for any checkpoint and a missing
// one is refused before anything is written; a job's init_from that has gone is a warning.
TEST_F(ExportTest, TheInitFromModelsTokenizerFilesTravelWithTheExport) {
  const fs::path dir(dir_->path());
  const json base = Export(*fp32_ckpt_, "fp32", "init-base");
  EXPECT_TRUE(base["tokenizer_files"].empty()) << "a job without init_from has no tokenizer";
  EXPECT_EQ(base["tokenizer_from"], "");
  const fs::path hf = fs::canonical(base["hf_out"].get<std::string>());
  const std::map<std::string, std::string> tokenizer = {
      {"tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"eos_token": "</s>"})"},
      {"generation_config.json", R"({"temperature": 0.6})"}};
  for (const auto& [name, text] : tokenizer) std::ofstream(hf / name) << text;
  std::ofstream(hf / "README.md") << "not a tokenizer file";

  const fs::path job = dir / "init.yaml";
  std::ofstream(job) << "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata: {name: init}\n"
                        "spec:\n  model: {init_from: "
                     << hf.string()
                     << ", dtype: float32}\n  data: {train: " << (dir / "train.bin").string()
                     << ", validation: " << (dir / "val.bin").string()
                     << "}\n  memory: {attention_block_size: 32}\n"
                        "  optimizer: {lr: 1.0e-3, warmup_steps: 0}\n"
                        "  stages: [{seq_len: 64, steps: 2}]\n  seed: 5\n";
  const fs::path run = dir / "run-init";
  Result trained = RunTrainer({"train", "-f", job.string(), "--out", run.string()});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;

  const json exported = Export(run.string(), "", "with-tokenizer");
  EXPECT_EQ(exported["tokenizer_from"], hf.string());
  std::vector<std::string> copied = exported["tokenizer_files"].get<std::vector<std::string>>();
  std::sort(copied.begin(), copied.end());
  EXPECT_EQ(copied, (std::vector<std::string>{"generation_config.json", "tokenizer.json",
                                              "tokenizer_config.json"}));
  const fs::path out = exported["hf_out"].get<std::string>();
  for (const auto& [name, text] : tokenizer) EXPECT_EQ(ReadFile(out / name), text) << name;
  EXPECT_FALSE(fs::exists(out / "README.md"));

  // --tokenizer-from: for a checkpoint that had no init_from.
  const fs::path explicit_out = dir / "hf-tokenizer-from";
  Result r = RunTrainer({"export", "--checkpoint", *fp32_ckpt_, "--hf-out", explicit_out.string(),
                         "--tokenizer-from", hf.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(explicit_out / "tokenizer.json"), tokenizer.at("tokenizer.json"));
  // A --tokenizer-from that is missing, or holds no tokenizer, writes nothing.
  for (const fs::path& bad : {dir / "no-such-model", dir / "no-checkpoints"}) {
    fs::create_directories(dir / "no-checkpoints");
    const fs::path refused = dir / "hf-refused";
    Result b = RunTrainer({"export", "--checkpoint", *fp32_ckpt_, "--hf-out", refused.string(),
                           "--tokenizer-from", bad.string()});
    EXPECT_NE(b.exit_code, 0) << bad;
    EXPECT_NE(b.err.find("--tokenizer-from: " + bad.string()), std::string::npos) << b.err;
    EXPECT_FALSE(fs::exists(refused)) << "a refused export writes nothing";
  }
  // The job's init_from moved away: the weights export, the warning says what to pass.
  const fs::path moved = dir / "init-moved";
  fs::rename(hf, moved);
  const fs::path gone_out = dir / "hf-init-gone";
  Result g = RunTrainer({"export", "--checkpoint", run.string(), "--hf-out", gone_out.string()});
  fs::rename(moved, hf);
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE(g.err.find("warning: the job's init_from " + hf.string() + " is not here"),
            std::string::npos)
      << g.err;
  EXPECT_NE(g.err.find("--tokenizer-from"), std::string::npos) << g.err;
  EXPECT_TRUE(fs::exists(gone_out / "config.json"));
  EXPECT_FALSE(fs::exists(gone_out / "tokenizer.json"));
}

}  // namespace
}  // namespace ulysses::engine
