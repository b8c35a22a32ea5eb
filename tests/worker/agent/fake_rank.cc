// Test-only protocol peer of `ulysses-train rank` for the child supervisor's unit
// tests: prints the same JSON event lines and uses the same exit codes, without
// training anything. The end-to-end tests use the real ulysses-train.
//
//   fake_rank [--steps N] [--step-ms MS] [--exit CODE] [--ignore-term] [--noise]
//             [--bad-event] [--pid-file PATH] [--set fake.steps=N|fake.step_ms=N|fake.exit=N]
//             [other rank contract flags, ignored]
//
// Events are written with the contract's own serializer (common/contract/rank_event.h).
// On SIGTERM it finishes the current step, prints a checkpoint event and exits 75
// (unless --ignore-term). --noise prints a non-JSON stdout line and stderr lines;
// --bad-event prints an event line that breaks the protocol (a negative loss) first.
//
// Spec mode (to exercise the e2e harness without the engine): when -f names a valid
// TrainJob, it runs stage --stage for spec.stages[I].steps steps of
// $FAKE_RANK_STEP_MS (default 100) ms, "commits" checkpoints every
// spec.checkpoint.every_steps as a step-number file under spec.checkpoint.dir (rank 0),
// resumes from it, and reports losses that depend only on (stage, step).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <iostream>

#include "common/contract/exit.h"
#include "common/contract/rank_event.h"
#include "common/spec/job_spec_parser.h"

namespace {
namespace contract = ulysses::contract;
volatile sig_atomic_t g_term = 0;
void OnTerm(int) { g_term = 1; }
double Loss(int64_t stage, int64_t step) { return 5.0 / (1.0 + 0.05 * (stage * 100 + step)); }

// Runs one stage from the spec; returns the exit code.
int RunSpecStage(const ulysses::spec::JobSpec& spec, int64_t stage, int64_t rank) {
  const char* ms_env = std::getenv("FAKE_RANK_STEP_MS");
  const int step_ms = ms_env != nullptr ? std::atoi(ms_env) : 100;
  if (stage < 0 || stage >= static_cast<int64_t>(spec.stages.size())) {
    std::fprintf(stderr, "--stage: %lld out of range\n", static_cast<long long>(stage));
    return contract::kExitBadInput;
  }
  const int64_t steps = spec.stages[stage].steps;
  const int64_t every = spec.checkpoint.every_steps;
  const std::string marker = spec.checkpoint.dir.empty()
                                 ? ""
                                 : spec.checkpoint.dir + "/fake-stage" + std::to_string(stage);
  int64_t start = 0;
  if (!marker.empty()) {
    std::ifstream in(marker);
    in >> start;
  }
  auto commit = [&](int64_t step) {
    if (rank == 0 && !marker.empty()) {
      std::ofstream(marker + ".tmp") << step << "\n";
      std::rename((marker + ".tmp").c_str(), marker.c_str());
    }
    contract::WriteRankEvent(
        std::cout,
        contract::CheckpointEvent{stage, step, marker + "@" + std::to_string(step), 42, 0.01});
  };
  for (int64_t step = start + 1; step <= steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    contract::WriteRankEvent(std::cout, contract::StepEvent{stage, step, steps, Loss(stage, step),
                                                            1000.0, spec.stages[stage].seq_len});
    if (g_term) {
      commit(step);
      return contract::kExitPreempted;
    }
    if (every > 0 && step % every == 0 && step < steps) commit(step);
  }
  commit(steps);
  contract::WriteRankEvent(std::cout, contract::EvalEvent{stage, spec.stages[stage].seq_len,
                                                          Loss(stage, steps) + 0.1, 0.5});
  contract::WriteRankEvent(std::cout, contract::DoneEvent{stage, std::nullopt});
  return contract::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 3, step_ms = 10, exit_code = 0;
  bool ignore_term = false, noise = false, bad_event = false;
  std::string pid_file, spec_file;
  int64_t stage = 0, rank = 0;
  std::vector<std::string> spec_sets;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--steps") {
      steps = std::atoi(next());
    } else if (arg == "--step-ms") {
      step_ms = std::atoi(next());
    } else if (arg == "--exit") {
      exit_code = std::atoi(next());
    } else if (arg == "--ignore-term") {
      ignore_term = true;
    } else if (arg == "--noise") {
      noise = true;
    } else if (arg == "--bad-event") {
      bad_event = true;
    } else if (arg == "--pid-file") {
      pid_file = next();
    } else if (arg == "-f") {
      spec_file = next();
    } else if (arg == "--stage") {
      stage = std::atoll(next());
    } else if (arg == "--rank") {
      rank = std::atoll(next());
    } else if (arg == "--set") {  // fake.steps=N, fake.step_ms=N, fake.exit=N (assignments)
      const std::string kv = next();
      const auto eq = kv.find('=');
      const std::string key = kv.substr(0, eq);
      const int value = eq == std::string::npos ? 0 : std::atoi(kv.c_str() + eq + 1);
      if (key == "fake.steps") steps = value;
      if (key == "fake.step_ms") step_ms = value;
      if (key == "fake.exit") exit_code = value;
      if (key.rfind("spec.", 0) == 0) spec_sets.push_back(kv);
    }
  }
  if (!pid_file.empty()) {
    FILE* f = std::fopen(pid_file.c_str(), "w");
    if (f) {
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
    }
  }
  signal(SIGTERM, ignore_term ? SIG_IGN : OnTerm);
  // A FIFO spec is the shutdown-race test's way to hold the agent's launch (worker_agent_test):
  // opening it to read would block this rank for good (the agent's writer is gone, and the
  // SIGTERM handler restarts the open), so it runs as without a spec.
  struct stat spec_stat;
  const bool spec_is_fifo =
      !spec_file.empty() && stat(spec_file.c_str(), &spec_stat) == 0 && S_ISFIFO(spec_stat.st_mode);
  if (!spec_file.empty() && !spec_is_fifo) {
    ulysses::spec::ParseOptions options;
    options.overrides = spec_sets;
    auto spec = ulysses::spec::LoadJobSpecFile(spec_file, options);
    if (spec.ok()) return RunSpecStage(*spec, stage, rank);
  }
  if (noise) {
    std::cout << "plain text on stdout" << std::endl;
    std::fprintf(stderr, "warming up\n");
  }
  if (bad_event) {
    std::cout << R"({"event":"step","stage":0,"step":1,"steps":1,"loss":-1,"tokens_per_s":1,)"
              << R"("seq_len":128})" << std::endl;
  }
  for (int step = 1; step <= steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    // With the per-rank figures of a real rank (fixed values the worker metrics test reads).
    contract::StepEvent event{0, step, steps, 5.0 - 0.1 * step, 1000.0, 128};
    event.step_seconds = 0.05;
    event.data_wait_seconds = 0.01;
    event.forward_seconds = 0.02;
    event.backward_seconds = 0.015;
    event.optimizer_seconds = 0.005;
    event.alltoall_seconds = 0.004;
    event.alltoall_bytes = 1000;
    event.peak_allocated_bytes = 1 << 20;
    event.peak_reserved_bytes = 2 << 20;
    event.memory_limit_bytes = 8 << 20;
    event.rank_tokens_per_s = 500;
    event.model_flops_per_s = 1e12;
    event.grad_norm = 1.5;
    event.lr = 0.001;
    contract::WriteRankEvent(std::cout, event);
    if (g_term) {
      contract::WriteRankEvent(
          std::cout,
          contract::CheckpointEvent{0, step, "/tmp/ckpt/step-" + std::to_string(step), 42, 0.01});
      std::fprintf(stderr, "preempted at step %d\n", step);
      return contract::kExitPreempted;
    }
  }
  if (exit_code == contract::kExitBadInput) {
    std::fprintf(stderr, "spec.stages[0].seq_len: 100 is not divisible by sp_degree 3\n");
    return contract::kExitBadInput;
  }
  if (exit_code != 0) {
    std::fprintf(stderr, "fake failure\n");
    return exit_code;
  }
  contract::WriteRankEvent(std::cout,
                           contract::CheckpointEvent{0, steps, "/tmp/ckpt/final", 42, 0.01});
  contract::WriteRankEvent(std::cout, contract::EvalEvent{0, 128, 4.5, 0.25});
  contract::WriteRankEvent(std::cout, contract::DoneEvent{0, std::nullopt});
  if (noise) std::fprintf(stderr, "finished\n");
  return contract::kExitOk;
}
