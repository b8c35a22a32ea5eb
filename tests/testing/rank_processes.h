// Rank processes for multi-rank tests: runs N copies of the current test binary as child
// processes ("ranks") that rendezvous on one loopback port (Gloo over 127.0.0.1).
//
// The child role is chosen by environment variables and dispatched from a static initializer
// (ULYSSES_RANK_CHILD_MAIN below) before gtest or any torch thread pool starts, so children are
// fresh processes (exec, not fork of a threaded parent). Used by the parallel tests and
// sp_exactness_test; the one place that spawns, waits for and reaps rank processes in tests.
#ifndef ULYSSES_TESTS_TESTING_RANK_PROCESSES_H_
#define ULYSSES_TESTS_TESTING_RANK_PROCESSES_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace ulysses::testing {

struct ChildEnv {
  std::string scenario;
  int rank = 0;
  int world = 1;
  int port = 0;
};

struct ChildResult {
  int exit_code = -1;  // -1: killed at the deadline or by a signal
  double seconds = 0;  // wall time from spawn to exit
};

// A TCP port that was free a moment ago (bound to port 0 on 127.0.0.1, then closed).
int FreePort();

// Spawns `world` children running `scenario` (ranks 0..world-1, same port) plus `extra_env`
// (NAME=VALUE) and waits for all of them, killing any still running after `deadline`.
std::vector<ChildResult> RunChildren(const std::string& scenario, int world,
                                     std::chrono::seconds deadline,
                                     const std::vector<std::string>& extra_env = {});

// In a child: returns the role read from the environment; in the parent: scenario is empty.
ChildEnv ReadChildEnv();

// Child-side assertion: prints the message with the rank and exits the child with code 1.
[[noreturn]] void ChildFail(const ChildEnv& env, const std::string& message);

}  // namespace ulysses::testing

#define CHILD_CHECK(env, cond, msg)                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::ostringstream child_check_os_;                                       \
      child_check_os_ << __FILE__ << ":" << __LINE__ << ": " #cond ": " << msg; \
      ::ulysses::testing::ChildFail(env, child_check_os_.str());                \
    }                                                                           \
  } while (0)

// Defines a static initializer that, in a child, runs dispatch(env) and exits with its result.
#define ULYSSES_RANK_CHILD_MAIN(dispatch)                                  \
  static const int ulysses_child_main_ = [] {                              \
    ::ulysses::testing::ChildEnv env = ::ulysses::testing::ReadChildEnv(); \
    if (env.scenario.empty()) return 0;                                    \
    int code = dispatch(env);                                              \
    std::fflush(stdout);                                                   \
    std::fflush(stderr);                                                   \
    std::_Exit(code);                                                      \
  }()

#endif  // ULYSSES_TESTS_TESTING_RANK_PROCESSES_H_
