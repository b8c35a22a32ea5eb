#include "worker/agent/child_supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/poll.h"

namespace ulysses::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::ulysses::testing::PollUntil;

// Collects what the supervisor reports, thread-safely.
struct Recorder {
  std::mutex mu;
  std::vector<contract::RankEvent> events;
  std::vector<std::pair<std::string, std::string>> logs;
  std::vector<std::string> bad_events;  // The parser's error messages.
  int exits = 0;

  ChildCallbacks Callbacks() {
    ChildCallbacks cb;
    cb.on_event = [this](const contract::RankEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
    };
    cb.on_log = [this](const std::string& stream, const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      logs.emplace_back(stream, line);
    };
    cb.on_bad_event = [this](const std::string&, const absl::Status& error) {
      std::lock_guard<std::mutex> lock(mu);
      bad_events.emplace_back(error.message());
    };
    cb.on_exit = [this](const ChildResult&) {
      std::lock_guard<std::mutex> lock(mu);
      ++exits;
    };
    return cb;
  }
  int Count(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& e : events) n += contract::RankEventKind(e) == kind;
    return n;
  }
  bool HasLog(const std::string& stream, const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [s, line] : logs) {
      if (s == stream && line.find(text) != std::string::npos) return true;
    }
    return false;
  }
};

std::vector<std::string> Fake(std::vector<std::string> args) {
  args.insert(args.begin(), FAKE_RANK_PATH);
  return args;
}

TEST(ChildSupervisorTest, ForwardsEventsAndLogsAndSucceeds) {
  Recorder rec;
  auto child = ChildSupervisor::Start(Fake({"--steps", "4", "--noise"}), "", rec.Callbacks());
  ASSERT_TRUE(child.ok()) << child.status();
  ChildResult result = (*child)->Wait();
  EXPECT_EQ(result.outcome, contract::RankOutcome::kSucceeded);
  EXPECT_EQ(result.description, "exit code 0");
  EXPECT_EQ(rec.Count("step"), 4);
  EXPECT_EQ(rec.Count("checkpoint"), 1);
  EXPECT_EQ(rec.Count("eval"), 1);
  EXPECT_EQ(rec.Count("done"), 1);
  EXPECT_TRUE(rec.HasLog("stdout", "plain text on stdout"));
  EXPECT_TRUE(rec.HasLog("stderr", "warming up"));
  EXPECT_TRUE(rec.HasLog("stderr", "finished"));
  EXPECT_EQ(rec.exits, 1);
  // Events arrive in output order.
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_GE(rec.events.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(std::holds_alternative<contract::StepEvent>(rec.events[i]));
    EXPECT_EQ(std::get<contract::StepEvent>(rec.events[i]).step, i + 1);
  }
  EXPECT_TRUE(std::holds_alternative<contract::DoneEvent>(rec.events.back()));
}

TEST(ChildSupervisorTest, AMalformedEventLineIsReportedAndKeptAsALog) {
  Recorder rec;
  auto child = ChildSupervisor::Start(Fake({"--steps", "2", "--bad-event"}), "", rec.Callbacks());
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ((*child)->Wait().outcome, contract::RankOutcome::kSucceeded);
  EXPECT_EQ(rec.Count("step"), 2);  // Only the two valid step lines.
  EXPECT_TRUE(rec.HasLog("stdout", R"("loss":-1)"));
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.bad_events.size(), 1u);
  EXPECT_EQ(rec.bad_events[0], "step.loss: -1 is out of range (a finite number >= 0)");
}

TEST(ChildSupervisorTest, MapsBadInputAndFailureExits) {
  Recorder rec;
  auto bad = ChildSupervisor::Start(Fake({"--steps", "0", "--exit", "2"}), "", rec.Callbacks());
  ASSERT_TRUE(bad.ok());
  ChildResult bad_result = (*bad)->Wait();
  EXPECT_EQ(bad_result.outcome, contract::RankOutcome::kBadInput);
  EXPECT_NE(bad_result.stderr_tail.find("not divisible by sp_degree"), std::string::npos);

  auto failed = ChildSupervisor::Start(Fake({"--steps", "1", "--exit", "1"}), "", rec.Callbacks());
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ((*failed)->Wait().outcome, contract::RankOutcome::kFailed);
}

TEST(ChildSupervisorTest, ExecFailureIsAFailureWithReason) {
  Recorder rec;
  auto child = ChildSupervisor::Start({"/nonexistent/ulysses-train", "rank"}, "", rec.Callbacks());
  ASSERT_TRUE(child.ok());
  ChildResult result = (*child)->Wait();
  EXPECT_EQ(result.outcome, contract::RankOutcome::kFailed);
  EXPECT_EQ(result.description, "exit code 127");
  EXPECT_NE(result.stderr_tail.find("exec of the engine binary failed"), std::string::npos);
}

TEST(ChildSupervisorTest, EmptyArgvIsRejected) {
  auto child = ChildSupervisor::Start({}, "", {});
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChildSupervisorTest, PreemptLetsTheChildCheckpointAndExit75) {
  Recorder rec;
  auto child =
      ChildSupervisor::Start(Fake({"--steps", "100000", "--step-ms", "20"}), "", rec.Callbacks());
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(PollUntil([&] { return rec.Count("step") >= 2; }, seconds(10)));
  (*child)->Stop(contract::StopRequest::kPreempt, seconds(20));
  auto result = (*child)->Wait(seconds(10));
  ASSERT_TRUE(result.has_value()) << "child did not exit after SIGTERM";
  EXPECT_EQ(result->outcome, contract::RankOutcome::kPreempted);
  EXPECT_EQ(result->description, "exit code 75");
  EXPECT_FALSE(result->sigkilled_by_agent);
  EXPECT_EQ(rec.Count("checkpoint"), 1);
}

TEST(ChildSupervisorTest, AbortKillsAChildThatIgnoresSigterm) {
  Recorder rec;
  auto child = ChildSupervisor::Start(
      Fake({"--steps", "100000", "--step-ms", "20", "--ignore-term"}), "", rec.Callbacks());
  ASSERT_TRUE(child.ok());
  // Its first step means the child has installed its SIGTERM-ignoring handler.
  ASSERT_TRUE(PollUntil([&] { return rec.Count("step") >= 1; }, seconds(10)));
  // SIGTERM is sent inside Stop(); a grace far longer than the test keeps the SIGKILL
  // tier out of the way while we watch the child go on stepping.
  (*child)->Stop(contract::StopRequest::kAbort, seconds(60));
  const int steps_at_sigterm = rec.Count("step");
  // Two more steps: at least one was printed after the signal (one may have been in
  // flight), so SIGTERM alone did not stop it.
  ASSERT_TRUE(PollUntil([&] { return rec.Count("step") >= steps_at_sigterm + 2; }, seconds(10)))
      << "the child stopped stepping after SIGTERM";
  EXPECT_TRUE((*child)->Running());
  // The grace runs out (a later Stop can only shorten it): the SIGKILL tier fires.
  (*child)->Stop(contract::StopRequest::kAbort, milliseconds(0));
  auto result = (*child)->Wait(seconds(10));
  ASSERT_TRUE(result.has_value()) << "SIGKILL tier did not fire";
  EXPECT_EQ(result->outcome, contract::RankOutcome::kAborted);
  EXPECT_TRUE(result->sigkilled_by_agent);
  EXPECT_TRUE(WIFSIGNALED(result->wait_status));
  EXPECT_EQ(WTERMSIG(result->wait_status), SIGKILL);
}

TEST(ChildSupervisorTest, PreemptGraceRunOutStillCountsAsPreemption) {
  Recorder rec;
  auto child = ChildSupervisor::Start(
      Fake({"--steps", "100000", "--step-ms", "20", "--ignore-term"}), "", rec.Callbacks());
  ASSERT_TRUE(child.ok());
  // Its first step means the child has installed its SIGTERM-ignoring handler.
  ASSERT_TRUE(PollUntil([&] { return rec.Count("step") >= 1; }, seconds(10)));
  (*child)->Stop(contract::StopRequest::kPreempt, seconds(30));
  (*child)->Stop(contract::StopRequest::kPreempt,
                 milliseconds(200));  // A later, shorter grace wins.
  auto result = (*child)->Wait(seconds(10));
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->outcome, contract::RankOutcome::kPreempted);
  EXPECT_TRUE(result->sigkilled_by_agent);
}

TEST(ChildSupervisorTest, DestructorKillsARunningChild) {
  Recorder rec;
  pid_t pid = 0;
  {
    auto child = ChildSupervisor::Start(
        Fake({"--steps", "100000", "--step-ms", "20", "--ignore-term"}), "", rec.Callbacks());
    ASSERT_TRUE(child.ok());
    pid = (*child)->pid();
    ASSERT_GT(pid, 0);
  }
  EXPECT_EQ(rec.exits, 1);
  EXPECT_NE(kill(pid, 0), 0);  // Reaped: the pid no longer exists.
}

// The child must not outlive an agent killed with SIGKILL (PR_SET_PDEATHSIG).
TEST(ChildSupervisorTest, ChildDiesWithItsAgent) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // Orphans come to us to be reaped.
  char dir_template[] = "/tmp/ulysses-agent-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string pid_file = std::string(dir_template) + "/child.pid";
  const pid_t agent = fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    auto child = ChildSupervisor::Start(
        Fake({"--steps", "100000", "--step-ms", "20", "--ignore-term", "--pid-file", pid_file}), "",
        {});
    if (!child.ok()) _exit(3);
    while (true) pause();  // Killed by the test.
  }
  pid_t grandchild = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::ifstream in(pid_file);
        return static_cast<bool>(in >> grandchild) && grandchild > 0;
      },
      seconds(10)));
  ASSERT_EQ(kill(agent, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(agent, &status, 0), agent);
  // The orphaned grandchild is reparented to us; it must die promptly.
  bool reaped =
      PollUntil([&] { return waitpid(grandchild, &status, WNOHANG) == grandchild; }, seconds(10));
  if (!reaped) kill(grandchild, SIGKILL);
  EXPECT_TRUE(reaped) << "engine child outlived its killed agent";
  if (reaped) {
    EXPECT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
  }
  std::remove(pid_file.c_str());
  rmdir(dir_template);
}

TEST(ChildSupervisorTest, BuildsTheRankArgvOfTheContract) {
  RankLaunch launch;
  launch.engine_bin = "/bin/ulysses-train";
  launch.spec_path = "/w/job.yaml";
  launch.out_dir = "/w/out";
  launch.stage = 2;
  launch.rank = 1;
  launch.world_size = 4;
  launch.master_addr = "10.0.0.5";
  launch.master_port = 29500;
  launch.device = "cuda:1";
  launch.overrides = {"spec.stages[0].steps=3"};
  const std::vector<std::string> expected = {"/bin/ulysses-train",
                                             "rank",
                                             "-f",
                                             "/w/job.yaml",
                                             "--out",
                                             "/w/out",
                                             "--stage",
                                             "2",
                                             "--rank",
                                             "1",
                                             "--world-size",
                                             "4",
                                             "--master-addr",
                                             "10.0.0.5",
                                             "--master-port",
                                             "29500",
                                             "--device",
                                             "cuda:1",
                                             "--step-events",
                                             "all",
                                             "--set",
                                             "spec.stages[0].steps=3"};
  EXPECT_EQ(BuildRankArgv(launch), expected);
  // A collective timeout is passed before the overrides.
  launch.collective_timeout_s = 600;
  std::vector<std::string> with_timeout = expected;
  with_timeout.insert(with_timeout.end() - 2, {"--collective-timeout-s", "600"});
  EXPECT_EQ(BuildRankArgv(launch), with_timeout);
  // A known peak FLOP/s is passed exactly (the ranks' step events then carry mfu).
  launch.peak_flops = 989.5e12;
  std::vector<std::string> with_peak = with_timeout;
  with_peak.insert(with_peak.end() - 2, {"--peak-flops", "989500000000000"});
  EXPECT_EQ(BuildRankArgv(launch), with_peak);
  // The rank's share of the cores (the agent's usable cores / slots) as its libtorch threads.
  launch.intra_op_threads = 4;
  std::vector<std::string> with_threads = with_peak;
  with_threads.insert(with_threads.end() - 2, {"--intra-op-threads", "4"});
  EXPECT_EQ(BuildRankArgv(launch), with_threads);
  // The agent's --grace-period-s: the rank leaves within it even mid-step.
  launch.stop_grace_s = 2.5;
  std::vector<std::string> with_grace = with_threads;
  with_grace.insert(with_grace.end() - 2, {"--stop-grace-s", "2.500"});
  EXPECT_EQ(BuildRankArgv(launch), with_grace);
  // The job's identity (checkpoint manifests) and attempt (rendezvous keys).
  launch.job_id = "job-000007";
  launch.tenant = "research";
  launch.generation = 3;
  std::vector<std::string> with_identity = with_grace;
  with_identity.insert(with_identity.begin() + 20,
                       {"--job-id", "job-000007", "--tenant", "research", "--generation", "3"});
  EXPECT_EQ(BuildRankArgv(launch), with_identity);
}

}  // namespace
}  // namespace ulysses::agent
