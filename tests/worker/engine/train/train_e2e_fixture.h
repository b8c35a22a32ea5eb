// The rig of the ulysses-train end-to-end tests (train_e2e_test.cc, train_e2e_checkpoint_test.cc):
// real rank processes over Gloo on loopback, token files and checkpoints on disk.
#ifndef ULYSSES_TESTS_WORKER_ENGINE_TRAIN_TRAIN_E2E_FIXTURE_H_
#define ULYSSES_TESTS_WORKER_ENGINE_TRAIN_TRAIN_E2E_FIXTURE_H_

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
#include "tests/testing/files.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "worker/engine/checkpoint/checkpoint.h"

extern char** environ;

namespace ulysses::testing::train_e2e {

namespace fs = std::filesystem;
using json = nlohmann::json;

using ::ulysses::testing::ReadFile;

struct Proc {
  pid_t pid = -1;
  std::string out, err;
};

// Starts argv in its own process group, stdout/stderr to files. `env` ("K=V") is added
// to this process's environment for the child only (ahead of it, so it wins getenv);
// ULYSSES_FAILPOINT* is never inherited: only a child given it in `env` gets it.
inline Proc Start(const std::vector<std::string>& argv, const std::string& tag, const fs::path& dir,
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

inline int Wait(const Proc& p, int timeout_s = 150) {
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

using ::ulysses::testing::Result;
using ::ulysses::testing::RunTrainer;
using ::ulysses::testing::TrainerBin;
using ::ulysses::testing::WriteLearnableTokens;

class TrainE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::ulysses::testing::FreshTestDir("ulysses-e2e");
    ASSERT_TRUE(WriteLearnableTokens(dir_ / "train.bin", 40000, 1));
    ASSERT_TRUE(WriteLearnableTokens(dir_ / "val.bin", 1024, 2));
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
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out.substr(0, r.out.find('\n')));
  }

  // Packs the 60 documents of tests/testing/documents.h (vocab 64) with `data pack` into dir_/ds
  // and points job_ at a job on it: sp 2, micro-batch 2 x grad_accum 2, 8 steps of 128 tokens,
  // checkpoints every 2 steps, eval of 3 sequences every 3.
  void WritePackedJob() {
    ASSERT_TRUE(ulysses::testing::WriteMaskedDocumentsJsonl((dir_ / "docs.jsonl").string()));
    const std::string prefix = (dir_ / "ds").string();
    Result pack = RunTrainer({"data", "pack", "--jsonl", (dir_ / "docs.jsonl").string(), "--out",
                              prefix, "--vocab-size", "64"});
    ASSERT_EQ(pack.exit_code, 0) << pack.err;
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

}  // namespace ulysses::testing::train_e2e

#endif  // ULYSSES_TESTS_WORKER_ENGINE_TRAIN_TRAIN_E2E_FIXTURE_H_
