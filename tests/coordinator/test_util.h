// Small helpers shared by the coordinator tests: temp dirs and polling with a deadline.
#ifndef ULYSSES_TESTS_COORDINATOR_TEST_UTIL_H_
#define ULYSSES_TESTS_COORDINATOR_TEST_UTIL_H_

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

namespace ulysses::coordinator::testing {

// A fresh directory under $TMPDIR, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ulysses-coord-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

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
