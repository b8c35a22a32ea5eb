// Runs the real ulysses-coordinator binary (TLS, worker client certificates, token
// file): SIGKILL it mid-job, restart it on the same state dir, and check that nothing
// was lost and that reconnecting workers keep their generation; also the flag contract
// (bad config -> exit 2, flags override the config file) and SIGTERM shutdown.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/coordinator/auth_channel.h"
#include "tests/coordinator/coordinator_process.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/test_util.h"
#include "tests/testing/subprocess.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::coordinator {
namespace {

using testing::CoordinatorBinary;
using testing::CoordinatorProcess;
using testing::FakeWorker;
using testing::JobYaml;
using testing::MakeTestChannel;
using testing::PollUntil;
using testing::SecureArgs;
using testing::TempDir;
using testing::TestTokens;
using testing::WithToken;
using testing::WithWorkerCert;

// The test token file, outside the state dir.
std::string TokensFile(const TempDir& dir) {
  const std::string path = dir.Sub("tokens.yaml");
  testing::WriteTestTokenFile(path);
  return path;
}

v1::Job GetJob(v1::JobService::Stub* stub, const std::string& id) {
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::GetJobResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(5));
  grpc::Status s = stub->GetJob(&ctx, req, &resp);
  return resp.job();
}

// Each worker presents its own client certificate (and re-registers with it after the
// restart); the user side holds the admin token.
TEST(CoordinatorProcessTest, SigkillAndRestartKeepsJobsCountersAndGeneration) {
  TempDir dir;
  const std::string tokens = TokensFile(dir);
  std::string id;
  v1::WorkRef w1ref, w2ref;  // What each worker runs in the last generation.
  std::string checkpoint_dir;
  {
    CoordinatorProcess coord(SecureArgs(dir.path(), tokens));
    ASSERT_TRUE(coord.ReadPorts());
    auto channel = MakeTestChannel(coord.port(), WithToken(TestTokens::kAdmin));
    auto stub = v1::JobService::NewStub(channel);
    FakeWorker w1(MakeTestChannel(coord.port(), WithWorkerCert("w1")), "w1", "", "10.0.0.1");
    FakeWorker w2(MakeTestChannel(coord.port(), WithWorkerCert("w2")), "w2", "", "10.0.0.2");
    for (FakeWorker* w : {&w1, &w2}) {
      ASSERT_TRUE(w->Register().ok());
      w->Connect();
      w->StartHeartbeats(std::chrono::milliseconds(200));
    }
    v1::SubmitJobRequest req;
    req.set_spec_yaml(JobYaml("durable", "    - {seq_len: 256, steps: 8, sp_degree: 2}\n"));
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    ASSERT_TRUE(stub->SubmitJob(&ctx, req, &resp).ok());
    id = resp.job_id();
    // Generation 1 is preempted (exit 75), generation 2 runs with a checkpoint.
    for (int gen = 1; gen <= 2; ++gen) {
      auto a1 = w1.WaitAssignment();
      auto a2 = w2.WaitAssignment();
      ASSERT_TRUE(a1 && a2);
      ASSERT_EQ(a1->ref().generation(), gen);
      w1ref = a1->ref();
      w2ref = a2->ref();
      checkpoint_dir = a1->checkpoint_dir();
      w1.Started(a1->ref());
      w2.Started(a2->ref());
      ASSERT_TRUE(
          PollUntil([&] { return GetJob(stub.get(), id).state() == v1::JOB_STATE_RUNNING; }));
      if (gen == 1) {
        w1.Exited(a1->ref(), 75);
        w2.Exited(a2->ref(), 75);
      }
    }
    FakeWorker& rank0 = w1ref.rank() == 0 ? w1 : w2;
    uint64_t seq =
        rank0.Checkpoint(w1ref.rank() == 0 ? w1ref : w2ref, 4, checkpoint_dir + "/step-00000004");
    auto ack = rank0.WaitAck(seq);
    ASSERT_TRUE(ack);
    ASSERT_EQ(ack->result(), v1::ACK_CODE_OK) << ack->message();
    v1::Job before = GetJob(stub.get(), id);
    ASSERT_EQ(before.preemptions(), 1);
    ASSERT_EQ(before.generation(), 2);
    ASSERT_EQ(before.last_checkpoint().step(), 4);
    coord.Signal(SIGKILL);
    coord.Wait();
    w1.Disconnect();
    w2.Disconnect();
  }
  // Restart on the same state dir.
  CoordinatorProcess coord(SecureArgs(dir.path(), tokens));
  ASSERT_TRUE(coord.ReadPorts());
  auto channel = MakeTestChannel(coord.port(), WithToken(TestTokens::kAdmin));
  auto stub = v1::JobService::NewStub(channel);
  v1::Job after = GetJob(stub.get(), id);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(after.preemptions(), 1);
  EXPECT_EQ(after.generation(), 2);
  EXPECT_EQ(after.last_checkpoint().step(), 4);
  EXPECT_EQ(after.last_checkpoint().path(), checkpoint_dir + "/step-00000004");
  ASSERT_EQ(after.attempts_size(), 2);
  EXPECT_EQ(after.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_PREEMPTED);
  // The workers reconnect and report what they still run: same generation, RUNNING.
  FakeWorker w1(MakeTestChannel(coord.port(), WithWorkerCert("w1")), "w1", "", "10.0.0.1");
  FakeWorker w2(MakeTestChannel(coord.port(), WithWorkerCert("w2")), "w2", "", "10.0.0.2");
  const v1::WorkRef mine1 = w1ref, mine2 = w2ref;
  bool keep1 = false, keep2 = false;
  ASSERT_TRUE(w1.Register(mine1, &keep1).ok());
  ASSERT_TRUE(w2.Register(mine2, &keep2).ok());
  EXPECT_TRUE(keep1);
  EXPECT_TRUE(keep2);
  w1.SetRunning(mine1);
  w2.SetRunning(mine2);
  w1.Connect();
  w2.Connect();
  w1.StartHeartbeats(std::chrono::milliseconds(200));
  w2.StartHeartbeats(std::chrono::milliseconds(200));
  ASSERT_TRUE(PollUntil([&] { return GetJob(stub.get(), id).state() == v1::JOB_STATE_RUNNING; }));
  EXPECT_EQ(GetJob(stub.get(), id).generation(), 2);
  // Reports of the continuing generation are accepted.
  uint64_t seq = w1.Progress(mine1, 5, 1.5);
  EXPECT_FALSE(w1.WaitAck(seq, std::chrono::milliseconds(300)));  // No rejection.
  // SIGTERM: graceful exit 0.
  coord.Signal(SIGTERM);
  int status = coord.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(CoordinatorProcessTest, RestartWithoutWorkersRestartsFromCheckpointWithNewGeneration) {
  TempDir dir;
  const std::string tokens = TokensFile(dir);
  std::string id;
  {
    CoordinatorProcess coord(SecureArgs(dir.path(), tokens));
    ASSERT_TRUE(coord.ReadPorts());
    auto channel = MakeTestChannel(coord.port(), WithToken(TestTokens::kAdmin));
    auto stub = v1::JobService::NewStub(channel);
    FakeWorker w1(MakeTestChannel(coord.port(), WithWorkerCert("w1")), "w1");
    ASSERT_TRUE(w1.Register().ok());
    w1.Connect();
    v1::SubmitJobRequest req;
    req.set_spec_yaml(JobYaml("orphan", "    - {seq_len: 256, steps: 8}\n"));
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    ASSERT_TRUE(stub->SubmitJob(&ctx, req, &resp).ok());
    id = resp.job_id();
    auto a = w1.WaitAssignment();
    ASSERT_TRUE(a);
    w1.Started(a->ref());
    ASSERT_TRUE(PollUntil([&] { return GetJob(stub.get(), id).state() == v1::JOB_STATE_RUNNING; }));
    coord.Signal(SIGKILL);
    coord.Wait();
  }
  CoordinatorProcess coord(SecureArgs(dir.path(), tokens));
  ASSERT_TRUE(coord.ReadPorts());
  auto channel = MakeTestChannel(coord.port(), WithToken(TestTokens::kAdmin));
  auto stub = v1::JobService::NewStub(channel);
  // A fresh worker (the old one never comes back) picks the job up after the
  // reconnect window (2 x heartbeat timeout = 6 s) with generation 2.
  FakeWorker w2(MakeTestChannel(coord.port(), WithWorkerCert("w2")), "w2");
  ASSERT_TRUE(w2.Register().ok());
  w2.Connect();
  w2.StartHeartbeats(std::chrono::milliseconds(200));
  auto a = w2.WaitAssignment(std::chrono::seconds(20));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ref().generation(), 2);
  v1::Job job = GetJob(stub.get(), id);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_ABORTED);
  EXPECT_EQ(job.failures(), 0);
  EXPECT_EQ(job.restarts(), 1);
}

TEST(CoordinatorProcessTest, BadConfigExits2WithTheField) {
  TempDir dir;
  std::string cfg = dir.path() + "/c.yaml";
  FILE* f = fopen(cfg.c_str(), "w");
  fputs("heartbeat_timeout_s: 5000\n", f);
  fclose(f);
  const ::ulysses::testing::Result r =
      ::ulysses::testing::Run({CoordinatorBinary(), "--state-dir", dir.path(), "--config", cfg});
  EXPECT_EQ(r.exit_code, 2) << r.description;
  EXPECT_NE(r.err.find("heartbeat_timeout_s: 5000 is out of range"), std::string::npos) << r.err;
}

// Flags CLI11 rejects are bad input too: exit 2 (not CLI11's own 100+ codes).
TEST(CoordinatorProcessTest, BadFlagsExit2) {
  TempDir dir;
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--no-such-flag"},
        std::vector<std::string>{"--heartbeat-timeout-s", "ten"}}) {
    SCOPED_TRACE(flags.front());
    std::vector<std::string> argv = {CoordinatorBinary(), "--state-dir", dir.path()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const ::ulysses::testing::Result r = ::ulysses::testing::Run(argv);
    EXPECT_EQ(r.exit_code, 2) << r.description;
    EXPECT_FALSE(r.err.empty()) << "no message on stderr";
  }
}

// Worker name -> state, from ListWorkers (one page: the tests register a few).
std::map<std::string, v1::WorkerState> WorkerStates(v1::JobService::Stub* stub) {
  v1::ListWorkersResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(5));
  std::map<std::string, v1::WorkerState> out;
  if (!stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok()) return out;
  for (const v1::Worker& w : resp.workers()) out[w.name()] = w.state();
  return out;
}

// After a restart the workers the store knows are not declared LOST within
// reconnect_window_s (10 s here), although they stay silent longer than lost_after_s (3 s):
// one that reconnects in the window is IDLE again; one that never does is LOST once the
// window has passed.
TEST(CoordinatorProcessTest, NoWorkerIsLostWithinTheReconnectWindowAfterARestart) {
  TempDir dir;
  const std::string tokens = TokensFile(dir);
  std::vector<std::string> args = SecureArgs(dir.path(), tokens);
  args.insert(args.end(), {"--reconnect-window-s", "10"});
  {
    CoordinatorProcess coord(args);
    ASSERT_TRUE(coord.ReadPorts());
    FakeWorker w1(MakeTestChannel(coord.port(), WithWorkerCert("w1")), "w1");
    FakeWorker w2(MakeTestChannel(coord.port(), WithWorkerCert("w2")), "w2");
    for (FakeWorker* w : {&w1, &w2}) {
      ASSERT_TRUE(w->Register().ok());
      w->Connect();
    }
    coord.Signal(SIGKILL);
    coord.Wait();
    w1.Disconnect();
    w2.Disconnect();
  }
  CoordinatorProcess coord(args);
  ASSERT_TRUE(coord.ReadPorts());
  const auto serving = std::chrono::steady_clock::now();
  auto stub = v1::JobService::NewStub(MakeTestChannel(coord.port(), WithToken(TestTokens::kAdmin)));
  // 5 s: past lost_after_s and the SUSPECT timeout (3 s) plus ticks, inside the window.
  int polls = 0;
  while (std::chrono::steady_clock::now() - serving < std::chrono::seconds(5)) {
    const std::map<std::string, v1::WorkerState> states = WorkerStates(stub.get());
    ASSERT_EQ(states.size(), 2u) << "ListWorkers failed or lost a worker";
    for (const auto& [name, state] : states) {
      ASSERT_NE(state, v1::WORKER_STATE_LOST) << name << " LOST inside the reconnect window";
    }
    ++polls;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(polls, 10);
  FakeWorker w1(MakeTestChannel(coord.port(), WithWorkerCert("w1")), "w1");
  ASSERT_TRUE(w1.Register().ok());
  w1.Connect();
  w1.StartHeartbeats(std::chrono::milliseconds(200));
  EXPECT_TRUE(PollUntil([&] { return WorkerStates(stub.get())["w1"] == v1::WORKER_STATE_IDLE; }));
  // w2 never comes back: LOST once the window has passed.
  EXPECT_TRUE(PollUntil([&] { return WorkerStates(stub.get())["w2"] == v1::WORKER_STATE_LOST; },
                        std::chrono::seconds(20)));
  EXPECT_EQ(WorkerStates(stub.get())["w1"], v1::WORKER_STATE_IDLE);
}

// The config file says heartbeat_timeout_s 5000 (out of range: alone it exits 2, see
// above) and a state dir that cannot be created; the flags say 3 s and a good dir.
// The daemon starts only if both flags won over the file.
TEST(CoordinatorProcessTest, FlagsOverrideTheConfigFile) {
  TempDir dir;
  const std::string cfg = dir.path() + "/c.yaml";
  std::ofstream(cfg) << "heartbeat_timeout_s: 5000\nstate_dir: /proc/no-such-dir/state\n";
  CoordinatorProcess coord({"--config", cfg, "--listen", "127.0.0.1:0", "--metrics-listen",
                            "127.0.0.1:0", "--heartbeat-timeout-s", "3", "--state-dir",
                            dir.path() + "/state"});
  ASSERT_TRUE(coord.ReadPorts()) << "the coordinator did not start: a config-file value won";
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/state"));
  coord.Signal(SIGTERM);
  const int status = coord.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ulysses::coordinator
