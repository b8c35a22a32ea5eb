// Runs the real build/bin/ulyssesctl binary ($ULYSSES_BIN_DIR) as a subprocess on
// the shipped specs and on bad input, checking exit codes, stdout and stderr.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_tree.h"
#include "common/spec/job_spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using ::ulysses::testing::Result;

std::string Example(const std::string& name) {
  return ::ulysses::testing::SourceDir() + "/configs/jobs/" + name;
}

class UlyssesctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("ULYSSES_BIN_DIR");
    ASSERT_NE(bin, nullptr) << "ULYSSES_BIN_DIR must point at build/bin";
    binary_ = std::string(bin) + "/ulyssesctl";
    ASSERT_TRUE(std::filesystem::exists(binary_)) << binary_;
    dir_ = ::ulysses::testing::FreshTestDir("ulyssesctl_test");
  }
  void TearDown() override { ulysses::RemoveTree(dir_).IgnoreError(); }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  // Runs ulyssesctl with `args` (and extra environment), bounded to 30 s; the caller's
  // ULYSSES_COORDINATOR is not passed on.
  Result Run(const std::vector<std::string>& args,
             const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> argv = {binary_};
    argv.insert(argv.end(), args.begin(), args.end());
    ::ulysses::testing::RunOptions options;
    options.unset_env = {"ULYSSES_COORDINATOR"};
    for (const auto& [key, value] : env) options.env.push_back(key + "=" + value);
    return ::ulysses::testing::Run(argv, options);
  }

  std::string binary_;
  std::filesystem::path dir_;
};

constexpr char kBadSpec[] = R"(apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: bad-job}
spec:
  model: {preset: tiny}
  data: {synthetic: {generator: random}}
  parallelism: {sp_degree: 8}
  stages:
    - {seq_len: 8192, steps: 10}
    - {seq_len: 16384, steps: 5}
    - {seq_len: 100001, steps: 5}
  checkpoint: {keep_last: 0}
)";

TEST_F(UlyssesctlTest, ValidatePrintsDefaultedYamlForEveryShippedSpec) {
  for (const std::string name : {"tiny-demo", "needle-retrieval", "llama3-1b-1m", "llama3-8b-1m"}) {
    SCOPED_TRACE(name);
    const std::string path = Example(name + ".yaml");
    Result r = Run({"validate", "-f", path});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_THAT(r.out, HasSubstr("apiVersion: ulysses/v1"));
    EXPECT_THAT(r.out, HasSubstr("name: " + name));
    EXPECT_THAT(r.out, HasSubstr("schedule: cosine"));  // a default made explicit
    // The printed spec is the canonical form of the file.
    absl::StatusOr<spec::JobSpec> printed = spec::ParseJobSpec(r.out);
    ASSERT_TRUE(printed.ok()) << printed.status();
    absl::StatusOr<spec::JobSpec> file = spec::LoadJobSpecFile(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(spec::ToYaml(*printed), spec::ToYaml(*file));
  }
}

TEST_F(UlyssesctlTest, ValidateJsonHasTheDefaultedFields) {
  Result r = Run({"-o", "json", "validate", "-f", Example("tiny-demo.yaml")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kind"], "TrainJob");
  EXPECT_EQ(j["metadata"]["name"], "tiny-demo");
  EXPECT_EQ(j["spec"]["model"]["hidden_size"], 256);
  EXPECT_EQ(j["spec"]["model"]["num_key_value_heads"], 4);
  EXPECT_EQ(j["spec"]["parallelism"]["zero_stage"], 0);
  EXPECT_EQ(j["spec"]["optimizer"]["schedule"], "cosine");
  ASSERT_EQ(j["spec"]["optimizer"]["betas"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["spec"]["optimizer"]["betas"][1].get<double>(), 0.95);
  EXPECT_EQ(j["spec"]["data"]["synthetic"]["generator"], "needle");
  ASSERT_EQ(j["spec"]["stages"].size(), 3u);
  EXPECT_EQ(j["spec"]["stages"][2]["seq_len"], 4096);
  EXPECT_EQ(j["spec"]["stages"][2]["sp_degree"], 4);
  EXPECT_EQ(j["spec"]["seed"], 1234);
  // -o after the verb works the same.
  Result after = Run({"validate", "-f", Example("tiny-demo.yaml"), "-o", "json"});
  ASSERT_EQ(after.exit_code, 0) << after.err;
  EXPECT_EQ(nlohmann::json::parse(after.out), j);
}

TEST_F(UlyssesctlTest, ValidateJsonPrintsTheModelShapeFieldList) {
  // The model section comes from the shape field list: nested rope_scaling when scaled,
  // none of it when not.
  Result r = Run({"-o", "json", "validate", "-f", Example("llama3-8b-1m.yaml")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json model = nlohmann::json::parse(r.out)["spec"]["model"];
  EXPECT_EQ(model["rope_theta"], 500000.0);
  EXPECT_EQ(model["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(model["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(model["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(model["tie_word_embeddings"], false);
  Result tiny = Run({"-o", "json", "validate", "-f", Example("tiny-demo.yaml")});
  ASSERT_EQ(tiny.exit_code, 0) << tiny.err;
  EXPECT_FALSE(nlohmann::json::parse(tiny.out)["spec"]["model"].contains("rope_scaling"));
}

TEST_F(UlyssesctlTest, ValidateTableSummarisesStages) {
  Result r = Run({"validate", "-f", Example("tiny-demo.yaml"), "-o", "table"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u) << r.out;  // summary, header, 3 stages
  EXPECT_THAT(lines[0], HasSubstr("job tiny-demo: model tiny"));
  EXPECT_THAT(lines[1], HasSubstr("SEQ_LEN"));
  EXPECT_THAT(lines[1], HasSubstr("WORLD"));
  const std::vector<std::string> last = absl::StrSplit(lines[4], ' ', absl::SkipEmpty());
  ASSERT_GE(last.size(), 7u);
  EXPECT_EQ(last[1], "4096");   // seq_len
  EXPECT_EQ(last[3], "4");      // sp
  EXPECT_EQ(last[5], "4");      // world
  EXPECT_EQ(last[6], "0.001");  // lr
}

TEST_F(UlyssesctlTest, ValidateReportsEveryErrorPrefixedWithTheFile) {
  const std::string path = Write("bad.yaml", kBadSpec);
  Result r = Run({"validate", "-f", path});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  const std::vector<std::string> lines = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << r.err;
  EXPECT_EQ(lines[0], path +
                          ": spec.stages[2].seq_len: 100001 is not divisible by sp_degree 8 "
                          "(try 98304 or 106496)");
  EXPECT_EQ(lines[1], path + ": spec.checkpoint.keep_last: 0 must be >= 1 (use e.g. 2)");
}

TEST_F(UlyssesctlTest, ValidateAppliesSetOverrides) {
  const std::string path = Write("bad.yaml", kBadSpec);
  Result r = Run({"validate", "-f", path, "--set", "spec.stages[2].seq_len=106496", "--set",
                  "spec.checkpoint.keep_last=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("{seq_len: 106496, steps: 5}"));
  EXPECT_THAT(r.out, HasSubstr("keep_last: 3"));
  Result bad = Run({"validate", "-f", path, "--set", "spec.stages[0].stpes=1"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr(path + ": --set spec.stages[0].stpes=1: spec.stages[0].stpes is "
                                        "not a known field (did you mean 'steps'?)"));
}

TEST_F(UlyssesctlTest, ValidateNeverCrashesOnBadFiles) {
  std::string junk;
  for (int i = 0; i < 4096; ++i) {
    junk += static_cast<char>((i * 7919) % 256);
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {Write("empty.yaml", ""), "empty document"},
      {Write("junk.yaml", junk), ": "},
      {Write("list.yaml", "- 1\n- 2\n"), "a list is not a mapping"},
      {Write("broken.yaml", "spec: {model: [\n"), "yaml: line "},
      {(dir_ / "missing.yaml").string(), "cannot read (No such file or directory)"},
      {dir_.string(), "is not a regular file"},
  };
  for (const auto& [path, expected] : cases) {
    SCOPED_TRACE(path);
    Result r = Run({"validate", "-f", path});
    EXPECT_EQ(r.signal, 0);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr(expected));
    EXPECT_THAT(r.err, HasSubstr(path + ": "));
  }
}

TEST_F(UlyssesctlTest, ValidateCheckFilesNamesTheFile) {
  const std::string short_file = Write("train.bin", std::string(400, '\0'));  // 100 tokens
  const std::string spec = std::string(R"(apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: files}
spec:
  model: {preset: tiny}
  data: {train: ')") + short_file +
                           R"('}
  stages: [{seq_len: 1024, steps: 1}]
)";
  const std::string path = Write("files.yaml", spec);
  Result plain = Run({"validate", "-f", path});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  Result checked = Run({"validate", "-f", path, "--check-files"});
  EXPECT_EQ(checked.exit_code, 2);
  EXPECT_THAT(checked.err, HasSubstr("spec.data.train: '" + short_file +
                                     "' holds 100 tokens, needs at least 1025"));
}

// Usage errors are bad input: exit 2 (common/contract/exit.h), whether CLI11 or
// ulyssesctl itself finds them.
TEST_F(UlyssesctlTest, UsageErrorsExitTwo) {
  Result no_file = Run({"validate"});
  EXPECT_EQ(no_file.exit_code, 2);
  EXPECT_THAT(no_file.err, HasSubstr("--file is required"));
  Result no_verb = Run({});
  EXPECT_EQ(no_verb.exit_code, 2);
  EXPECT_THAT(no_verb.err, HasSubstr("subcommand is required"));
  Result unknown = Run({"-o", "json", "frobnicate", "-f", "x"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("unknown verb 'frobnicate' (use one of: validate, plan, "));
  Result bad_format = Run({"-o", "xml", "validate", "-f", Example("tiny-demo.yaml")});
  EXPECT_EQ(bad_format.exit_code, 2);
  EXPECT_THAT(bad_format.err, HasSubstr("xml not in {table,json,yaml}"));
  Result unknown_flag = Run({"validate", "-f", Example("tiny-demo.yaml"), "--frobnicate"});
  EXPECT_EQ(unknown_flag.exit_code, 2);
  EXPECT_THAT(unknown_flag.err, HasSubstr("--frobnicate"));
  Result help = Run({"validate", "--help"});
  EXPECT_EQ(help.exit_code, 0);
}

TEST_F(UlyssesctlTest, HelpHasExamplesOnEveryVerb) {
  Result top = Run({"--help"});
  ASSERT_EQ(top.exit_code, 0);
  EXPECT_THAT(top.out, HasSubstr("Examples:"));
  EXPECT_THAT(top.out, HasSubstr("--coordinator"));
  for (const std::string verb : {"validate", "plan", "submit", "get", "describe", "watch", "top",
                                 "logs", "cancel", "resume"}) {
    SCOPED_TRACE(verb);
    EXPECT_THAT(top.out, HasSubstr(verb));
    Result r = Run({verb, "--help"});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_THAT(r.out, HasSubstr("Examples:\n  ulyssesctl " + verb));
  }
}

// The control-plane verbs (client/cmd_jobs.cc) against a coordinator that is not
// there: one line naming the address, exit 1. tests/e2e runs them against a real one.
TEST_F(UlyssesctlTest, ControlPlaneVerbsNameAnUnreachableCoordinator) {
  const std::vector<std::vector<std::string>> calls = {
      {"submit", "-f", Example("tiny-demo.yaml")},
      {"get"},
      {"describe", "job", "job-000001"},
      {"watch", "job-000001", "--timeout-s", "5"},
      {"top"},
      {"logs", "job-000001"},
      {"cancel", "job-000001"},
      {"resume", "job-000001"},
  };
  for (auto args : calls) {
    SCOPED_TRACE(args[0]);
    args.push_back("--coordinator");
    args.push_back("127.0.0.1:1");
    Result r = Run(args);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("error: cannot reach the coordinator at 127.0.0.1:1"));
  }
}

TEST_F(UlyssesctlTest, CoordinatorComesFromFlagThenEnvironment) {
  Result env = Run({"get"}, {{"ULYSSES_COORDINATOR", "127.0.0.1:2"}});
  EXPECT_THAT(env.err, HasSubstr("coordinator at 127.0.0.1:2 "));
  Result flag =
      Run({"get", "--coordinator", "127.0.0.1:3"}, {{"ULYSSES_COORDINATOR", "127.0.0.1:2"}});
  EXPECT_THAT(flag.err, HasSubstr("coordinator at 127.0.0.1:3 "));
}

// The Llama-3.1-8B shape without ZeRO or offload: 32K at SP 8 fits an H100, 1M at SP 32
// does not (18 bytes per parameter replicated).
constexpr char kBigSpec[] = R"(apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: big}
spec:
  model: {preset: llama3-8b, dtype: bfloat16}
  data: {synthetic: {generator: random}}
  memory: {activation_checkpointing: true, tiled_mlp: true, tiled_loss: true}
  stages:
    - {seq_len: 32768, steps: 10, sp_degree: 8}
    - {seq_len: 1048576, steps: 10, sp_degree: 32}
)";

// The shipped 8B recipe (optimizer and activation offload): plan shows each stage's pinned host
// memory and device<->host traffic; --max-seq N answers the longest sequence on N H100s with the
// term that limits it, and refuses an sp that does not divide the heads.
TEST_F(UlyssesctlTest, PlanShowsOffloadPerStageAndMaxSeq) {
  const std::string recipe =
      std::string(std::getenv("ULYSSES_SOURCE_DIR")) + "/configs/jobs/llama3-8b-1m.yaml";
  Result table = Run({"plan", "-f", recipe});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("offload per rank (pinned host memory; device<->host traffic"));
  EXPECT_THAT(table.out, HasSubstr("PINNED_HOST"));
  Result one = Run({"plan", "-f", recipe, "--max-seq", "1", "-o", "json"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const nlohmann::json j = nlohmann::json::parse(one.out);
  EXPECT_EQ(j["gpus"], 1);
  EXPECT_GT(j["max_seq_len"].get<int64_t>(), 100000);
  EXPECT_LT(j["max_seq_len"].get<int64_t>(), 500000);
  EXPECT_THAT(j["limit"].get<std::string>(), HasSubstr("largest term grads"));
  EXPECT_GT(j["offload_bytes_per_s"].get<double>(), 0);
  Result eight = Run({"plan", "-f", recipe, "--max-seq", "8"});
  ASSERT_EQ(eight.exit_code, 0) << eight.err;
  EXPECT_THAT(eight.out, HasSubstr("longest sequence on 8 h100 (sp 8, dp 1; zero_stage 3"));
  EXPECT_THAT(eight.out, HasSubstr("largest term act_peak"));
  Result bad = Run({"plan", "-f", recipe, "--max-seq", "3"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("sp 3 must divide the model's 32 attention heads"));
}

TEST_F(UlyssesctlTest, PlanShowsTokensAllToAllVolumeAndVerdict) {
  const std::string big = Write("big.yaml", kBigSpec);
  Result table = Run({"plan", "-f", big});
  // A stage does not fit: the whole plan is printed and the exit is 3 (docs/CONTRACTS.md).
  ASSERT_EQ(table.exit_code, 3) << table.err;
  EXPECT_THAT(table.out, HasSubstr("TOKENS/RANK"));
  EXPECT_THAT(table.out, HasSubstr("8.0G parameters"));
  EXPECT_THAT(table.out, HasSubstr("device h100: 80.0 GiB per rank"));
  EXPECT_THAT(table.out, HasSubstr("DOES NOT FIT"));
  EXPECT_THAT(table.out,
              HasSubstr("stage 1 of 2 DOES NOT FIT: changes that fit and pass validation, "
                        "cheapest by GPU-hours first:\n  1. --set "));
  EXPECT_THAT(table.out, HasSubstr("verdict: DOES NOT FIT (stages 1, 2; exit 3)"));
  Result r = Run({"plan", "-f", big, "-o", "json"});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  // Stage 1 (j[0]; "stage" is 1-based as everywhere a person reads it): N = 32768, P = 8:
  // 4096 tokens per rank, 8 kv heads sharded 1 per rank.
  EXPECT_EQ(j[0]["stage"], 1);
  EXPECT_EQ(j[1]["stage"], 2);
  EXPECT_EQ(j[0]["tokens_per_rank"], 4096);
  EXPECT_EQ(j[0]["kv_heads_exchanged"], 8);
  EXPECT_EQ(j[0]["a2a_elements_per_layer_per_rank"], (2 * 32 + 2 * 8) * 128 * 4096);
  // Stage 2: N = 1M, P = 32: kv heads replicated to 32.
  EXPECT_EQ(j[1]["world_size"], 32);
  EXPECT_EQ(j[1]["tokens_per_rank"], 32768);
  EXPECT_EQ(j[1]["kv_heads_exchanged"], 32);
  EXPECT_EQ(j[1]["a2a_elements_per_layer_per_rank"], int64_t{(2 * 32 + 2 * 32) * 128} * 32768);
  EXPECT_EQ(j[1]["a2a_bytes_per_layer_per_rank"], int64_t{(2 * 32 + 2 * 32) * 128} * 32768 * 2);
  EXPECT_GT(j[1]["activation_bytes_per_rank"].get<int64_t>(),
            j[0]["activation_bytes_per_rank"].get<int64_t>());
  // ZeRO 0 keeps 18 bytes per parameter on every rank: more than 80 GiB.
  EXPECT_EQ(j[0]["fits"], false);
  EXPECT_GT(j[0]["model_state_bytes_per_rank"].get<int64_t>(), int64_t{80} << 30);
  ASSERT_TRUE(j[0]["fix"].is_array());
  EXPECT_EQ(j[0]["fixed"]["fits"], true);
  EXPECT_GT(j[0]["step_seconds"].get<double>(), 0);
  // A bigger device changes the verdict's reference.
  Result h200 = Run({"plan", "-f", big, "--device-type", "h200", "-o", "json"});
  ASSERT_EQ(h200.exit_code, 3) << h200.err;
  EXPECT_EQ(nlohmann::json::parse(h200.out)[0]["device_bytes_per_rank"], int64_t{141000000000});
  Result bad = Run({"plan", "-f", Write("bad.yaml", kBadSpec)});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("is not divisible by sp_degree 8 (try 98304 or 106496)"));
  Result bad_size = Run({"plan", "-f", big, "--gpu-memory", "80GB!"});
  EXPECT_EQ(bad_size.exit_code, 2);
  EXPECT_THAT(bad_size.err, HasSubstr("--gpu-memory: '80GB!' has an unknown unit 'gb!'"));
  Result bad_device = Run({"plan", "-f", big, "--device-type", "v100"});
  EXPECT_EQ(bad_device.exit_code, 2);
  EXPECT_THAT(bad_device.err, HasSubstr("--device-type: 'v100' is not a known device"));
}

TEST_F(UlyssesctlTest, ValidateRefusesAStageThatDoesNotFitUnlessForced) {
  const std::string big = Write("big.yaml", kBigSpec);
  // No device flag: no memory check.
  Result plain = Run({"validate", "-f", big});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  Result refused = Run({"validate", "-f", big, "--device-type", "h100"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_EQ(refused.out, "");
  EXPECT_THAT(refused.err, HasSubstr(big + ": spec.stages[0]: seq_len 32768 at sp 8 needs "));
  EXPECT_THAT(refused.err, HasSubstr("of one h100 rank (fix: --set "));
  EXPECT_THAT(refused.err, HasSubstr("spec.stages[1]: seq_len 1048576 at sp 32 needs "));
  // --gpu-memory alone checks too, against that size.
  Result sized = Run({"validate", "-f", big, "--gpu-memory", "200GiB"});
  EXPECT_EQ(sized.exit_code, 0) << sized.err;
  Result forced = Run({"validate", "-f", big, "--device-type", "h100", "--force"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_THAT(forced.out, HasSubstr("apiVersion: ulysses/v1"));
  EXPECT_THAT(forced.err, HasSubstr(big + ": warning (--force): spec.stages[0]: "));
}

TEST_F(UlyssesctlTest, SubmitRefusesAStageThatDoesNotFitBeforeCallingTheCoordinator) {
  const std::string big = Write("big.yaml", kBigSpec);
  // Nothing listens on 127.0.0.1:1: reaching the coordinator would fail with exit 1.
  Result refused =
      Run({"submit", "-f", big, "--device-type", "h100", "--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, HasSubstr("spec.stages[0]: seq_len 32768 at sp 8 needs "));
  EXPECT_THAT(refused.err, Not(HasSubstr("cannot reach the coordinator")));
  Result forced = Run(
      {"submit", "-f", big, "--device-type", "h100", "--force", "--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(forced.exit_code, 1);
  EXPECT_THAT(forced.err, HasSubstr("warning (--force)"));
  EXPECT_THAT(forced.err, HasSubstr("cannot reach the coordinator at 127.0.0.1:1"));
}

// Plaintext to a non-loopback coordinator is refused with a fix ulyssesctl has: its TLS
// settings live in a context (`config set-context --ca / --insecure`), not on every verb.
TEST_F(UlyssesctlTest, PlaintextRefusalNamesFlagsThatExist) {
  Result r = Run({"get", "--coordinator", "10.255.255.1:50051"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is not a loopback address and no CA is given"));
  EXPECT_THAT(r.err, HasSubstr("ulyssesctl `config set-context NAME --server HOST:PORT --ca "
                               "CA.pem`"));
  EXPECT_THAT(r.err, HasSubstr("ulyssesctl `config set-context NAME --insecure true`"));
  // What the message names is real: set-context takes both; a verb takes neither.
  Result help = Run({"config", "set-context", "--help"});
  EXPECT_THAT(help.out, HasSubstr("--ca"));
  EXPECT_THAT(help.out, HasSubstr("--insecure"));
  EXPECT_EQ(Run({"get", "--ca", "x.pem"}).exit_code, 2);
}

// Llama-3.1-70B's published config.json (the keys that shape the model).
constexpr char kLlama70bConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "attention_bias": false, "mlp_bias": false, "vocab_size": 128256, "hidden_size": 8192,
  "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
  "num_key_value_heads": 8, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
  "tie_word_embeddings": false, "max_position_embeddings": 131072,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
})";

std::string InitFromSpec(const std::string& dir) {
  return absl::StrCat(R"(apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: finetune-70b}
spec:
  model: {init_from: )",
                      dir, R"(, dtype: bfloat16}
  data: {synthetic: {generator: random}}
  memory: {tiled_loss: true}
  stages:
    - {seq_len: 131072, steps: 100, sp_degree: 8}
)");
}

// plan and validate --device-type plan the model init_from loads, read from its config.json by
// the engine's reader: a 70B fine-tune at SP 8 and 128K is 70.6G parameters and does not fit;
// an unreadable config.json is an error naming it, not a 0-parameter plan.
// A stage's RoPE (stages[i].rope): plan shows every stage's, the later stages keeping it.
TEST_F(UlyssesctlTest, PlanShowsEachStagesRope) {
  std::string text = kBigSpec;
  const std::string last = "    - {seq_len: 1048576, steps: 10, sp_degree: 32}";
  const size_t at = text.find(last);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, last.size(),
               "    - {seq_len: 131072, steps: 10, sp_degree: 32, rope: {rope_theta: 8000000}}\n"
               "    - {seq_len: 1048576, steps: 10, sp_degree: 32}");
  Result table = Run({"plan", "-f", Write("rope.yaml", text)});
  ASSERT_NE(table.exit_code, 2) << table.err;
  EXPECT_THAT(table.out, HasSubstr("RoPE per stage (stages[i].rope applies from its stage on):"));
  EXPECT_THAT(table.out, HasSubstr("8000000.0 (stage)"));
  // Stage 3 has no rope of its own: it keeps stage 2's, without the mark.
  EXPECT_THAT(table.out, ::testing::ContainsRegex("\n3 +8000000.0 +"));
  Result plain = Run({"plan", "-f", Write("plain.yaml", kBigSpec)});
  EXPECT_THAT(plain.out, Not(HasSubstr("RoPE per stage")));
}

TEST_F(UlyssesctlTest, PlanAndValidateReadTheInitFromShape) {
  std::filesystem::create_directories(dir_ / "llama70b");
  Write("llama70b/config.json", kLlama70bConfig);
  const std::string spec = Write("ft.yaml", InitFromSpec((dir_ / "llama70b").string()));
  Result table = Run({"plan", "-f", spec});
  EXPECT_EQ(table.exit_code, 3) << table.err;
  EXPECT_THAT(table.out, HasSubstr("job finetune-70b: 70.6G parameters, 80 layers, 64q/8kv heads"));
  EXPECT_THAT(table.out, HasSubstr("DOES NOT FIT"));
  EXPECT_THAT(table.out, HasSubstr("verdict: DOES NOT FIT (stage 1; exit 3)"));
  Result json = Run({"plan", "-f", spec, "-o", "json"});
  ASSERT_EQ(json.exit_code, 3) << json.err;
  const nlohmann::json rows = nlohmann::json::parse(json.out);
  EXPECT_EQ(rows[0]["fits"], false);
  EXPECT_EQ(rows[0]["init_is_import"], true);
  EXPECT_GT(rows[0]["parameter_bytes_per_rank"].get<double>(), 100e9);  // 70.6G x 2 B, replicated
  Result checked = Run({"validate", "-f", spec, "--device-type", "h100"});
  EXPECT_EQ(checked.exit_code, 2);
  EXPECT_THAT(checked.err, HasSubstr(spec + ": spec.stages[0]: seq_len 131072 at sp 8 needs "));
  // validate alone still prints the spec as written (init_from, no shape).
  Result plain = Run({"validate", "-f", spec});
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_THAT(plain.out, Not(HasSubstr("hidden_size")));

  const std::string missing = Write("missing.yaml", InitFromSpec((dir_ / "nowhere").string()));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"plan", "-f", missing},
        std::vector<std::string>{"validate", "-f", missing, "--device-type", "h100"}}) {
    Result r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << args[0];
    EXPECT_THAT(r.err, HasSubstr(missing + ": spec.model.init_from: cannot open " +
                                 (dir_ / "nowhere" / "config.json").string()));
    EXPECT_EQ(r.out, "") << args[0];
  }
  std::filesystem::create_directories(dir_ / "broken");
  Write("broken/config.json", "{not json");
  Result broken =
      Run({"plan", "-f", Write("broken.yaml", InitFromSpec((dir_ / "broken").string()))});
  EXPECT_EQ(broken.exit_code, 2);
  EXPECT_THAT(broken.err, HasSubstr("config.json is not a JSON object"));
}

// Every change plan prints for a stage that does not fit passes validate and fits the device:
// `validate --device-type` with those --set arguments exits 0.
TEST_F(UlyssesctlTest, EveryFixPlanPrintsPassesValidate) {
  std::filesystem::create_directories(dir_ / "llama70b");
  Write("llama70b/config.json", kLlama70bConfig);
  const std::string ft = Write("ft.yaml", InitFromSpec((dir_ / "llama70b").string()));
  int checked = 0;
  for (const std::string& spec : {Write("big.yaml", kBigSpec), ft}) {
    Result plan = Run({"plan", "-f", spec});
    ASSERT_EQ(plan.exit_code, 3) << plan.err;
    for (absl::string_view line : absl::StrSplit(plan.out, '\n')) {
      // "  1. --set a=1 --set b=2   (world 8, step ..., ... GPU-h for the stage)"
      const size_t at = line.find(". --set ");
      if (at == absl::string_view::npos) continue;
      const absl::string_view sets = line.substr(at + 2, line.find("   (") - at - 2);
      std::vector<std::string> args = {"validate", "-f", spec, "--device-type", "h100"};
      for (absl::string_view part : absl::StrSplit(sets, "--set ", absl::SkipWhitespace())) {
        args.push_back("--set");
        args.push_back(std::string(absl::StripAsciiWhitespace(part)));
      }
      Result r = Run(args);
      EXPECT_EQ(r.exit_code, 0) << sets << "\n" << r.err;
      ++checked;
    }
  }
  EXPECT_GE(checked, 3);
}

}  // namespace
}  // namespace ulysses::client
