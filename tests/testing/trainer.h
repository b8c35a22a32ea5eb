// The rig shared by the tests that run the real ulysses-train binary (train_e2e, rope_scaling,
// export): the binary, a bounded run of it, and the independent reference
// (scripts/reference_llama.py). Token files: documents.h; per-test directories: temp_dir.h.
#ifndef ULYSSES_TESTS_TESTING_TRAINER_H_
#define ULYSSES_TESTS_TESTING_TRAINER_H_

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/testing/subprocess.h"

namespace ulysses::testing {

// The ulysses-train under test.
inline std::string TrainerBin() { return BinDir() + "/ulysses-train"; }

// Runs ulysses-train with `args` to completion (a test failure past `timeout`). The caller's
// ULYSSES_FAILPOINT* is not passed on: a test arms a failpoint only in the child it means.
inline Result RunTrainer(const std::vector<std::string>& args,
                         std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  return RunBinary("ulysses-train", args,
                   {.unset_env = {"ULYSSES_FAILPOINT*"}, .timeout = timeout});
}

// scripts/reference_llama.py (float64, independent of the engine) on an HF directory and a
// token file: it prints one JSON object with the loss and the tokens counted. The interpreter
// is Debian's, where scripts/bootstrap.sh installs numpy and torch; $ULYSSES_PYTHON overrides
// it (scripts/gpu/run_checks.sh: the GPU machine's venv, which has them).
inline Result RunReferenceLlama(const std::string& hf_dir, const std::string& tokens,
                                int64_t seq_len = 128) {
  const char* python = std::getenv("ULYSSES_PYTHON");
  return Run(
      {python != nullptr ? python : "/usr/bin/python3", SourceDir() + "/scripts/reference_llama.py",
       "--hf", hf_dir, "--tokens", tokens, "--seq-len", std::to_string(seq_len)},
      {.timeout = std::chrono::minutes(5)});
}

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_TRAINER_H_
