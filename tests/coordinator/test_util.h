// Small helpers shared by the coordinator tests: polling with a deadline and job
// documents (temp dirs: tests/testing/temp_dir.h).
#ifndef ULYSSES_TESTS_COORDINATOR_TEST_UTIL_H_
#define ULYSSES_TESTS_COORDINATOR_TEST_UTIL_H_

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "tests/testing/temp_dir.h"

namespace ulysses::coordinator::testing {

using ::ulysses::testing::TempDir;

// Polls `pred` every 10 ms until it holds or `timeout` passes. Returns the last result.
inline bool PollUntil(const std::function<bool()>& pred,
                      std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// A valid TrainJob document with the given stages ("{seq_len: 64, steps: 4, sp_degree: 2}").
inline std::string JobYaml(const std::string& name, const std::string& stages,
                           const std::string& scheduling = "") {
  std::string y = "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata:\n  name: " + name +
                  "\nspec:\n  model: {preset: tiny}\n  data:\n    synthetic: {generator: random}\n"
                  "  stages:\n" +
                  stages;
  if (!scheduling.empty()) y += "  scheduling: " + scheduling + "\n";
  return y;
}

}  // namespace ulysses::coordinator::testing

#endif  // ULYSSES_TESTS_COORDINATOR_TEST_UTIL_H_
