// End-to-end scheduling tests (docs/COORDINATOR.md "Scheduling policy"): the real
// coordinator, workers, ulysses-train and ulyssesctl on loopback (tests/e2e/cluster.h).
// - priority preemption: a high-priority job preempts a running low one, which checkpoints,
//   requeues, resumes and ends with the loss of an unpreempted run;
// - failure budgets: a rank that crashes at the same point every attempt fails the job after
//   max_failures attempts with that error; ranks killed from outside (kill -9) more often
//   than max_failures are infrastructure failures the job survives;
// - the victim is the low job with less work at risk;
// - chaos: busy workers killed -9 at random (each replaced) with the default budgets; the job
//   ends with the loss of an uninterrupted run;
// - placement on multi-slot workers: an SP group inside one worker when it fits, else on
//   one node label, across labels only when necessary (with a warning); same losses.
// Skipped (with the reason) when ulysses-train is not built.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"

namespace ulysses::e2e {
namespace {

using nlohmann::json;

// One stage of the tiny model at 256 tokens: `sp` ranks, `steps` steps, a checkpoint every
// `every` steps. A step takes ~0.2 s on 2 cores (4x less than at 1024 tokens, where these
// tests ran before), so the jobs that must still be running when a test acts on them have
// enough steps left for it.
std::string WriteSpec(const std::string& dir, const std::string& name, int sp, int steps,
                      int every) {
  const std::string path = absl::StrCat(dir, "/", name, ".yaml");
  std::ofstream out(path);
  out << "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata:\n  name: " << name
      << "\nspec:\n  model: {preset: tiny}\n"
      << "  data:\n    synthetic: {generator: needle, validation_sequences: 2}\n"
      << "  memory: {attention_block_size: 128}\n"
      << "  optimizer: {lr: 1.0e-3, warmup_steps: 1}\n"
      << "  stages:\n    - {seq_len: 256, steps: " << steps << ", sp_degree: " << sp << "}\n"
      << "  checkpoint: {every_steps: " << every << ", keep_last: 2}\n  seed: 1234\n";
  return path;
}

// The ulysses-train children of a worker process (ppid == worker pid).
std::vector<pid_t> RankPids(pid_t worker) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
    const size_t close = line.rfind(')');
    const size_t open = line.find('(');
    if (close == std::string::npos || open == std::string::npos) continue;
    const std::string comm = line.substr(open + 1, close - open - 1);
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == worker && comm.rfind("ulysses-train", 0) == 0) out.push_back(std::stoi(name));
  }
  return out;
}

class SchedulingE2ETest : public ClusterTest {
 protected:
  // Waits until `id` runs a new attempt (generation > `after`) that reported step >= 1,
  // then sends `sig` to its rank on worker `worker`; returns that generation (-1: the job
  // ended or timed out first).
  int64_t SignalNextAttempt(const std::string& id, const std::string& worker, int64_t after,
                            int sig) {
    json job = cluster_.WaitForJob(
        id,
        [&](const json& j) {
          return JobTerminal(j) || (JobState(j) == "RUNNING" && j.value("generation", 0) > after &&
                                    j.value("step", 0) >= 1 && !RankPids(Pid(worker)).empty());
        },
        seconds(120));
    if (JobState(job) != "RUNNING") return -1;
    for (pid_t pid : RankPids(Pid(worker))) kill(pid, sig);
    return job.value("generation", int64_t{0});
  }
  pid_t Pid(const std::string& worker) { return cluster_.worker(worker)->pid(); }
};

TEST_F(SchedulingE2ETest, AHighPriorityJobPreemptsTheLowOneWhichResumesWithTheSameLoss) {
  cluster_.StartWorker("w0");
  cluster_.StartWorker("w1");
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(2, seconds(30))) << cluster_.Logs();
  const std::string low_spec = WriteSpec(cluster_.dir(), "low", 2, 30, 2);
  const std::string high_spec = WriteSpec(cluster_.dir(), "high", 2, 2, 2);
  const std::string low = cluster_.Submit(low_spec, {});
  ASSERT_FALSE(low.empty());
  json job = cluster_.WaitForJob(
      low, [](const json& j) { return j.value("step", 0) >= 3 || JobTerminal(j); }, seconds(240));
  ASSERT_EQ(JobState(job), "RUNNING") << job.dump(2);
  const auto submitted = std::chrono::steady_clock::now();
  const std::string high = cluster_.Submit(high_spec, {"spec.scheduling.priority=10"});
  ASSERT_FALSE(high.empty());
  // The high job starts after the low one's preemption checkpoint, not after it ends.
  json high_job = cluster_.WaitForJob(
      high, [](const json& j) { return j.value("step", 0) >= 1 || JobTerminal(j); }, seconds(300));
  // Reported, not asserted (polling adds up to 0.3 s): what an operator would measure.
  std::cout << "high-priority submit -> its first step while a low-priority job held every "
               "worker: "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count()
            << " s\n";
  high_job = cluster_.WaitForJob(high, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(high_job), "SUCCEEDED") << high_job.dump(2);
  job = cluster_.Describe(low);
  EXPECT_FALSE(JobTerminal(job)) << "the low job ended before the high one ran\n" << job.dump(2);
  EXPECT_EQ(job["preemptions"], 1) << job.dump(2);
  bool checkpointing = false;
  for (const json& e : job["events"]) {
    if (e.value("to", "") == "CHECKPOINTING") {
      EXPECT_NE(e.value("reason", "").find("preempted for " + high + " (priority 10 > 0)"),
                std::string::npos)
          << e.dump();
      EXPECT_NE(e.value("reason", "").find("GPU-seconds since the last checkpoint at risk"),
                std::string::npos)
          << e.dump();
      checkpointing = true;
    }
  }
  EXPECT_TRUE(checkpointing) << job["events"].dump(1);
  job = cluster_.WaitForJob(low, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(job), "SUCCEEDED") << job.dump(2);
  EXPECT_EQ(job["preemptions"], 1);
  EXPECT_EQ(job["failures"], 0);
  EXPECT_EQ(job["infra_failures"], 0);
  EXPECT_EQ(job["restarts"], 0);
  // The same job never preempted ends with the same loss.
  const std::string reference = cluster_.Submit(low_spec, {});
  json ref = cluster_.WaitForJob(reference, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(ref), "SUCCEEDED") << ref.dump(2);
  EXPECT_EQ(ref["preemptions"], 0);
  EXPECT_NEAR(JobFinalLoss(job), JobFinalLoss(ref), 1e-5 * std::max(1.0, JobFinalLoss(ref)))
      << "the preempted and the unpreempted run diverged";
  EXPECT_GT(JobFinalLoss(job), 0.0);
}

// Two low jobs hold all four workers; the one that checkpoints often has less work at risk
// than the one that has not checkpointed since it started, so it is the one preempted.
TEST_F(SchedulingE2ETest, ThePreemptionVictimIsTheLowJobWithLessWorkAtRisk) {
  for (const char* w : {"w0", "w1", "w2", "w3"}) cluster_.StartWorker(w);
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(4, seconds(30))) << cluster_.Logs();
  // No checkpoint before its end (every 1000 steps): its whole attempt is at risk.
  const std::string stale = cluster_.Submit(WriteSpec(cluster_.dir(), "stale", 2, 40, 1000), {});
  ASSERT_FALSE(stale.empty());
  json job = cluster_.WaitForJob(
      stale, [](const json& j) { return j.value("step", 0) >= 2 || JobTerminal(j); }, seconds(240));
  ASSERT_EQ(JobState(job), "RUNNING") << job.dump(2);
  // Started later and checkpoints every step: little at risk at any moment.
  const std::string fresh = cluster_.Submit(WriteSpec(cluster_.dir(), "fresh", 2, 40, 1), {});
  ASSERT_FALSE(fresh.empty());
  job = cluster_.WaitForJob(
      fresh,
      [](const json& j) {
        return (j.value("step", 0) >= 2 && !j["last_checkpoint"].is_null()) || JobTerminal(j);
      },
      seconds(240));
  ASSERT_EQ(JobState(job), "RUNNING") << job.dump(2);
  const std::string high =
      cluster_.Submit(WriteSpec(cluster_.dir(), "high", 2, 2, 2), {"spec.scheduling.priority=10"});
  ASSERT_FALSE(high.empty());
  json high_job = cluster_.WaitForJob(high, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(high_job), "SUCCEEDED") << high_job.dump(2);
  job = cluster_.Describe(fresh);
  EXPECT_EQ(job["preemptions"], 1) << job.dump(2);
  json other = cluster_.Describe(stale);
  EXPECT_EQ(other["preemptions"], 0) << "the job with more work at risk was preempted\n"
                                     << other.dump(2);
  EXPECT_EQ(other["restarts"], 0);
  for (const std::string& id : {fresh, stale}) {
    json done = cluster_.WaitForJob(id, JobTerminal, seconds(300));
    EXPECT_EQ(JobState(done), "SUCCEEDED") << done.dump(2);
  }
}

// Chaos with the default budgets: busy workers are killed -9 at random moments (each replaced
// by a new worker, as a node pool would) more often than the old lifetime budget of 3
// allowed; the job finishes with the final loss of an uninterrupted run.
TEST_F(SchedulingE2ETest, AJobSurvivesRandomKillsOfBusyWorkersWithTheUninterruptedLoss) {
  int started = 0;
  for (; started < 3; ++started) cluster_.StartWorker(absl::StrCat("c", started));
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(3, seconds(30))) << cluster_.Logs();
  const std::string spec = WriteSpec(cluster_.dir(), "chaos", 2, 60, 2);
  const std::string id = cluster_.Submit(spec, {});
  ASSERT_FALSE(id.empty());
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  std::mt19937 rng(seed);
  SCOPED_TRACE(absl::StrCat("chaos seed ", seed));
  constexpr int kKills = 4;
  int64_t generation = 0, kill_step = 0;
  for (int kill = 0; kill < kKills; ++kill) {
    // Some steps past the previous kill, in a new attempt: a random moment of real progress.
    const int64_t target = kill_step + std::uniform_int_distribution<int>(2, 4)(rng);
    json job = cluster_.WaitForJob(
        id,
        [&](const json& j) {
          return JobTerminal(j) ||
                 (JobState(j) == "RUNNING" && j.value("generation", int64_t{0}) > generation &&
                  j.value("step", int64_t{0}) >= target);
        },
        seconds(120));
    ASSERT_EQ(JobState(job), "RUNNING") << "kill " << kill << "\n" << job.dump(2);
    generation = job.value("generation", int64_t{0});
    kill_step = job.value("step", int64_t{0});
    const json& placement = job["attempts"].back()["placement"];
    ASSERT_EQ(placement.size(), 2u) << job.dump(2);
    const std::string victim = Cluster::NameFromId(
        placement[std::uniform_int_distribution<int>(0, 1)(rng)]["worker"].get<std::string>());
    cluster_.worker(victim)->Kill9();
    cluster_.StartWorker(absl::StrCat("c", started++));  // The replacement node.
  }
  json job = cluster_.WaitForJob(id, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(job), "SUCCEEDED") << job.dump(2);
  EXPECT_EQ(job["failures"], 0) << job.dump(2);
  EXPECT_GE(job["infra_failures"].get<int>(), kKills) << job.dump(2);
  EXPECT_EQ(job["preemptions"], 0);
  const std::string reference = cluster_.Submit(spec, {});
  json ref = cluster_.WaitForJob(reference, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(ref), "SUCCEEDED") << ref.dump(2);
  EXPECT_EQ(ref["infra_failures"], 0);
  EXPECT_GT(JobFinalLoss(ref), 0.0);
  EXPECT_NEAR(JobFinalLoss(job), JobFinalLoss(ref), 1e-5 * std::max(1.0, JobFinalLoss(ref)))
      << "the killed and the uninterrupted run diverged";
}

TEST_F(SchedulingE2ETest, ACrashLoopFailsFastWhileKilledRanksAreSurvived) {
  cluster_.StartWorker("w0");
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(1, seconds(30))) << cluster_.Logs();
  // Killed from outside 4 times (more than max_failures 3): infrastructure, survived.
  const std::string killed = cluster_.Submit(WriteSpec(cluster_.dir(), "killed", 1, 40, 100), {});
  ASSERT_FALSE(killed.empty());
  int64_t gen = 0;
  for (int i = 0; i < 4; ++i) {
    gen = SignalNextAttempt(killed, "w0", gen, SIGKILL);
    ASSERT_GT(gen, 0) << "kill " << i << "\n" << cluster_.Describe(killed).dump(2);
  }
  json job = cluster_.WaitForJob(killed, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(job), "SUCCEEDED") << job.dump(2);
  EXPECT_EQ(job["infra_failures"], 4) << job.dump(2);
  EXPECT_EQ(job["failures"], 0);

  // A rank that crashes (SIGSEGV) at the same point of every attempt, without a new
  // checkpoint in between: FAILED at the third, with that error as the reason.
  const std::string crashing =
      cluster_.Submit(WriteSpec(cluster_.dir(), "crashing", 1, 200, 100), {});
  ASSERT_FALSE(crashing.empty());
  gen = 0;
  int crashes = 0;
  while (crashes < 5) {
    gen = SignalNextAttempt(crashing, "w0", gen, SIGSEGV);
    if (gen < 0) break;
    ++crashes;
  }
  job = cluster_.WaitForJob(crashing, JobTerminal, seconds(60));
  ASSERT_EQ(JobState(job), "FAILED") << job.dump(2);
  EXPECT_EQ(crashes, 3) << job.dump(2);
  EXPECT_EQ(job["failures"], 3);
  // The repeated error is the reason (a crash signal: an application failure).
  EXPECT_EQ(job.value("reason", "").rfind("crash loop: rank 0 ", 0), 0u) << job.value("reason", "");
  EXPECT_NE(job.value("reason", "").find("signal 11"), std::string::npos)
      << job.value("reason", "");
  EXPECT_NE(job.value("reason", "").find("application failure 3 of max_failures 3"),
            std::string::npos)
      << job.value("reason", "");
}

// Where each rank of a job's newest attempt ran: "worker#slot@node".
std::vector<std::string> Placement(const json& job) {
  std::vector<std::string> out;
  for (const json& p : job["attempts"].back()["placement"]) {
    out.push_back(absl::StrCat(p["worker"].get<std::string>(), "#", p["slot"].get<int>(), "@",
                               p["node"].get<std::string>()));
  }
  return out;
}

TEST_F(SchedulingE2ETest, SpGroupsLandInsideOneWorkerThenOneNodeWithTheSameLosses) {
  // A 4-slot worker (one node of 4 "GPUs"; CPU ranks here) and four 1-slot workers on three
  // node labels.
  cluster_.StartWorker("big", 30, {"--capacity", "4", "--node", "node-a"});
  cluster_.StartWorker("s1", 30, {"--node", "node-b"});
  cluster_.StartWorker("s2", 30, {"--node", "node-b"});
  cluster_.StartWorker("s3", 30, {"--node", "node-c"});
  cluster_.StartWorker("s4", 30, {"--node", "node-d"});
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(5, seconds(30))) << cluster_.Logs();
  const std::string sp4 = WriteSpec(cluster_.dir(), "sp4", 4, 3, 100);
  const std::string sp2 = WriteSpec(cluster_.dir(), "sp2", 2, 3, 100);
  // The 4-rank group fits inside the 4-slot worker; the 2-rank group submitted next finds
  // no worker with 2 free slots and takes node-b's two workers rather than spreading.
  const std::string inside = cluster_.Submit(sp4, {});
  ASSERT_FALSE(inside.empty());
  json job = cluster_.WaitForJob(
      inside,
      [](const json& j) {
        return (j.contains("attempts") && !j["attempts"].empty()) || JobTerminal(j);
      },
      seconds(60));
  const std::string on_node = cluster_.Submit(sp2, {});
  ASSERT_FALSE(on_node.empty());
  job = cluster_.WaitForJob(inside, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(job), "SUCCEEDED") << job.dump(2);
  EXPECT_EQ(Placement(job), (std::vector<std::string>{"w-big#0@node-a", "w-big#1@node-a",
                                                      "w-big#2@node-a", "w-big#3@node-a"}));
  EXPECT_TRUE(job["attempts"].back()["warnings"].empty());
  for (const json& p : job["attempts"].back()["placement"]) EXPECT_EQ(p["device"], "cpu");
  json pair = cluster_.WaitForJob(on_node, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(pair), "SUCCEEDED") << pair.dump(2);
  std::vector<std::string> placed = Placement(pair);
  std::sort(placed.begin(), placed.end());
  EXPECT_EQ(placed, (std::vector<std::string>{"w-s1#0@node-b", "w-s2#0@node-b"}));
  EXPECT_TRUE(pair["attempts"].back()["warnings"].empty());

  // Without the 4-slot worker the same job spreads over the 1-slot workers of three nodes,
  // with a warning, and trains to the same loss: placement never changes the numbers.
  cluster_.worker("big")->Kill9();
  const std::string spread = cluster_.Submit(sp4, {});
  ASSERT_FALSE(spread.empty());
  json other = cluster_.WaitForJob(spread, JobTerminal, seconds(300));
  ASSERT_EQ(JobState(other), "SUCCEEDED") << other.dump(2);
  for (const std::string& p : Placement(other)) EXPECT_EQ(p.rfind("w-s", 0), 0u) << p;
  ASSERT_EQ(other["attempts"].back()["warnings"].size(), 1u) << other.dump(2);
  EXPECT_NE(other["attempts"].back()["warnings"][0].get<std::string>().find(
                "SP group 0 (ranks 0-3) spans nodes"),
            std::string::npos);
  EXPECT_GT(JobFinalLoss(job), 0.0);
  EXPECT_NEAR(JobFinalLoss(other), JobFinalLoss(job), 1e-5 * JobFinalLoss(job))
      << "one worker vs four: the losses differ";
  // describe's text shows each rank's worker, slot, device and node, and the warning.
  Result text = cluster_.Ctl({"describe", "job", spread});
  ASSERT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("Placement (generation "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("Warning: SP group 0 (ranks 0-3) spans nodes"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("; warning: SP group 0 (ranks 0-3) spans nodes"), std::string::npos)
      << "the attempt_started event shows the warning\n"
      << text.out;
}

}  // namespace
}  // namespace ulysses::e2e
