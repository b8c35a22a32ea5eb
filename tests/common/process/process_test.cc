#include "common/process/process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/process/cpu_share.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tests/testing/poll.h"
#include "tests/testing/subprocess.h"

namespace ulysses::process {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A pipe whose read end the test keeps; the write end goes to the child.
struct Pipe {
  int read = -1;
  int write = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    read = fds[0];
    write = fds[1];
  }
  ~Pipe() {
    if (read >= 0) close(read);
    CloseWrite();
  }
  void CloseWrite() {
    if (write >= 0) close(write);
    write = -1;
  }
  // Reads one line (blocking), without its newline.
  std::string Line() {
    std::string line;
    char c = 0;
    while (::read(read, &c, 1) == 1 && c != '\n') line.push_back(c);
    return line;
  }
  // Reads until EOF.
  std::string All() {
    std::string text;
    char buf[256];
    for (ssize_t n; (n = ::read(read, buf, sizeof(buf))) > 0;) text.append(buf, n);
    return text;
  }
};

pid_t MustSpawn(const std::vector<std::string>& argv, const SpawnOptions& options = {}) {
  absl::StatusOr<pid_t> pid = Spawn(argv, options);
  EXPECT_TRUE(pid.ok()) << pid.status();
  return pid.ok() ? *pid : -1;
}

// Waits for `pid` to end; a child still running after 10 s fails the test and is
// SIGKILLed, so a broken stop never hangs the suite.
int Reap(pid_t pid) {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "pid " << pid << " still runs 10 s after it should have ended";
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return status;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  return status;
}

TEST(ProcessTest, ReadsAnExitCode) {
  const int status = Reap(MustSpawn({"/bin/sh", "-c", "exit 3"}));
  const contract::ProcessExit exit = ProcessExitOf(status);
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_EQ(DescribeWaitStatus(status), "exit code 3");
}

TEST(ProcessTest, ReadsAKillingSignalAs128PlusSignal) {
  const int status = Reap(MustSpawn({"/bin/sh", "-c", "kill -9 $$"}));
  const contract::ProcessExit exit = ProcessExitOf(status);
  EXPECT_EQ(exit.exit_code, 128 + SIGKILL);
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_NE(DescribeWaitStatus(status).find("killed by signal 9"), std::string::npos);
}

TEST(ProcessTest, ExecFailureExits127WithTheReasonOnStderr) {
  Pipe err;
  SpawnOptions options;
  options.stderr_fd = err.write;
  options.exec_error_prefix = "test: exec of the binary failed";
  const pid_t pid = MustSpawn({"/nonexistent/binary"}, options);
  err.CloseWrite();
  EXPECT_EQ(err.All(), "test: exec of the binary failed: No such file or directory\n");
  EXPECT_EQ(ProcessExitOf(Reap(pid)).exit_code, 127);
}

TEST(ProcessTest, EmptyArgvIsRejected) {
  EXPECT_EQ(Spawn({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProcessTest, RunsInTheWorkDirWithRedirectedStdoutAndOwnGroup) {
  Pipe out;
  SpawnOptions options;
  options.work_dir = "/tmp";
  options.stdout_fd = out.write;
  options.own_process_group = true;
  options.stdin_from_dev_null = true;
  // Prints its cwd, whether it leads its own process group, and what stdin gives.
  const pid_t pid =
      MustSpawn({"/bin/sh", "-c",
                 "pwd; [ \"$(ps -o pgid= -p $$ | tr -d ' ')\" = \"$$\" ] && echo leader; "
                 "cat; echo end"},
                options);
  out.CloseWrite();
  EXPECT_EQ(out.All(), "/tmp\nleader\nend\n");
  EXPECT_EQ(ProcessExitOf(Reap(pid)).exit_code, 0);
}

// env_defaults fill in what this process leaves unset and never override what it sets; the
// rest of the environment is inherited.
TEST(ProcessTest, EnvDefaultsApplyOnlyToUnsetVariables) {
  ASSERT_EQ(setenv("ULYSSES_TEST_SET", "parent", 1), 0);
  ASSERT_EQ(unsetenv("ULYSSES_TEST_UNSET"), 0);
  Pipe out;
  SpawnOptions options;
  options.stdout_fd = out.write;
  options.env_defaults = {"ULYSSES_TEST_SET=default", "ULYSSES_TEST_UNSET=default"};
  const pid_t pid = MustSpawn(
      {"/bin/sh", "-c", "echo \"$ULYSSES_TEST_SET $ULYSSES_TEST_UNSET ${PATH:+path}\""}, options);
  out.CloseWrite();
  EXPECT_EQ(out.All(), "parent default path\n");
  EXPECT_EQ(ProcessExitOf(Reap(pid)).exit_code, 0);
  EXPECT_EQ(std::getenv("ULYSSES_TEST_UNSET"), nullptr);  // This process's own is untouched.

  options.env_defaults = {"=x"};
  EXPECT_EQ(Spawn({"/bin/true"}, options).status().code(), absl::StatusCode::kInvalidArgument);
}

// options.env replaces the inherited environment; env_defaults then fill in what it leaves
// unset and never override what it sets.
TEST(ProcessTest, AGivenEnvironmentReplacesThisProcesssOne) {
  ASSERT_EQ(setenv("ULYSSES_TEST_SET", "parent", 1), 0);
  Pipe out;
  SpawnOptions options;
  options.stdout_fd = out.write;
  options.env = std::vector<std::string>{"ULYSSES_TEST_GIVEN=given", "ULYSSES_TEST_BOTH=given"};
  options.env_defaults = {"ULYSSES_TEST_BOTH=default", "ULYSSES_TEST_UNSET=default"};
  const pid_t pid = MustSpawn({"/bin/sh", "-c",
                               "echo \"$ULYSSES_TEST_GIVEN $ULYSSES_TEST_BOTH $ULYSSES_TEST_UNSET "
                               "${ULYSSES_TEST_SET:-none}\""},
                              options);
  out.CloseWrite();
  EXPECT_EQ(out.All(), "given given default none\n");
  EXPECT_EQ(ProcessExitOf(Reap(pid)).exit_code, 0);
}

// Every rank sleeps at OpenMP barriers unless its operator chose otherwise.
TEST(ProcessTest, RanksStartWithPassiveOpenMpWaits) {
  const std::vector<std::string> defaults = RankEnvironmentDefaults();
  EXPECT_NE(std::find(defaults.begin(), defaults.end(), "OMP_WAIT_POLICY=PASSIVE"), defaults.end());
}

TEST(KillTiersTest, SigtermFirstAndSigkillOnlyAfterTheGrace) {
  Pipe out;
  SpawnOptions options;
  options.stdout_fd = out.write;
  // Ignores SIGTERM, then says so.
  const pid_t pid = MustSpawn(
      {"/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"}, options);
  out.CloseWrite();
  ASSERT_EQ(out.Line(), "ready");
  KillTiers tiers(pid);
  const auto t0 = KillTiers::Clock::now();
  EXPECT_TRUE(tiers.Stop(milliseconds(500), t0));
  EXPECT_TRUE(tiers.term_sent());
  EXPECT_FALSE(tiers.Enforce(t0 + milliseconds(499)));  // Inside the grace: no SIGKILL.
  EXPECT_FALSE(tiers.kill_sent());
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), 0) << "SIGTERM alone stopped a child that ignores it";
  EXPECT_TRUE(tiers.Enforce(t0 + milliseconds(500)));
  EXPECT_FALSE(tiers.Enforce(t0 + milliseconds(600)));  // Sent once.
  status = Reap(pid);
  EXPECT_EQ(ProcessExitOf(status).signal, SIGKILL);
}

TEST(KillTiersTest, AChildThatHonoursSigtermEndsByIt) {
  const pid_t pid = MustSpawn({"/bin/sleep", "1000"});
  KillTiers tiers(pid);
  EXPECT_TRUE(tiers.Stop(seconds(30)));
  const int status = Reap(pid);
  EXPECT_EQ(ProcessExitOf(status).signal, SIGTERM);
  EXPECT_FALSE(tiers.kill_sent());
}

TEST(KillTiersTest, ALaterStopOnlyBringsTheDeadlineCloser) {
  const pid_t pid = MustSpawn({"/bin/sleep", "1000"});
  KillTiers tiers(pid);
  const auto t0 = KillTiers::Clock::now();
  EXPECT_TRUE(tiers.Stop(std::nullopt, t0));  // SIGTERM only (a forwarded preemption).
  EXPECT_FALSE(tiers.deadline().has_value());
  EXPECT_FALSE(tiers.Enforce(t0 + seconds(3600)));
  EXPECT_FALSE(tiers.Stop(seconds(10), t0));  // SIGTERM is not sent twice.
  EXPECT_EQ(tiers.deadline(), t0 + seconds(10));
  tiers.Stop(seconds(1), t0);
  EXPECT_EQ(tiers.deadline(), t0 + seconds(1));
  tiers.Stop(seconds(5), t0);
  tiers.Stop(std::nullopt, t0);
  EXPECT_EQ(tiers.deadline(), t0 + seconds(1));
  Reap(pid);
}

TEST(KillTiersTest, AGroupTargetReachesGrandchildren) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // Orphans come to us to be reaped.
  Pipe out;
  SpawnOptions options;
  options.stdout_fd = out.write;
  options.own_process_group = true;
  const pid_t pid = MustSpawn(
      {"/bin/sh", "-c", "trap '' TERM; sleep 1000 & echo $!; while :; do sleep 0.05; done"},
      options);
  out.CloseWrite();
  const pid_t grandchild = std::atoi(out.Line().c_str());
  ASSERT_GT(grandchild, 0);
  KillTiers tiers(-pid);
  tiers.Stop(milliseconds(0));
  EXPECT_TRUE(tiers.Enforce());
  EXPECT_EQ(ProcessExitOf(Reap(pid)).signal, SIGKILL);
  // The grandchild got the group's SIGTERM and is reaped by us (its parent is gone) or
  // was already reaped by the shell before it died.
  if (kill(grandchild, 0) == 0) {  // Alive or a zombie: ours to reap now.
    EXPECT_TRUE(WIFSIGNALED(Reap(grandchild))) << "grandchild outlived its group's kill";
  }
}

TEST(CpuShareTest, EachLocalRankGetsItsWholeShareOfTheCores) {
  EXPECT_EQ(IntraOpThreadShare(16, 4), 4);
  EXPECT_EQ(IntraOpThreadShare(16, 3), 5);  // Rounded down: never more threads than cores.
  EXPECT_EQ(IntraOpThreadShare(2, 4), 1);   // More ranks than cores: one each.
  EXPECT_EQ(IntraOpThreadShare(8, 0), 8);   // No ranks counts as one.
  EXPECT_EQ(IntraOpThreadShare(0, 1), 1);
}

TEST(CpuShareTest, UsableCoresFollowsTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(UsableCores(), CPU_COUNT(&saved));
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // This thread only (taskset -c).
  const int narrowed = UsableCores();
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(narrowed, 1);
}

// The test kit's Run (tests/testing/subprocess.h), built on Spawn: stdout and stderr apart,
// stdin, the environment changed as asked, how the child ended.
TEST(TestingRunTest, CapturesOutputStdinEnvironmentAndExit) {
  ASSERT_EQ(setenv("ULYSSES_TEST_DROP_A", "a", 1), 0);
  ASSERT_EQ(setenv("ULYSSES_TEST_DROPPED", "b", 1), 0);
  ASSERT_EQ(setenv("ULYSSES_TEST_KEPT", "kept", 1), 0);
  ASSERT_EQ(setenv("ULYSSES_TEST_OVER", "parent", 1), 0);
  testing::RunOptions options;
  options.env = {"ULYSSES_TEST_OVER=child"};
  options.unset_env = {"ULYSSES_TEST_DROP*", "ULYSSES_TEST_NOT_SET"};
  options.stdin_data = std::string(200000, 'x') + "\nend";  // More than a pipe holds.
  const testing::Result r = testing::Run(
      {"/bin/sh", "-c",
       "echo \"${ULYSSES_TEST_DROP_A:-none} ${ULYSSES_TEST_DROPPED:-none} $ULYSSES_TEST_KEPT "
       "$ULYSSES_TEST_OVER\"; tail -c 3 >&2; exit 3"},
      options);
  EXPECT_EQ(r.out, "none none kept child\n");
  EXPECT_EQ(r.err, "end");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.signal, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.description, "exit code 3");
  EXPECT_STREQ(std::getenv("ULYSSES_TEST_OVER"), "parent");  // This process's is untouched.

  const testing::Result killed = testing::Run({"/bin/sh", "-c", "kill -9 $$"});
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL);
  EXPECT_EQ(killed.signal, SIGKILL);
  EXPECT_EQ(testing::Run({"/nonexistent/program"}).exit_code, 127);
}

// A run past its timeout is killed with what it started and reported (a test failure unless
// the caller said it retries).
TEST(TestingRunTest, ATimeoutKillsTheProcessGroup) {
  testing::RunOptions options;
  options.timeout = milliseconds(300);
  options.timeout_fails = false;
  const testing::Result r =
      testing::Run({"/bin/sh", "-c", "echo started; sleep 60 & sleep 60; wait"}, options);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.out, "started\n");
  EXPECT_EQ(r.description, "timed out after 0 s");
  options.timeout_fails = true;
  EXPECT_NONFATAL_FAILURE(testing::Run({"/bin/sleep", "60"}, options), "timed out");
}

TEST(TestingPollTest, PollUntilReturnsWhenThePredicateHoldsOrTheTimeIsUp) {
  int calls = 0;
  EXPECT_TRUE(testing::PollUntil([&] { return ++calls == 3; }, seconds(10)));
  EXPECT_EQ(calls, 3);
  EXPECT_FALSE(testing::PollUntil([] { return false; }, milliseconds(30)));
}

}  // namespace
}  // namespace ulysses::process
