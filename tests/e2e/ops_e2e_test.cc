// Day-2 operations end to end (docs/OPERATIONS.md): real coordinator, workers,
// ulysses-train and ulyssesctl on loopback: network cuts vs lost workers, backup and
// restore, durable logs.
//
// Network blips vs lost workers: the "cut" is SIGSTOP of a worker agent while its rank
// (a child in its own process group) keeps training; SIGCONT ends it. Nothing reaches the
// coordinator from that worker meanwhile, exactly as in a pod-network partition, and the
// agent finds its session stale when it wakes and reconnects. A 20 s cut stays inside the
// default lost_after_s (45 s): the job is not restarted. A long cut is one past
// lost_after_s: to keep the suite short the test lowers lost_after_s to 10 s instead of
// cutting for 2 minutes (the rule is the same: silence > lost_after_s), and the job is
// restarted exactly once.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster.h"

namespace ulysses::e2e {
namespace {

using nlohmann::json;

// One stage of `steps` at 512 tokens over SP 2 (two workers), checkpoints every 5 steps.
std::string WriteBlipSpec(const std::string& dir, int steps) {
  const std::string path = dir + "/blip.yaml";
  std::ofstream(path) << "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata:\n  name: blip\n"
                         "spec:\n  model: {preset: tiny}\n"
                         "  data:\n    synthetic: {generator: needle, validation_sequences: 2}\n"
                         "  optimizer: {lr: 1.0e-3, warmup_steps: 1}\n"
                         "  stages:\n    - {seq_len: 512, steps: "
                      << steps
                      << ", sp_degree: 2, warmup_steps: 1}\n"
                         "  checkpoint: {every_steps: 5, keep_last: 2}\n  seed: 7\n";
  return path;
}

int64_t Step(const json& job) { return job.is_object() ? job.value("step", int64_t{0}) : -1; }

class OpsE2ETest : public ClusterTest {
 protected:
  OpsE2ETest() : ClusterTest(/*start_coordinator=*/false) {}

  // The state of worker `name` in `ulyssesctl get workers -o json` ("" if absent).
  std::string WorkerState(const std::string& name) {
    Result r = cluster_.Ctl({"get", "workers", "-o", "json"});
    json list = json::parse(r.out, nullptr, false);
    if (r.exit_code != 0 || !list.is_array()) return "";
    for (const json& w : list) {
      if (w.value("name", "") == name) return w.value("state", "");
    }
    return "";
  }
  bool WaitWorkerState(const std::string& name, const std::string& state, milliseconds timeout) {
    return ::ulysses::testing::PollUntil([&] { return WorkerState(name) == state; }, timeout,
                                         milliseconds(200));
  }
  std::string JobLogs(const std::string& id) { return cluster_.Ctl({"logs", id}).out; }
};

TEST_F(OpsE2ETest, ATwentySecondCutOfAWorkerLeavesItsJobRunningWithoutARestart) {
  cluster_.StartCoordinator(/*heartbeat_timeout_s=*/4, /*lost_after_s=*/-1);  // Default 45 s.
  ASSERT_NE(cluster_.address(), "127.0.0.1:0") << cluster_.Logs();
  cluster_.StartWorker("w0");
  cluster_.StartWorker("w1");
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(2, seconds(30))) << cluster_.Logs();
  const std::string id = cluster_.Submit(WriteBlipSpec(cluster_.dir(), 120), {});
  ASSERT_FALSE(id.empty());
  json job = cluster_.WaitForJob(
      id, [](const json& j) { return Step(j) >= 2 || JobTerminal(j); }, seconds(180));
  ASSERT_EQ(JobState(job), "RUNNING") << job.dump(2);
  // Cut the worker of rank 1: rank 0's worker keeps reporting the job's steps.
  const std::string victim = Cluster::NameFromId(job["attempts"].back()["worker_ids"][1]);
  const pid_t agent = cluster_.worker(victim)->pid();
  const auto cut_start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(agent, SIGSTOP), 0);
  const bool suspect = WaitWorkerState(victim, "SUSPECT", seconds(15));
  const int64_t step_when_suspect = Step(cluster_.Describe(id));
  std::this_thread::sleep_until(cut_start + seconds(20));  // The cut's length, not a wait.
  const json during = cluster_.Describe(id);
  ASSERT_EQ(kill(agent, SIGCONT), 0);
  EXPECT_TRUE(suspect) << "the silent worker never showed SUSPECT";
  EXPECT_EQ(during.value("restarts", -1), 0) << during.dump(2);
  EXPECT_EQ(JobState(during), "RUNNING") << during.dump(2);
  if (!JobTerminal(during)) {
    // The ranks kept training through the cut (rank 0's reports came through w0).
    EXPECT_GT(Step(during), step_when_suspect) << "the job made no progress during the cut";
  }
  EXPECT_TRUE(WaitWorkerState(victim, "BUSY", seconds(30)) || JobTerminal(cluster_.Describe(id)))
      << "the worker did not come back";
  job = cluster_.WaitForJob(id, JobTerminal, seconds(600));
  ASSERT_EQ(JobState(job), "SUCCEEDED") << job.dump(2);
  EXPECT_EQ(job["restarts"], 0);
  EXPECT_EQ(job["generation"], 1);
  EXPECT_EQ(job["attempts"].size(), 1u) << job["attempts"].dump(2);
  const std::string logs = JobLogs(id);
  EXPECT_NE(logs.find("worker " + victim + " SUSPECT"), std::string::npos) << logs;
  EXPECT_NE(logs.find("worker " + victim + " answered again after"), std::string::npos) << logs;
}

TEST_F(OpsE2ETest, ACutLongerThanLostAfterRestartsTheJobOnce) {
  // lost_after_s lowered from 45 to 10 s so the "long" cut is ~10 s instead of 2 minutes.
  cluster_.StartCoordinator(/*heartbeat_timeout_s=*/4, /*lost_after_s=*/10);
  ASSERT_NE(cluster_.address(), "127.0.0.1:0") << cluster_.Logs();
  for (const char* name : {"w0", "w1", "w2"}) cluster_.StartWorker(name);
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(3, seconds(30))) << cluster_.Logs();
  const std::string id = cluster_.Submit(WriteBlipSpec(cluster_.dir(), 40), {});
  ASSERT_FALSE(id.empty());
  json job = cluster_.WaitForJob(
      id, [](const json& j) { return Step(j) >= 2 || JobTerminal(j); }, seconds(180));
  ASSERT_EQ(JobState(job), "RUNNING") << job.dump(2);
  const std::string victim = Cluster::NameFromId(job["attempts"].back()["worker_ids"][1]);
  const pid_t agent = cluster_.worker(victim)->pid();
  ASSERT_EQ(kill(agent, SIGSTOP), 0);
  // The cut lasts until the coordinator gave the worker up (lost_after_s) and restarted the
  // job on the spare worker.
  job = cluster_.WaitForJob(
      id, [](const json& j) { return j.value("restarts", 0) >= 1 || JobTerminal(j); },
      seconds(120));
  const std::string state_in_cut = WorkerState(victim);
  ASSERT_EQ(kill(agent, SIGCONT), 0);
  EXPECT_EQ(job.value("restarts", 0), 1) << job.dump(2);
  EXPECT_EQ(state_in_cut, "LOST");
  ASSERT_GE(job["attempts"].size(), 1u);
  EXPECT_EQ(job["attempts"][0].value("outcome", ""), "LOST") << job["attempts"].dump(2);
  EXPECT_NE(job["attempts"][0].value("reason", "").find("lost_after_s 10"), std::string::npos)
      << job["attempts"].dump(2);
  // The woken worker's rank is of an old generation: aborted, not counted again.
  job = cluster_.WaitForJob(id, JobTerminal, seconds(600));
  ASSERT_EQ(JobState(job), "SUCCEEDED") << job.dump(2);
  EXPECT_EQ(job["restarts"], 1);
  EXPECT_EQ(job["generation"], 2);
}

// The first progress step reported after the event whose reason contains `marker` (-1: none).
int64_t FirstStepAfter(const json& job, const std::string& marker) {
  if (!job.is_object() || !job.contains("events")) return -1;
  bool after = false;
  for (const json& e : job["events"]) {
    const std::string type = e.value("type", "");
    if (type == "state_change" && e.value("reason", "").find(marker) != std::string::npos) {
      after = true;
    } else if (after && type == "progress") {
      return e.value("step", int64_t{-1});
    }
  }
  return -1;
}

// Backup and restore (docs/OPERATIONS.md): `ulysses-coordinator backup` and `ulyssesctl admin
// backup` while the job runs, kill -9 of the coordinator, `restore` into a new state dir, a
// coordinator on it: the job continues from its last checkpoint (or its running ranks) and
// succeeds. A corrupt copy of the backup is refused with the reason and installs nothing; restoring
// over a store needs --force.
TEST_F(OpsE2ETest, ABackupTakenDuringAJobRestoresAfterAKill9AndTheJobContinues) {
  const std::vector<std::string> ckpt_root = {"--checkpoint-root", cluster_.dir() + "/ckpt"};
  cluster_.StartCoordinator(4, 0, ckpt_root);
  ASSERT_NE(cluster_.address(), "127.0.0.1:0") << cluster_.Logs();
  cluster_.StartWorker("w0");
  cluster_.StartWorker("w1");
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(2, seconds(30))) << cluster_.Logs();
  const std::string id = cluster_.Submit(WriteBlipSpec(cluster_.dir(), 30), {});
  ASSERT_FALSE(id.empty());
  json job = cluster_.WaitForJob(
      id,
      [](const json& j) {
        return (!j["last_checkpoint"].is_null() && j["last_checkpoint"].value("step", 0) >= 5) ||
               JobTerminal(j);
      },
      seconds(240));
  ASSERT_EQ(JobState(job), "RUNNING") << job.dump(2);
  const std::string backup = cluster_.dir() + "/backup.db";
  const std::string coordinator = BinDir() + "/ulysses-coordinator";
  Result b = RunCommand(
      {coordinator, "backup", "--state-dir", cluster_.state_dir(), "--to", backup}, seconds(60));
  ASSERT_EQ(b.exit_code, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("1 jobs"), std::string::npos) << b.out;
  // The same through the admin RPC (what a CronJob without the state volume uses); this is
  // the copy restored below.
  const std::string rpc_backup = cluster_.dir() + "/backup-rpc.db";
  Result viactl = cluster_.Ctl({"admin", "backup", "--to", rpc_backup}, seconds(60));
  ASSERT_EQ(viactl.exit_code, 0) << viactl.out << viactl.err;
  EXPECT_NE(viactl.out.find("1 jobs"), std::string::npos) << viactl.out;
  // The backup's view of the job: what a restore starts from.
  const json at_backup = cluster_.Describe(id);
  const int64_t ckpt_at_backup = at_backup["last_checkpoint"].is_null()
                                     ? 0
                                     : at_backup["last_checkpoint"].value("step", int64_t{0});
  ASSERT_GE(ckpt_at_backup, 5);
  cluster_.KillCoordinator();

  // A corrupt copy is refused with the reason; nothing is installed.
  std::string bytes;
  {
    std::ifstream in(backup, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 3u * 4096);
  for (size_t i = 4096; i < 2 * 4096; ++i) bytes[i] = static_cast<char>(i * 13);
  const std::string corrupt = cluster_.dir() + "/corrupt.db";
  std::ofstream(corrupt, std::ios::binary) << bytes;
  const std::string refused_dir = cluster_.dir() + "/refused";
  Result bad = RunCommand({coordinator, "restore", "--from", corrupt, "--state-dir", refused_dir},
                          seconds(60));
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("is not a usable backup: integrity_check failed"), std::string::npos)
      << bad.err;
  EXPECT_FALSE(std::ifstream(refused_dir + "/coordinator.db").good());

  const std::string restored = cluster_.dir() + "/state-restored";
  Result r = RunCommand({coordinator, "restore", "--from", rpc_backup, "--state-dir", restored},
                        seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  Result again = RunCommand({coordinator, "restore", "--from", rpc_backup, "--state-dir", restored},
                            seconds(60));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.err.find("already holds a store"), std::string::npos) << again.err;

  cluster_.set_state_dir(restored);
  cluster_.StartCoordinator(4, 0, ckpt_root);  // Same port: the workers reconnect to it.
  ASSERT_NE(cluster_.address(), "127.0.0.1:0") << cluster_.Logs();
  job = cluster_.WaitForJob(id, JobTerminal, seconds(600));
  ASSERT_EQ(JobState(job), "SUCCEEDED") << job.dump(2);
  EXPECT_LE(job.value("restarts", 99), 1) << job.dump(2);
  // Training went on from the backup's checkpoint or later, not from the start: a step reported
  // after the restart is past it. The ranks keep training while the coordinator is away and may
  // finish the stage before it is back; the next generation then finds the stage complete and
  // reports no step (a restart from the start would report step 1).
  const int64_t first = FirstStepAfter(job, "coordinator restarted");
  if (first != -1) {
    EXPECT_GT(first, ckpt_at_backup) << job["events"].dump(1);
  }
  EXPECT_EQ(Step(job), 30);
}

// The goodput a finished job reports (docs/COORDINATOR.md "Goodput"): real ranks' steps and
// checkpoint events (with the engine's blocked_seconds) through a real agent. Nothing failed,
// was preempted or cancelled; the buckets add up to what was allocated.
void ExpectCleanGoodput(const json& job) {
  ASSERT_TRUE(job.contains("goodput")) << job.dump(2);
  const json& g = job["goodput"];
  const json& lost = g["lost_gpu_seconds"];
  EXPECT_GT(g.value("productive_gpu_seconds", 0.0), 0) << g.dump();
  EXPECT_GT(lost.value("checkpoint_stall", 0.0), 0) << "the saves' blocked_seconds: " << g.dump();
  EXPECT_GT(lost.value("restart", 0.0), 0) << "launch to the first step: " << g.dump();
  for (const char* cause : {"failure", "preemption", "cancelled"}) {
    EXPECT_EQ(lost.value(cause, -1.0), 0) << cause << ": " << g.dump();
  }
  EXPECT_EQ(g.value("uncommitted_gpu_seconds", -1.0), 0) << g.dump();
  double parts = g.value("productive_gpu_seconds", 0.0);
  for (const auto& [cause, seconds] : lost.items()) parts += seconds.get<double>();
  const double allocated = g.value("allocated_gpu_seconds", 0.0);
  EXPECT_NEAR(parts, allocated, 1e-6) << g.dump();
  EXPECT_NEAR(g.value("ratio", -1.0), g.value("productive_gpu_seconds", 0.0) / allocated, 1e-9);
}

// Durable logs (docs/OPERATIONS.md "Logs"): every job's lines (rank stdout/stderr, agent and
// coordinator lines) are in <state_dir>/logs/<job>/log.jsonl and `ulyssesctl logs` shows the
// same lines after a kill -9 and restart of the coordinator as before it. The jobs' goodput
// (ExpectCleanGoodput) is the same after it too.
TEST_F(OpsE2ETest, ACoordinatorRestartKeepsEveryJobsLogLines) {
  cluster_.StartCoordinator(4, 0);
  ASSERT_NE(cluster_.address(), "127.0.0.1:0") << cluster_.Logs();
  cluster_.StartWorker("w0");
  cluster_.StartWorker("w1");
  ASSERT_TRUE(cluster_.WaitForIdleWorkers(2, seconds(30))) << cluster_.Logs();
  const std::string spec = WriteBlipSpec(cluster_.dir(), 6);
  const std::vector<std::string> ids = {cluster_.Submit(spec, {}),
                                        cluster_.Submit(spec, {"spec.stages[0].sp_degree=1"})};
  std::vector<std::string> before;
  std::vector<json> goodput;
  for (const std::string& id : ids) {
    ASSERT_FALSE(id.empty());
    json job = cluster_.WaitForJob(id, JobTerminal, seconds(300));
    ASSERT_EQ(JobState(job), "SUCCEEDED") << job.dump(2);
  }
  for (const std::string& id : ids) {
    Result logs = cluster_.Ctl({"logs", id, "--tail", "-1"});
    ASSERT_EQ(logs.exit_code, 0) << logs.err;
    before.push_back(logs.out);
    // Rank output and the coordinator's state changes, more than a handful of lines.
    EXPECT_GT(std::count(logs.out.begin(), logs.out.end(), '\n'), 5) << logs.out;
    EXPECT_NE(logs.out.find("SUCCEEDED"), std::string::npos) << logs.out;
    EXPECT_TRUE(std::ifstream(cluster_.state_dir() + "/logs/" + id + "/log.jsonl").good());
    goodput.push_back(cluster_.Describe(id)["goodput"]);
    ExpectCleanGoodput(cluster_.Describe(id));
  }
  cluster_.KillCoordinator();
  cluster_.StartCoordinator(4, 0);
  ASSERT_NE(cluster_.address(), "127.0.0.1:0") << cluster_.Logs();
  for (size_t i = 0; i < ids.size(); ++i) {
    Result logs = cluster_.Ctl({"logs", ids[i], "--tail", "-1"});
    ASSERT_EQ(logs.exit_code, 0) << logs.err;
    EXPECT_EQ(logs.out, before[i]) << "the log lines of " << ids[i] << " changed across a restart";
    // The goodput record is durable too.
    const json after = cluster_.Describe(ids[i])["goodput"];
    for (const char* key : {"allocated_gpu_seconds", "productive_gpu_seconds", "ratio"}) {
      EXPECT_NEAR(after.value(key, -1.0), goodput[i].value(key, -2.0), 1e-9) << key;
    }
    EXPECT_NEAR(after["lost_gpu_seconds"].value("checkpoint_stall", -1.0),
                goodput[i]["lost_gpu_seconds"].value("checkpoint_stall", -2.0), 1e-9);
  }
}

}  // namespace
}  // namespace ulysses::e2e
