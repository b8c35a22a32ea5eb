// common/failpoint: parsing of ULYSSES_FAILPOINT and the hang + marker when one fires.
// The variables are read once per process, so every case runs in a fresh child (death
// tests fork before this process ever reads them).
#include "common/failpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace ulysses {
namespace {

namespace fs = std::filesystem;

// Exit code 0 iff `check` holds with ULYSSES_FAILPOINT=value.
#define EXPECT_WITH_FAILPOINT(value, check) \
  EXPECT_EXIT(                              \
      {                                     \
        setenv(kFailpointEnv, value, 1);    \
        std::exit((check) ? 0 : 1);         \
      },                                    \
      ::testing::ExitedWithCode(0), "")

TEST(FailpointTest, UnsetArmsNothing) {
  EXPECT_EXIT(
      {
        unsetenv(kFailpointEnv);
        HangAtFailpoint("checkpoint.before_manifest", 4);  // Returns at once.
        std::exit(FailpointArmed("checkpoint.before_manifest", 4) ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(FailpointTest, NameAndOptionalStep) {
  EXPECT_WITH_FAILPOINT(
      "a.b@4", FailpointArmed("a.b", 4) && !FailpointArmed("a.b", 2) && !FailpointArmed("a.c", 4));
  EXPECT_WITH_FAILPOINT(
      "a.b", FailpointArmed("a.b", 0) && FailpointArmed("a.b", 7) && !FailpointArmed("a", 7));
  EXPECT_WITH_FAILPOINT("", !FailpointArmed("", 0));
}

TEST(FailpointTest, MalformedArmsNothingAndSaysSo) {
  for (const char* bad : {"a.b@x", "a.b@-1", "a.b@", "@4"}) {
    EXPECT_EXIT(
        {
          setenv(kFailpointEnv, bad, 1);
          std::exit(FailpointArmed("a.b", 4) || FailpointArmed("", 4) ? 1 : 0);
        },
        ::testing::ExitedWithCode(0), "no failpoint armed")
        << bad;
  }
}

TEST(FailpointTest, ArmedWarnsOnFirstUse) {
  EXPECT_EXIT(
      {
        setenv(kFailpointEnv, "a.b@3", 1);
        std::exit(FailpointArmed("x", 0) ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "failpoint a.b at step 3 is ARMED");
}

TEST(FailpointTest, FiringWritesMarkerAndBlocksUntilKilled) {
  const fs::path marker =
      fs::temp_directory_path() / ("ulysses-failpoint-" + std::to_string(getpid()) + ".hit");
  fs::remove(marker);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv(kFailpointEnv, "a.b@3", 1);
    setenv(kFailpointMarkerEnv, marker.c_str(), 1);
    HangAtFailpoint("a.b", 2);  // Not this step: returns.
    HangAtFailpoint("a.b", 3);  // Never returns.
    _exit(0);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = 0;
  bool exited = false;
  while (!fs::exists(marker) && std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(exited) << "the child returned from the failpoint";
  ASSERT_TRUE(fs::exists(marker)) << "no marker";
  kill(pid, SIGKILL);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  std::ifstream f(marker);
  pid_t written = 0;
  f >> written;
  EXPECT_EQ(written, pid);
  fs::remove(marker);
}

}  // namespace
}  // namespace ulysses
