// End-to-end tests of the ulysses-train binary: real processes over Gloo on
// loopback, token files on disk, checkpoints on disk.
//   - 20 training steps at sp 1 and sp 4 give the same per-step losses (1e-4 rel);
//     eval of the result at sp 4 equals sp 1.
//   - kill -9 mid-stage, then restart: per-step losses bit-identical to an
//     uninterrupted run (same layout).
//   - SIGTERM -> exit 75 with a committed checkpoint; resuming at another sp
//     degree continues within tolerance of the uninterrupted run.
//   - SIGTERM with a grace shorter than a (held) step: exit 75 within the grace, the last finished
//     step committed, the rerun resumes from it bit-identically.
//   - a running rank takes a new checkpoint interval from its --control stdin channel.
//   - kill -9 in the middle of a checkpoint save (shards written, no manifest; held
//     there by the checkpoint.before_manifest failpoint): the previous checkpoint stays
//     the latest and loads, a rerun resumes from it bit-identically and re-commits
//     the half-written step; the same for an asynchronous save killed while its background
//     writer holds it there, and asynchronous saves write the same bytes as synchronous ones.
//   - export -> scripts/reference_llama.py loss == ulysses-train eval --init-from.
//   - bad input: clear message, exit 2, nothing overwritten.
//   - a packed, masked long-document job (data pack -> format: indexed) trains with micro-batches,
//     accumulation and bounded eval, and resumes after kill -9 reading the same sequences, also
//     on another layout (sp/dp/micro-batching): the checkpoint's data cursor says where to go on.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_tree.h"
#include "tests/testing/documents.h"
#include "worker/engine/checkpoint/checkpoint.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Bin() {
  const char* d = std::getenv("ULYSSES_BIN_DIR");
  return std::string(d ? d : "build/bin") + "/ulysses-train";
}
std::string Src() {
  const char* d = std::getenv("ULYSSES_SOURCE_DIR");
  return d ? d : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Proc {
  pid_t pid = -1;
  std::string out, err;
};

// Starts argv in its own process group, stdout/stderr to files. `env` ("K=V") is added
// to this process's environment for the child only (ahead of it, so it wins getenv);
// ULYSSES_FAILPOINT* is never inherited: only a child given it in `env` gets it.
Proc Start(const std::vector<std::string>& argv, const std::string& tag, const fs::path& dir,
           const std::vector<std::string>& env = {}) {
  Proc p;
  p.out = (dir / (tag + ".out")).string();
  p.err = (dir / (tag + ".err")).string();
  std::vector<char*> args, envp;  // Built before fork: the child does not allocate.
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("ULYSSES_FAILPOINT", 0) != 0) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  p.pid = fork();
  if (p.pid == 0) {
    setpgid(0, 0);
    int o = open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  setpgid(p.pid, p.pid);
  return p;
}

int Wait(const Proc& p, int timeout_s = 150) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (waitpid(p.pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      ADD_FAILURE() << "timed out";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct Result {
  int code = -1;
  std::string out, err;
};

Result RunCmd(const std::vector<std::string>& args, const fs::path& dir, const std::string& tag) {
  std::vector<std::string> argv = {Bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  Proc p = Start(argv, tag, dir);
  Result r;
  r.code = Wait(p);
  r.out = ReadFile(p.out);
  r.err = ReadFile(p.err);
  return r;
}

void WriteTokens(const fs::path& path, int64_t n, uint32_t seed) {
  // A noisy deterministic successor sequence over vocab 64: learnable, not trivial.
  std::vector<uint32_t> t(n);
  uint32_t x = seed;
  t[0] = 1;
  for (int64_t i = 1; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = ((x >> 24) % 4 == 0) ? (x >> 16) % 64 : (t[i - 1] * 5 + 3) % 64;
  }
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(n * 4));
}

class TrainE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ulysses-e2e-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ulysses::RemoveTree(dir_).IgnoreError();
    fs::create_directories(dir_);
    WriteTokens(dir_ / "train.bin", 40000, 1);
    WriteTokens(dir_ / "val.bin", 1024, 2);
    job_ = (dir_ / "job.yaml").string();
    std::ofstream(job_) << "apiVersion: ulysses/v1\n"
                           "kind: TrainJob\n"
                           "metadata: {name: e2e}\n"
                           "spec:\n"
                           "  model: {vocab_size: 64, hidden_size: 64, intermediate_size: 96,\n"
                           "          num_hidden_layers: 2, num_attention_heads: 4,\n"
                           "          num_key_value_heads: 2}\n"
                           "  data: {train: "
                        << (dir_ / "train.bin").string()
                        << ", validation: " << (dir_ / "val.bin").string()
                        << "}\n"
                           "  memory: {attention_block_size: 32}\n"
                           "  optimizer: {lr: 3.0e-3, warmup_steps: 2}\n"
                           "  stages: [{seq_len: 128, steps: 20}]\n"
                           "  checkpoint: {every_steps: 5, keep_last: 2}\n"
                           "  seed: 7\n";
  }
  void TearDown() override {
    if (!HasFailure()) ulysses::RemoveTree(dir_).IgnoreError();
  }

  std::vector<std::string> TrainArgs(const std::string& out, std::vector<std::string> sets) {
    std::vector<std::string> a = {"train", "-f", job_, "--out", (dir_ / out).string()};
    for (auto& s : sets) {
      a.push_back("--set");
      a.push_back(s);
    }
    return a;
  }

  // step_in_stage -> the last metrics.jsonl line written for that step, ignoring the file's
  // first `skip_lines` lines (and a line cut by kill -9).
  std::map<int64_t, json> StepLines(const std::string& out, size_t skip_lines) {
    std::map<int64_t, json> m;
    std::ifstream f(dir_ / out / "metrics.jsonl");
    std::string line;
    for (size_t i = 0; i < skip_lines && std::getline(f, line); ++i) {
    }
    while (std::getline(f, line)) {
      json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || j.contains("eval")) continue;
      m[j["step_in_stage"].get<int64_t>()] = j;
    }
    return m;
  }
  // step_in_stage -> loss.
  std::map<int64_t, double> Losses(const std::string& out, size_t skip_lines = 0) {
    std::map<int64_t, double> m;
    for (auto& [step, j] : StepLines(out, skip_lines)) m[step] = j["loss"].get<double>();
    return m;
  }
  // step_in_stage -> data_cursor (the first sequence of the stage's stream the step read).
  std::map<int64_t, int64_t> Cursors(const std::string& out, size_t skip_lines = 0) {
    std::map<int64_t, int64_t> m;
    for (auto& [step, j] : StepLines(out, skip_lines)) m[step] = j["data_cursor"].get<int64_t>();
    return m;
  }

  // The step of the newest committed checkpoint (a step-N directory with its manifest) under
  // out/checkpoints, or -1 when there is none.
  int64_t LatestCommittedStep(const std::string& out) {
    int64_t latest = -1;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(dir_ / out / "checkpoints", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step-", 0) != 0 || !fs::exists(e.path() / "manifest.json")) continue;
      latest = std::max<int64_t>(latest, std::stoll(name.substr(5)));
    }
    return latest;
  }

  size_t MetricLines(const std::string& out) {
    std::ifstream f(dir_ / out / "metrics.jsonl");
    std::string line;
    size_t n = 0;
    while (std::getline(f, line)) ++n;
    return n;
  }

  void WaitForLines(const std::string& out, size_t n, const Proc& p) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (MetricLines(out) < n) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no progress";
      int status = 0;
      ASSERT_EQ(waitpid(p.pid, &status, WNOHANG), 0) << "exited early: " << ReadFile(p.err);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Waits (bounded) for `path` to appear, i.e. for an event the process signals by
  // creating it; false (with a failure recorded) if it exits first or the deadline passes.
  bool WaitForFile(const fs::path& path, const Proc& p) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!fs::exists(path)) {
      int status = 0;
      if (waitpid(p.pid, &status, WNOHANG) != 0) {
        ADD_FAILURE() << "exited before creating " << path << ": " << ReadFile(p.err);
        return false;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << path << " did not appear: " << ReadFile(p.err);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  json EvalJson(const Result& r) {
    EXPECT_EQ(r.code, 0) << r.err;
    return json::parse(r.out.substr(0, r.out.find('\n')));
  }

  // Packs the 60 documents of tests/testing/documents.h (vocab 64) with `data pack` into dir_/ds
  // and points job_ at a job on it: sp 2, micro-batch 2 x grad_accum 2, 8 steps of 128 tokens,
  // checkpoints every 2 steps, eval of 3 sequences every 3.
  void WritePackedJob() {
    ASSERT_TRUE(ulysses::testing::WriteMaskedDocumentsJsonl((dir_ / "docs.jsonl").string()));
    const std::string prefix = (dir_ / "ds").string();
    Result pack = RunCmd({"data", "pack", "--jsonl", (dir_ / "docs.jsonl").string(), "--out",
                          prefix, "--vocab-size", "64"},
                         dir_, "pack");
    ASSERT_EQ(pack.code, 0) << pack.err;
    json packed = json::parse(pack.out.substr(0, pack.out.find('\n')));
    EXPECT_EQ(packed["documents"], 60);
    EXPECT_EQ(packed["mask"], true);
    job_ = (dir_ / "packed.yaml").string();
    std::ofstream(job_) << "apiVersion: ulysses/v1\n"
                           "kind: TrainJob\n"
                           "metadata: {name: packed}\n"
                           "spec:\n"
                           "  model: {vocab_size: 64, hidden_size: 64, intermediate_size: 96,\n"
                           "          num_hidden_layers: 2, num_attention_heads: 4,\n"
                           "          num_key_value_heads: 2}\n"
                           "  data: {train: "
                        << prefix << ", validation: " << prefix
                        << ", format: indexed}\n"
                           "  parallelism: {sp_degree: 2}\n"
                           "  memory: {attention_block_size: 32}\n"
                           "  optimizer: {lr: 3.0e-3, warmup_steps: 2, micro_batch_size: 2,\n"
                           "              grad_accum_steps: 2}\n"
                           "  stages: [{seq_len: 128, steps: 8}]\n"
                           "  checkpoint: {every_steps: 2, keep_last: 2}\n"
                           "  eval: {max_sequences: 3, every_steps: 3}\n"
                           "  seed: 7\n";
  }

  fs::path dir_;
  std::string job_;
};

TEST_F(TrainE2eTest, Sp4TrainingAndEvalMatchSp1) {
  Result a = RunCmd(TrainArgs("sp1", {}), dir_, "sp1");
  ASSERT_EQ(a.code, 0) << a.err;
  std::vector<std::string> sp4_args = TrainArgs("sp4", {"spec.parallelism.sp_degree=4"});
  sp4_args.insert(sp4_args.end(), {"--peak-flops", "1e12"});
  Result b = RunCmd(sp4_args, dir_, "sp4");
  ASSERT_EQ(b.code, 0) << b.err;
  // The step events carry the group figures (slowest of the 4 ranks, median, MFU), and
  // stderr has one human progress line per step with the same figures.
  int with_group = 0;
  std::istringstream events(b.out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("event", "") != "step") continue;
    ASSERT_TRUE(j.contains("slowest_rank") && j.contains("mfu")) << line;
    EXPECT_GE(j["slowest_rank"].get<int>(), 0) << line;
    EXPECT_LT(j["slowest_rank"].get<int>(), 4) << line;
    EXPECT_GE(j["slowest_step_seconds"].get<double>(), j["median_step_seconds"].get<double>());
    EXPECT_GT(j["mfu"].get<double>(), 0.0) << line;
    ++with_group;
  }
  EXPECT_EQ(with_group, 20) << b.out;
  EXPECT_NE(b.err.find("stage 0 step 20/20 seq_len 128 loss "), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("% slowest r"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("s ago"), std::string::npos) << "checkpoint age after a commit: " << b.err;
  EXPECT_EQ(a.err.find(" mfu "), std::string::npos) << "no MFU without --peak-flops: " << a.err;
  auto la = Losses("sp1"), lb = Losses("sp4");
  ASSERT_EQ(la.size(), 20u);
  ASSERT_EQ(lb.size(), 20u);
  for (auto& [step, loss] : la) {
    EXPECT_NEAR(lb[step], loss, 1e-4 * loss) << "step " << step;
  }
  EXPECT_LT(la[20], la[1]) << "loss did not fall";
  // stdout carries the event contract.
  EXPECT_NE(a.out.find("\"event\":\"step\""), std::string::npos);
  EXPECT_NE(a.out.find("\"event\":\"eval\""), std::string::npos);
  EXPECT_NE(a.out.find("\"event\":\"done\""), std::string::npos);
  // Eval of the sp1 result at sp 4 == sp 1.
  std::string ckpt;
  for (auto& e : fs::directory_iterator(dir_ / "sp1" / "checkpoints"))
    ckpt = std::max(ckpt, e.path().string());
  json e1 = EvalJson(RunCmd({"eval", "-f", job_, "--checkpoint", ckpt}, dir_, "eval1"));
  json e4 =
      EvalJson(RunCmd({"eval", "-f", job_, "--checkpoint", ckpt, "--nproc", "4"}, dir_, "eval4"));
  EXPECT_EQ(e1["tokens"], e4["tokens"]);
  EXPECT_GT(e1["tokens"].get<int64_t>(), 0);
  EXPECT_NEAR(e1["loss"].get<double>(), e4["loss"].get<double>(), 1e-5 * e1["loss"].get<double>());

  // Reference check: export -> independent PyTorch Llama loss == eval --init-from.
  Result ex =
      RunCmd({"export", "--checkpoint", ckpt, "--hf-out", (dir_ / "hf").string()}, dir_, "export");
  ASSERT_EQ(ex.code, 0) << ex.err;
  Result again =
      RunCmd({"export", "--checkpoint", ckpt, "--hf-out", (dir_ / "hf").string()}, dir_, "export2");
  EXPECT_EQ(again.code, 2) << "export must not overwrite";
  json ei =
      EvalJson(RunCmd({"eval", "-f", job_, "--init-from", (dir_ / "hf").string()}, dir_, "evalhf"));
  const std::string ref_cmd = "/usr/bin/python3 " + Src() + "/scripts/reference_llama.py --hf " +
                              (dir_ / "hf").string() + " --tokens " + (dir_ / "val.bin").string() +
                              " --seq-len 128 > " + (dir_ / "ref.json").string();
  ASSERT_EQ(std::system(ref_cmd.c_str()), 0);
  json ref = json::parse(ReadFile((dir_ / "ref.json").string()));
  EXPECT_EQ(ref["tokens"], ei["tokens"]);
  EXPECT_NEAR(ref["loss"].get<double>(), ei["loss"].get<double>(),
              1e-4 * ref["loss"].get<double>());
  EXPECT_NEAR(ei["loss"].get<double>(), e1["loss"].get<double>(), 1e-5 * e1["loss"].get<double>());

  // init_from with a shape its config.json disagrees with: names the field and both values,
  // exit 2.
  Result bad = RunCmd({"train", "-f", job_, "--out", (dir_ / "bad").string(), "--set",
                       "spec.model.init_from=" + (dir_ / "hf").string(), "--set",
                       "spec.model.intermediate_size=80"},
                      dir_, "badinit");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("spec.model.intermediate_size: 80 disagrees with 96 in " +
                         (dir_ / "hf" / "config.json").string()),
            std::string::npos)
      << bad.err;
}

TEST_F(TrainE2eTest, KillNineAndSigtermResume) {
  const std::vector<std::string> sp2 = {"spec.parallelism.sp_degree=2",
                                        "spec.checkpoint.every_steps=3"};
  Result ref = RunCmd(TrainArgs("ref", sp2), dir_, "ref");
  ASSERT_EQ(ref.code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 20u);

  // kill -9 of the whole process tree after step 8 (checkpoint at 6), then restart.
  std::vector<std::string> argv = {Bin()};
  for (auto& a : TrainArgs("killed", sp2)) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_);
  WaitForLines("killed", 8, p);
  kill(-p.pid, SIGKILL);
  Wait(p);
  const int64_t killed_at = LatestCommittedStep("killed");
  ASSERT_GE(killed_at, 6) << "no checkpoint committed before the kill";
  const size_t lines_before_restart = MetricLines("killed");
  Result resumed = RunCmd(TrainArgs("killed", sp2), dir_, "resumed");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  // The restart trained only the steps after its checkpoint: its first step line is the one
  // after the checkpoint (a restart from step 0 would rewrite steps 1.. with equal losses).
  auto restarted = StepLines("killed", lines_before_restart);
  ASSERT_FALSE(restarted.empty());
  EXPECT_EQ(restarted.begin()->first, killed_at + 1) << "the restart did not resume";
  auto lk = Losses("killed");
  ASSERT_EQ(lk.size(), 20u);
  for (auto& [step, loss] : lref) EXPECT_EQ(lk[step], loss) << "step " << step;  // bit-identical

  // SIGTERM: exit 75 with a committed checkpoint; resume at sp 4 continues within tolerance.
  std::vector<std::string> argv2 = {Bin()};
  for (auto& a : TrainArgs("term", {"spec.parallelism.sp_degree=2"})) argv2.push_back(a);
  Proc t = Start(argv2, "term", dir_);
  WaitForLines("term", 4, t);
  kill(t.pid, SIGTERM);
  ASSERT_EQ(Wait(t), 75) << ReadFile(t.err);
  EXPECT_NE(ReadFile(t.out).find("\"event\":\"checkpoint\""), std::string::npos);
  bool committed = false;
  for (auto& e : fs::directory_iterator(dir_ / "term" / "checkpoints")) {
    committed = committed || fs::exists(e.path() / "manifest.json");
  }
  EXPECT_TRUE(committed);
  const int64_t term_at = LatestCommittedStep("term");
  ASSERT_GE(term_at, 4) << "SIGTERM after step 4 must commit the step it stopped at";
  const size_t term_lines = MetricLines("term");
  Result r4 = RunCmd(TrainArgs("term", {"spec.parallelism.sp_degree=4"}), dir_, "term4");
  ASSERT_EQ(r4.code, 0) << r4.err;
  auto term_restarted = StepLines("term", term_lines);
  ASSERT_FALSE(term_restarted.empty());
  EXPECT_EQ(term_restarted.begin()->first, term_at + 1) << "the sp 4 restart did not resume";
  auto lt = Losses("term");
  ASSERT_EQ(lt.size(), 20u);
  for (auto& [step, loss] : lref) EXPECT_NEAR(lt[step], loss, 1e-4 * loss) << "step " << step;

  // A foreign job (other seed) refuses the checkpoint: exit 2, nothing touched.
  auto listing = [&] {
    std::vector<std::string> v;
    for (auto& e : fs::recursive_directory_iterator(dir_ / "term" / "checkpoints")) {
      v.push_back(e.path().string() + ":" +
                  std::to_string(fs::last_write_time(e.path()).time_since_epoch().count()));
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  auto before = listing();
  Result foreign = RunCmd(TrainArgs("term", {"spec.seed=8"}), dir_, "foreign");
  EXPECT_EQ(foreign.code, 2) << foreign.err;
  EXPECT_NE(foreign.err.find("spec hash"), std::string::npos) << foreign.err;
  EXPECT_EQ(listing(), before);
}

// A packed, masked long-document job (indexed data built by `ulysses-train data pack`, documents
// longer than seq_len, loss masks, micro_batch 2 x grad_accum 2, sp 2, bounded periodic eval)
// trains; kill -9 mid-stage and a restart reads exactly the sequences an uninterrupted run reads
// (bit-identical per-step losses).
TEST_F(TrainE2eTest, PackedMaskedDocumentsTrainAndResumeExactly) {
  WritePackedJob();
  ASSERT_FALSE(HasFatalFailure());
  const std::string prefix = (dir_ / "ds").string();
  // Packing again onto the same prefix is refused: nothing is overwritten.
  Result again = RunCmd(
      {"data", "pack", "--jsonl", (dir_ / "docs.jsonl").string(), "--out", prefix}, dir_, "pack2");
  EXPECT_EQ(again.code, 2) << again.err;
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;

  Result ref = RunCmd(TrainArgs("ref", {}), dir_, "ref");
  ASSERT_EQ(ref.code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 8u);
  EXPECT_LT(lref[8], lref[1]);  // it learns
  // Evals at steps 3 and 6 and at the stage end, each over at most 3 sequences.
  std::ifstream metrics(dir_ / "ref" / "metrics.jsonl");
  std::string line;
  int evals = 0;
  while (std::getline(metrics, line)) {
    json j = json::parse(line);
    if (!j.contains("eval")) {
      // 4 sequences of 128 per step; masked prompts, boundaries and padding score fewer.
      EXPECT_LT(j["tokens"].get<int64_t>(), 4 * 128);
      EXPECT_GT(j["tokens"].get<int64_t>(), 0);
      continue;
    }
    ++evals;
    EXPECT_EQ(j["eval"]["step_in_stage"], evals < 3 ? 3 * evals : 8) << line;
    EXPECT_LE(j["eval"]["tokens"].get<int64_t>(), 3 * 127);
    EXPECT_GT(j["eval"]["tokens"].get<int64_t>(), 0);
  }
  EXPECT_EQ(evals, 3);

  std::vector<std::string> argv = {Bin()};
  for (auto& a : TrainArgs("killed", {})) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_);
  WaitForLines("killed", 6, p);  // 5 steps + 1 eval: checkpoint at step 4
  kill(-p.pid, SIGKILL);
  Wait(p);
  Result resumed = RunCmd(TrainArgs("killed", {}), dir_, "resumed");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  auto lk = Losses("killed");
  ASSERT_EQ(lk.size(), 8u);
  for (auto& [step, loss] : lref) EXPECT_EQ(lk[step], loss) << "step " << step;
}

// The data cursor survives layout changes. The packed job (sp 2, micro-batch 2 x grad_accum 2:
// 4 sequences a step) is killed after its step-4 checkpoint, then resumed
//   - at sp 1 x dp 2 with grad_accum 1 (the same 4 sequences a step, cut differently): the
//     losses follow the uninterrupted sp 2 run (fp32, 1e-4 rel), which they cannot if a step
//     read other sequences;
//   - at sp 1 x dp 2 with micro-batch 4 (8 sequences a step): the first resumed step reads on
//     from the checkpoint's cursor (sequence 4k after k steps of 4), not from k x 8.
TEST_F(TrainE2eTest, PackedJobResumesOnAnotherLayoutReadingOnFromTheSameSequence) {
  WritePackedJob();
  ASSERT_FALSE(HasFatalFailure());
  Result ref = RunCmd(TrainArgs("ref", {}), dir_, "ref");
  ASSERT_EQ(ref.code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 8u);
  for (auto& [step, cursor] : Cursors("ref")) EXPECT_EQ(cursor, 4 * (step - 1)) << step;

  const std::vector<std::string> dp2 = {"spec.parallelism.sp_degree=1",
                                        "spec.parallelism.dp_degree=2"};
  auto kill_after_checkpoint = [&](const std::string& out) {
    std::vector<std::string> argv = {Bin()};
    // Synchronous saves: the step-5 line then comes after the step-4 commit.
    for (auto& a : TrainArgs(out, {"spec.checkpoint.async=false"})) argv.push_back(a);
    Proc p = Start(argv, out, dir_);
    WaitForLines(out, 6, p);  // 5 steps + the eval at 3: the step-4 checkpoint is committed
    kill(-p.pid, SIGKILL);
    Wait(p);
    return MetricLines(out);
  };
  const size_t before_same = kill_after_checkpoint("same");
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::string> same = dp2;
  same.push_back("spec.optimizer.grad_accum_steps=1");
  Result r = RunCmd(TrainArgs("same", same), dir_, "same-resumed");
  ASSERT_EQ(r.code, 0) << r.err;
  auto resumed = Losses("same", before_same);
  ASSERT_FALSE(resumed.empty());
  EXPECT_GE(resumed.begin()->first, 5);  // resumed from a checkpoint at step >= 4
  EXPECT_EQ(resumed.rbegin()->first, 8);
  for (auto& [step, loss] : resumed) {
    EXPECT_NEAR(loss, lref[step], 1e-4 * lref[step]) << "step " << step;
  }

  const size_t before_grown = kill_after_checkpoint("grown");
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::string> grown = dp2;
  grown.push_back("spec.optimizer.micro_batch_size=4");
  grown.push_back("spec.optimizer.grad_accum_steps=1");
  Result g = RunCmd(TrainArgs("grown", grown), dir_, "grown-resumed");
  ASSERT_EQ(g.code, 0) << g.err;
  auto cursors = Cursors("grown", before_grown);
  ASSERT_FALSE(cursors.empty());
  const int64_t first = cursors.begin()->first;
  EXPECT_GE(first, 5);
  for (auto& [step, cursor] : cursors) {
    EXPECT_EQ(cursor, 4 * (first - 1) + 8 * (step - first)) << "step " << step;
  }
}

// SIGKILL in the middle of a checkpoint save. The checkpoint.before_manifest failpoint
// (common/failpoint.h) holds rank 0 of a 2-rank run inside the save of step 4 after
// every shard is on disk and before manifest.json; the test kills the whole process
// tree as soon as the failpoint's marker file appears (no sleeps), then checks that
// step 2 is still the latest committed checkpoint and loads, that a rerun of the same
// command resumes from it with per-step losses bit-identical to an uninterrupted run,
// and that the rerun re-commits step 4 with the uninterrupted run's tensors.
TEST_F(TrainE2eTest, KillNineMidCheckpointSaveResumesFromPreviousCommit) {
  namespace ck = ulysses::engine;
  const std::vector<std::string> sets = {
      "spec.parallelism.sp_degree=2", "spec.stages[0].steps=6", "spec.checkpoint.every_steps=2",
      "spec.checkpoint.keep_last=3", "spec.checkpoint.async=false"};
  Result ref = RunCmd(TrainArgs("ref", sets), dir_, "ref");
  ASSERT_EQ(ref.code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 6u);

  const fs::path ckpts = dir_ / "killed" / "checkpoints";
  const fs::path half = ckpts / ck::StepDirName(4);
  const fs::path marker = dir_ / "failpoint.hit";
  std::vector<std::string> argv = {Bin()};
  for (auto& a : TrainArgs("killed", sets)) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_,
                 {"ULYSSES_FAILPOINT=checkpoint.before_manifest@4",
                  "ULYSSES_FAILPOINT_MARKER=" + marker.string()});
  const bool hit = WaitForFile(marker, p);
  kill(-p.pid, SIGKILL);  // Launcher and both ranks: they share the process group.
  const int killed_code = Wait(p);
  ASSERT_TRUE(hit);
  EXPECT_EQ(killed_code, 128 + SIGKILL);
  const std::string killed_err = ReadFile(p.err);
  EXPECT_NE(killed_err.find("is ARMED"), std::string::npos) << killed_err;
  EXPECT_NE(killed_err.find("failpoint checkpoint.before_manifest reached at step 4"),
            std::string::npos)
      << killed_err;

  // The kill landed mid-save: both shards of step 4 written, no manifest.
  EXPECT_TRUE(fs::exists(half / "shard-0-of-2.bin"));
  EXPECT_TRUE(fs::exists(half / "shard-1-of-2.bin"));
  EXPECT_FALSE(fs::exists(half / ck::kManifestName));
  EXPECT_FALSE(fs::exists(half / "manifest.json.tmp"));
  const size_t lines_before = MetricLines("killed");
  EXPECT_EQ(lines_before, 4u) << "steps 1-4 were logged before the save of step 4";

  // 1. The previous checkpoint is still the latest committed one, and it is intact.
  absl::StatusOr<std::string> latest = ck::LatestCommittedCheckpoint(ckpts.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(fs::path(*latest).filename().string(), ck::StepDirName(2));
  absl::StatusOr<ck::CheckpointState> prev = ck::LoadCheckpoint(*latest, "");
  ASSERT_TRUE(prev.ok()) << prev.status();
  EXPECT_EQ(prev->global_step, 2);
  EXPECT_FALSE(prev->stage_complete);
  EXPECT_EQ(ck::LoadCheckpoint(half.string(), "").status().code(), absl::StatusCode::kNotFound);
  json ev = EvalJson(RunCmd({"eval", "-f", job_, "--checkpoint", *latest}, dir_, "evalprev"));
  EXPECT_GT(ev["tokens"].get<int64_t>(), 0);

  // 2. The same command (failpoint off) resumes from step 2 and finishes; the losses it
  // logs for steps 3-6 are bit-identical to the uninterrupted run's.
  Result resumed = RunCmd(TrainArgs("killed", sets), dir_, "resumed");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(resumed.err.find("failpoint"), std::string::npos) << resumed.err;
  std::vector<int64_t> steps;
  std::istringstream events(resumed.out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("event", "") == "step")
      steps.push_back(j["step"].get<int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4, 5, 6}));
  auto lk = Losses("killed", lines_before);
  ASSERT_EQ(lk.size(), 4u);
  for (auto& [step, loss] : lk) EXPECT_EQ(loss, lref[step]) << "step " << step;  // bit-identical

  // 3. The half-written step was re-committed; every checkpoint matches the uninterrupted
  // run's tensor for tensor (crc32s in the manifest) and has no leftover files.
  latest = ck::LatestCommittedCheckpoint(ckpts.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(fs::path(*latest).filename().string(), ck::StepDirName(6));
  for (int64_t step : {2, 4, 6}) {
    const fs::path dir = ckpts / ck::StepDirName(step);
    absl::StatusOr<ck::CheckpointState> st = ck::LoadCheckpoint(dir.string(), "");
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->global_step, step);
    json mk = json::parse(ReadFile((dir / ck::kManifestName).string()));
    json mr = json::parse(
        ReadFile((dir_ / "ref" / "checkpoints" / ck::StepDirName(step) / ck::kManifestName)));
    EXPECT_EQ(mk["tensors"], mr["tensors"]) << "step " << step;
    EXPECT_EQ(mk["total_bytes"], mr["total_bytes"]) << "step " << step;
    std::vector<std::string> files;
    for (auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files,
              (std::vector<std::string>{"manifest.json", "shard-0-of-2.bin", "shard-1-of-2.bin"}))
        << dir;
  }
}

// An asynchronous save killed during its background write: rank 0's writer thread is held by
// the checkpoint.before_manifest failpoint at step 4 (both shards on disk, no manifest) while
// training goes on; kill -9 of the whole tree. Step 2 stays the latest committed checkpoint; the
// rerun resumes from it with losses bit-identical to an uninterrupted synchronous run, and every
// checkpoint file it writes (asynchronous saves at 2 and 4... and the final one) is byte-identical
// to the synchronous run's.
TEST_F(TrainE2eTest, KillNineDuringAsyncWriteKeepsPreviousAndAsyncFilesMatchSync) {
  namespace ck = ulysses::engine;
  const std::vector<std::string> sets = {"spec.parallelism.sp_degree=2", "spec.stages[0].steps=6",
                                         "spec.checkpoint.every_steps=2",
                                         "spec.checkpoint.keep_last=3"};
  std::vector<std::string> sync_sets = sets, async_sets = sets;
  sync_sets.push_back("spec.checkpoint.async=false");
  async_sets.push_back("spec.checkpoint.async=true");
  Result ref = RunCmd(TrainArgs("ref", sync_sets), dir_, "ref");
  ASSERT_EQ(ref.code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 6u);

  const fs::path ckpts = dir_ / "killed" / "checkpoints";
  const fs::path marker = dir_ / "failpoint.hit";
  std::vector<std::string> argv = {Bin()};
  for (auto& a : TrainArgs("killed", async_sets)) argv.push_back(a);
  Proc p = Start(argv, "killed", dir_,
                 {"ULYSSES_FAILPOINT=checkpoint.before_manifest@4",
                  "ULYSSES_FAILPOINT_MARKER=" + marker.string()});
  const bool hit = WaitForFile(marker, p);
  kill(-p.pid, SIGKILL);
  EXPECT_EQ(Wait(p), 128 + SIGKILL);
  ASSERT_TRUE(hit);
  const std::string killed_err = ReadFile(p.err);
  EXPECT_NE(killed_err.find("checkpoints are asynchronous (spec.checkpoint.async: true"),
            std::string::npos)
      << killed_err;
  EXPECT_TRUE(fs::exists(ckpts / ck::StepDirName(4) / "shard-1-of-2.bin"));
  EXPECT_FALSE(fs::exists(ckpts / ck::StepDirName(4) / ck::kManifestName));
  const size_t lines_before = MetricLines("killed");
  EXPECT_GE(lines_before, 4u);
  EXPECT_LE(lines_before, 6u);  // the stage-end save waits for the held one
  absl::StatusOr<std::string> latest = ck::LatestCommittedCheckpoint(ckpts.string());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(fs::path(*latest).filename().string(), ck::StepDirName(2));
  ASSERT_TRUE(ck::LoadCheckpoint(*latest, "").ok());

  Result resumed = RunCmd(TrainArgs("killed", async_sets), dir_, "resumed");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  auto lk = Losses("killed", lines_before);
  ASSERT_FALSE(lk.empty());
  EXPECT_EQ(lk.begin()->first, 3);  // resumed from step 2
  for (auto& [step, loss] : lk) EXPECT_EQ(loss, lref[step]) << "step " << step;  // bit-identical
  int async_events = 0;
  std::istringstream events(resumed.out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("event", "") == "checkpoint") {
      EXPECT_TRUE(j.contains("blocked_seconds")) << line;
      ++async_events;
    }
  }
  EXPECT_EQ(async_events, 2) << resumed.out;  // step 4 (asynchronous) and the stage end
  for (int64_t step : {2, 4, 6}) {
    const fs::path dir = ckpts / ck::StepDirName(step);
    const fs::path ref_dir = dir_ / "ref" / "checkpoints" / ck::StepDirName(step);
    for (const char* name : {"manifest.json", "shard-0-of-2.bin", "shard-1-of-2.bin"}) {
      ASSERT_TRUE(fs::exists(dir / name)) << dir / name;
      EXPECT_TRUE(ReadFile((dir / name).string()) == ReadFile((ref_dir / name).string()))
          << "step " << step << " " << name << " differs from the synchronous run's";
    }
  }
}

// A preemption notice shorter than a step (worker/engine/train/preemption.h): every rank's
// training thread is held in step 4 by the train.step failpoint (a step that never ends) while
// the asynchronous save of step 3 is in flight; SIGTERM to `ulysses-train train --stop-grace-s 5`
// (which forwards it with no deadline of its own, so a rank that waited for its step would never
// exit). The ranks leave on their own with exit 75, step 3 (the last finished step) committed and
// reported, and a rerun resumes at step 4 with losses bit-identical to an uninterrupted run.
TEST_F(TrainE2eTest, SigtermShorterThanAStepExits75WithTheLastFinishedStepCommitted) {
  const std::vector<std::string> sets = {"spec.parallelism.sp_degree=2", "spec.stages[0].steps=6",
                                         "spec.checkpoint.every_steps=1",
                                         "spec.checkpoint.async=true"};
  Result ref = RunCmd(TrainArgs("ref", sets), dir_, "ref");
  ASSERT_EQ(ref.code, 0) << ref.err;
  auto lref = Losses("ref");
  ASSERT_EQ(lref.size(), 6u);

  const fs::path marker = dir_ / "failpoint.hit";
  std::vector<std::string> argv = {Bin()};
  for (auto& a : TrainArgs("term", sets)) argv.push_back(a);
  argv.insert(argv.end(), {"--stop-grace-s", "5"});
  Proc p = Start(argv, "term", dir_,
                 {"ULYSSES_FAILPOINT=train.step@4", "ULYSSES_FAILPOINT_MARKER=" + marker.string()});
  ASSERT_TRUE(WaitForFile(marker, p));
  kill(p.pid, SIGTERM);
  const int code = Wait(p);
  const std::string err = ReadFile(p.err), out = ReadFile(p.out);
  ASSERT_EQ(code, 75) << err;
  EXPECT_NE(err.find("end within the grace; exiting 75"), std::string::npos) << err;
  EXPECT_EQ(LatestCommittedStep("term"), 3) << err;
  EXPECT_EQ(MetricLines("term"), 3u);  // step 4 never finished
  // Step 3's save was in flight when the step hung: the leaving rank 0 reported its commit.
  bool reported = false;
  std::istringstream events(out);
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    reported = reported || (!j.is_discarded() && j.value("event", "") == "checkpoint" &&
                            j.value("step", -1) == 3);
  }
  EXPECT_TRUE(reported) << out;

  Result resumed = RunCmd(TrainArgs("term", sets), dir_, "resumed");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  auto lt = Losses("term", 3);
  ASSERT_FALSE(lt.empty());
  EXPECT_EQ(lt.begin()->first, 4) << "the rerun did not resume from step 3";
  for (auto& [step, loss] : lt) EXPECT_EQ(loss, lref[step]) << "step " << step;  // bit-identical
}

// The supervisor's channel to a running rank (`--control stdin`, common/contract/rank_control.h):
// a rank started without a periodic interval gets a line that breaks the protocol (logged,
// ignored) and then "every 3 steps"; it applies it at a step boundary (its log names the step)
// and from there commits every third step, none before.
TEST_F(TrainE2eTest, ARunningRankTakesANewCheckpointIntervalFromItsControlChannel) {
  int in[2];
  ASSERT_EQ(pipe(in), 0);
  const fs::path out = dir_ / "ctl";
  const std::string err_path = (dir_ / "ctl.err").string();
  const std::vector<std::string> argv = {Bin(),       "rank",
                                         "-f",        job_,
                                         "--out",     out.string(),
                                         "--control", "stdin",
                                         "--set",     "spec.checkpoint.every_steps=0",
                                         "--set",     "spec.stages[0].steps=30"};
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Proc p;
  p.err = err_path;
  p.out = (dir_ / "ctl.out").string();
  p.pid = fork();
  if (p.pid == 0) {
    setpgid(0, 0);
    dup2(in[0], 0);
    int o = open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  WaitForLines("ctl", 2, p);
  const std::string lines =
      "{\"control\":\"checkpoint_interval\",\"version\":0,\"every_steps\":1,\"every_seconds\":0,"
      "\"reason\":\"bad\"}\n"
      "{\"control\":\"checkpoint_interval\",\"version\":1,\"every_steps\":3,\"every_seconds\":0,"
      "\"reason\":\"test\"}\n";
  ASSERT_EQ(write(in[1], lines.data(), lines.size()), static_cast<ssize_t>(lines.size()));
  ASSERT_EQ(Wait(p), 0) << ReadFile(p.err);
  close(in[1]);
  const std::string err = ReadFile(p.err);
  EXPECT_NE(err.find("checkpoint_interval.version: 0"), std::string::npos) << err;
  const std::string applied = "checkpoint interval version 1 from step ";
  const size_t at = err.find(applied);
  ASSERT_NE(at, std::string::npos) << err;
  const int from = std::atoi(err.c_str() + at + applied.size());
  ASSERT_GT(from, 2);
  ASSERT_LT(from, 27) << "the stage ended before the interval arrived";
  std::set<int64_t> committed;
  std::istringstream events(ReadFile(p.out));
  for (std::string line; std::getline(events, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("event", "") == "checkpoint")
      committed.insert(j["step"].get<int64_t>());
  }
  std::set<int64_t> want;
  for (int64_t step = from; step < 30; ++step) {
    if (step % 3 == 0) want.insert(step);
  }
  want.insert(30);  // the stage end
  EXPECT_EQ(committed, want) << "applied from step " << from;
}

TEST_F(TrainE2eTest, BadInputIsRejectedWithExit2) {
  struct Case {
    std::vector<std::string> sets;
    std::string needle;
  };
  WriteTokens(dir_ / "short.bin", 50, 3);
  const std::vector<Case> cases = {
      {{"spec.parallelism.sp_degree=3"}, "3"},  // seq/heads not divisible
      {{"spec.parallelism.sp_degree=8", "spec.stages[0].seq_len=256"}, "8"},  // 8 > 4 heads
      {{"spec.data.train=" + (dir_ / "short.bin").string()}, "short.bin"},
      {{"spec.model.dtype=float8"}, "float8"},
  };
  for (const auto& c : cases) {
    Result r = RunCmd(TrainArgs("bad", c.sets), dir_, "bad");
    EXPECT_EQ(r.code, 2) << c.sets[0] << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "checkpoints")) << "a rejected job wrote a checkpoint";
  Result usage = RunCmd({"train", "--bogus", "1"}, dir_, "usage");
  EXPECT_EQ(usage.code, 2);
  Result nproc = RunCmd({"train", "-f", job_, "--nproc", "3"}, dir_, "nproc");
  EXPECT_EQ(nproc.code, 2);
  EXPECT_NE(nproc.err.find("--nproc"), std::string::npos) << nproc.err;
  Result timeout =
      RunCmd({"rank", "-f", job_, "--out", (dir_ / "t").string(), "--collective-timeout-s", "0"},
             dir_, "timeout");
  EXPECT_EQ(timeout.code, 2);
  EXPECT_NE(timeout.err.find("--collective-timeout-s: 0 is outside 1..86400"), std::string::npos)
      << timeout.err;
  for (const std::string& command : {"rank", "train"}) {
    Result threads =
        RunCmd({command, "-f", job_, "--out", (dir_ / "t").string(), "--intra-op-threads", "-1"},
               dir_, "threads");
    EXPECT_EQ(threads.code, 2) << command;
    EXPECT_NE(threads.err.find("--intra-op-threads: -1 is outside 0..1024"), std::string::npos)
        << command << ": " << threads.err;
  }
  // A corrupt checkpoint is refused by eval and export.
  Result ok = RunCmd(TrainArgs("c", {"spec.stages[0].steps=2"}), dir_, "c");
  ASSERT_EQ(ok.code, 0) << ok.err;
  std::string ckpt;
  for (auto& e : fs::directory_iterator(dir_ / "c" / "checkpoints")) ckpt = e.path().string();
  // Eval reads only the model's tensors (not the optimizer state), so the garbage goes inside
  // one of them: the first model tensor the manifest lists, at its recorded byte offset.
  json manifest = json::parse(ReadFile((fs::path(ckpt) / "manifest.json").string()));
  bool corrupted = false;
  for (const json& t : manifest["tensors"]) {
    if (t["name"].get<std::string>().rfind("model/", 0) != 0) continue;
    const fs::path shard =
        fs::path(ckpt) / manifest["shards"][t["shard"].get<size_t>()]["file"].get<std::string>();
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t["offset"].get<int64_t>()));
    f.write("garbage!", 8);
    corrupted = f.good();
    break;
  }
  ASSERT_TRUE(corrupted) << manifest.dump();
  Result ev = RunCmd({"eval", "-f", job_, "--checkpoint", ckpt}, dir_, "corrupt");
  EXPECT_EQ(ev.code, 2) << ev.err;
  EXPECT_FALSE(ev.err.empty());
}

}  // namespace
