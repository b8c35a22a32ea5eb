// Small helpers shared by the coordinator tests: job documents (polling with a deadline:
// tests/testing/poll.h; temp dirs: tests/testing/temp_dir.h).
#ifndef ULYSSES_TESTS_COORDINATOR_TEST_UTIL_H_
#define ULYSSES_TESTS_COORDINATOR_TEST_UTIL_H_

#include <string>

#include "tests/testing/poll.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::coordinator::testing {

using ::ulysses::testing::TempDir;

using ::ulysses::testing::PollUntil;  // tests/testing/poll.h

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
