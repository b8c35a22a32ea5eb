// Runs a program to completion from a test: argv (no shell, no PATH search), an optional
// environment change and stdin, a timeout; stdout and stderr captured apart. One helper for
// every test that runs a real binary (ulyssesctl, ulysses-train, promtool, python3).
#ifndef ULYSSES_TESTS_TESTING_SUBPROCESS_H_
#define ULYSSES_TESTS_TESTING_SUBPROCESS_H_

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ulysses::testing {

struct RunOptions {
  // "NAME=VALUE" entries set in the child's environment (over this process's value).
  std::vector<std::string> env;
  // Names removed from the child's environment; "PREFIX*" removes every name with PREFIX.
  std::vector<std::string> unset_env;
  // "NAME=VALUE" entries set only where the environment leaves NAME unset (as ranks get
  // process::RankEnvironmentDefaults()).
  std::vector<std::string> env_defaults;
  // The child's stdin; nullopt = /dev/null.
  std::optional<std::string> stdin_data;
  // Past this the child's process group is killed (SIGKILL) and the result says timed out.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // A timeout also records a test failure (ADD_FAILURE); false for a caller that retries.
  bool timeout_fails = true;
};

struct Result {
  int exit_code = -1;  // WEXITSTATUS, 128 + signal when killed; -1 when it never finished
                       // (timed out, or could not be started).
  int signal = 0;      // The signal that ended it; 0 when it exited by itself.
  bool timed_out = false;
  std::string out, err;
  // "exit code 2", "killed by signal 9 (Killed)", "timed out after 30 s", "not started: ...".
  std::string description;
};

// Runs argv[0] (a path) with argv to completion and returns how it ended and what it printed.
Result Run(const std::vector<std::string>& argv, const RunOptions& options = {});

// Runs BinDir()/name with args.
Result RunBinary(const std::string& name, const std::vector<std::string>& args,
                 const RunOptions& options = {});

// Where the programs under test are: $ULYSSES_BIN_DIR (ctest sets it to build/bin), else
// build/bin under the current directory.
std::string BinDir();
// The checkout (configs/, scripts/): $ULYSSES_SOURCE_DIR (ctest sets it), else the current
// directory.
std::string SourceDir();

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_SUBPROCESS_H_
