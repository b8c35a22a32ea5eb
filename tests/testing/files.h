// ReadFile: a whole file's bytes, for tests that check what a program wrote; IsExecutable: whether
// a program (promtool, a built binary) is there to run.
#ifndef ULYSSES_TESTS_TESTING_FILES_H_
#define ULYSSES_TESTS_TESTING_FILES_H_

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ulysses::testing {

// The file's bytes, or "" when it cannot be opened (the test's assertions on the content then
// fail and say what was expected).
inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Whether `path` exists and this process may execute it.
inline bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_FILES_H_
