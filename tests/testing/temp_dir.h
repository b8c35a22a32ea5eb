// TempDir: a fresh directory for one test, removed (with everything in it) when the
// object goes out of scope. Not thread-safe to construct concurrently with a
// chdir(); otherwise a plain value owner (not copyable).
// FreshTestDir: a directory named after the running test, for a fixture that keeps it when the
// test failed (to read what the programs wrote) and removes it otherwise.
#ifndef ULYSSES_TESTS_TESTING_TEMP_DIR_H_
#define ULYSSES_TESTS_TESTING_TEMP_DIR_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "common/file_tree.h"

namespace ulysses::testing {

class TempDir {
 public:
  // $TMPDIR/<prefix>-XXXXXX (mkdtemp). Aborts when no directory can be made: no test
  // can go on without one.
  explicit TempDir(const std::string& prefix = "ulysses-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror(("TempDir: mkdtemp " + tmpl).c_str());
      std::abort();
    }
    path_ = tmpl;
  }
  // Best effort: a test may have made something unremovable (the status is dropped).
  ~TempDir() { RemoveTree(path_).IgnoreError(); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name (not created).
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// $TMPDIR/<prefix>-<pid>-<test name>, emptied and created.
inline std::filesystem::path FreshTestDir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + "-" + std::to_string(getpid()) + "-" +
       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  RemoveTree(dir).IgnoreError();
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_TEMP_DIR_H_
