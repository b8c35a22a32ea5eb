// Runs the real ulysses-worker binary against a test-side WorkerService peer (the
// coordinator is built in parallel; tests/e2e covers the real one) with fake_rank as
// the engine: registration, assignment -> child -> acked reports, abort, SIGTERM
// preemption, and reconnect to a restarted coordinator with the child still running.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "ulysses/v1/worker_service.grpc.pb.h"
#include "worker/agent/child_supervisor.h"

namespace ulysses::agent {
namespace {

namespace v1 = ::ulysses::v1;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A minimal coordinator side of the worker session protocol.
class PeerCoordinator final : public v1::WorkerService::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    registers_.push_back(*request);
    response->set_worker_id("w-" + request->name());
    response->set_heartbeat_interval_ms(100);
    response->set_heartbeat_timeout_ms(2000);
    response->set_keep_running(keep_running_);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Session(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    v1::WorkerMessage msg;
    if (!stream->Read(&msg) || !msg.has_hello()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "first message must be hello");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = stream;
      ++sessions_;
      cv_.notify_all();
    }
    while (stream->Read(&msg)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (msg.has_checkpoint() || msg.has_exited() ||
          (msg.has_heartbeat() && msg.heartbeat().request_ack())) {
        v1::CoordinatorMessage ack;
        ack.mutable_ack()->set_seq(msg.seq());
        ack.mutable_ack()->set_result(v1::ACK_CODE_OK);
        std::lock_guard<std::mutex> wlock(write_mu_);
        stream->Write(ack);
      }
      if (!msg.has_heartbeat()) messages_.push_back(msg);
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = nullptr;
    return grpc::Status::OK;
  }

  bool Send(const v1::CoordinatorMessage& msg) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == nullptr) return false;
    std::lock_guard<std::mutex> wlock(write_mu_);
    return stream_->Write(msg);
  }

  // Waits until `pred(messages, registers)` holds.
  bool WaitFor(const std::function<bool(const std::vector<v1::WorkerMessage>&,
                                        const std::vector<v1::RegisterRequest>&)>& pred,
               milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(messages_, registers_); });
  }
  bool WaitForSession(int n, milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return sessions_ >= n && stream_ != nullptr; });
  }
  std::vector<v1::WorkerMessage> Messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  std::vector<v1::RegisterRequest> Registers() {
    std::lock_guard<std::mutex> lock(mu_);
    return registers_;
  }

 private:
  std::mutex mu_;
  std::mutex write_mu_;
  std::condition_variable cv_;
  grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream_ = nullptr;
  std::vector<v1::WorkerMessage> messages_;
  std::vector<v1::RegisterRequest> registers_;
  int sessions_ = 0;
  bool keep_running_ = true;
};

struct PeerServer {
  PeerCoordinator service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  explicit PeerServer(int want_port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", want_port),
                             grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~PeerServer() { Stop(); }
  void Stop() {
    if (server) server->Shutdown(std::chrono::system_clock::now() + milliseconds(200));
    server.reset();
  }
};

std::string BinDir() {
  const char* dir = std::getenv("ULYSSES_BIN_DIR");
  return dir != nullptr ? dir : "build/bin";
}

class WorkerAgentTest : public ::testing::Test {
 protected:
  // The worker stops before its work dir is removed.
  void TearDown() override { worker_.reset(); }

  void StartWorker(int port, double grace_s = 10) {
    std::vector<std::string> argv = {BinDir() + "/ulysses-worker",
                                     "--coordinator",
                                     absl::StrCat("127.0.0.1:", port),
                                     "--name",
                                     "t0",
                                     "--work-dir",
                                     work_dir_,
                                     "--engine-bin",
                                     FAKE_RANK_PATH,
                                     "--grace-period-s",
                                     absl::StrCat(grace_s)};
    ChildCallbacks cb;
    cb.on_log = [this](const std::string&, const std::string& line) {
      std::lock_guard<std::mutex> lock(log_mu_);
      worker_log_ += line + "\n";
    };
    auto worker = ChildSupervisor::Start(argv, "", std::move(cb));
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(*worker);
  }

  static v1::CoordinatorMessage Assign(int64_t generation, std::vector<std::string> sets) {
    v1::CoordinatorMessage msg;
    auto* a = msg.mutable_assignment();
    a->mutable_ref()->set_job_id("job-000001");
    a->mutable_ref()->set_generation(generation);
    a->mutable_ref()->set_rank(0);
    a->mutable_ref()->set_stage(0);
    a->set_spec_yaml("apiVersion: ulysses/v1\nkind: TrainJob\n");
    a->set_world_size(1);
    a->set_master_addr("127.0.0.1");
    a->set_master_port(29999);
    for (auto& s : sets) a->add_overrides(s);
    return msg;
  }

  static int Count(const std::vector<v1::WorkerMessage>& msgs, v1::WorkerMessage::KindCase kind) {
    int n = 0;
    for (const auto& m : msgs) n += m.kind_case() == kind;
    return n;
  }
  static const v1::AttemptExited* Exited(const std::vector<v1::WorkerMessage>& msgs) {
    for (const auto& m : msgs) {
      if (m.has_exited()) return &m.exited();
    }
    return nullptr;
  }
  std::string WorkerLog() {
    std::lock_guard<std::mutex> lock(log_mu_);
    return worker_log_;
  }

  ::ulysses::testing::TempDir dir_{"ulysses-worker-test"};
  const std::string work_dir_ = dir_.path();
  std::unique_ptr<ChildSupervisor> worker_;
  std::mutex log_mu_;
  std::string worker_log_;
};

using Msgs = std::vector<v1::WorkerMessage>;
using Regs = std::vector<v1::RegisterRequest>;

TEST_F(WorkerAgentTest, RunsAnAssignmentAndReportsEverything) {
  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  Regs regs = peer.service.Registers();
  ASSERT_FALSE(regs.empty());
  EXPECT_EQ(regs[0].name(), "t0");
  EXPECT_EQ(regs[0].device(), "cpu");
  EXPECT_EQ(regs[0].host(), "127.0.0.1");
  EXPECT_FALSE(regs[0].has_running());

  ASSERT_TRUE(peer.service.Send(Assign(1, {"fake.steps=3"})));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)))
      << WorkerLog();
  const Msgs msgs = peer.service.Messages();
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kStarted), 1);
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kProgress), 3);
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kCheckpoint), 1);
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kEval), 1);
  const v1::AttemptExited* exited = Exited(msgs);
  EXPECT_EQ(exited->exit_code(), 0);
  EXPECT_FALSE(exited->preempted());
  EXPECT_FALSE(exited->aborted());
  EXPECT_EQ(exited->ref().job_id(), "job-000001");
  EXPECT_EQ(exited->ref().generation(), 1);
  for (const auto& m : msgs) {
    if (m.has_progress()) {
      EXPECT_EQ(m.progress().progress().steps(), 3);
      EXPECT_GT(m.progress().progress().loss(), 0);
    }
    if (m.has_checkpoint()) {
      EXPECT_EQ(m.checkpoint().checkpoint().path(), "/tmp/ckpt/final");
    }
    if (m.has_eval()) {
      EXPECT_EQ(m.eval().result().seq_len(), 128);
      EXPECT_DOUBLE_EQ(m.eval().result().accuracy(), 0.25);
    }
  }
  // The spec was written under the work dir and the logs include the agent's notes.
  EXPECT_TRUE(fs::exists(fs::path(work_dir_) / "jobs/job-000001/g1-s0-r0/job.yaml"));
  bool saw_agent_note = false;
  for (const auto& m : msgs) {
    for (const auto& line : m.logs().lines()) {
      saw_agent_note |= line.stream() == v1::LOG_STREAM_AGENT &&
                        line.text().find("started rank 0/1") != std::string::npos;
    }
  }
  EXPECT_TRUE(saw_agent_note);
}

TEST_F(WorkerAgentTest, FailureExitCarriesTheStderrReason) {
  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  ASSERT_TRUE(peer.service.Send(Assign(4, {"fake.steps=0", "fake.exit=2"})));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)));
  const Msgs msgs = peer.service.Messages();
  const v1::AttemptExited* exited = Exited(msgs);
  EXPECT_EQ(exited->exit_code(), 2);
  EXPECT_NE(exited->error_message().find("not divisible by sp_degree"), std::string::npos)
      << exited->error_message();
}

TEST_F(WorkerAgentTest, AbortKillsTheChildPromptly) {
  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  ASSERT_TRUE(peer.service.Send(Assign(2, {"fake.steps=100000", "fake.step_ms=20"})));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 2; },
      seconds(20)));
  v1::CoordinatorMessage abort;
  abort.mutable_abort()->mutable_ref()->set_job_id("job-000001");
  abort.mutable_abort()->mutable_ref()->set_generation(2);
  abort.mutable_abort()->set_reason("peer lost");
  abort.mutable_abort()->set_grace_period_ms(500);
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(peer.service.Send(abort));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(10)));
  EXPECT_LT(std::chrono::steady_clock::now() - sent, seconds(5));
  const Msgs msgs = peer.service.Messages();
  EXPECT_TRUE(Exited(msgs)->aborted());
  // The worker itself is still alive and idle.
  EXPECT_TRUE(worker_->Running());
}

TEST_F(WorkerAgentTest, SigtermPreemptsTheChildReportsAndExits) {
  PeerServer peer;
  StartWorker(peer.port, /*grace_s=*/20);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  ASSERT_TRUE(peer.service.Send(Assign(3, {"fake.steps=100000", "fake.step_ms=20"})));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 2; },
      seconds(20)));
  ASSERT_EQ(kill(worker_->pid(), SIGTERM), 0);
  auto result = worker_->Wait(seconds(20));
  ASSERT_TRUE(result.has_value()) << "worker did not exit after SIGTERM\n" << WorkerLog();
  EXPECT_EQ(result->description, "exit code 0") << WorkerLog();
  const Msgs msgs = peer.service.Messages();
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kPreempting), 1);
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kCheckpoint), 1);  // The preemption checkpoint.
  const v1::AttemptExited* exited = Exited(msgs);
  ASSERT_NE(exited, nullptr);
  EXPECT_EQ(exited->exit_code(), 75);
  EXPECT_TRUE(exited->preempted());
}

// What CLI11 rejects (an unknown flag, a missing required one) is bad input: exit 2.
TEST_F(WorkerAgentTest, FlagsCli11RejectsExit2) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--coordinator", "127.0.0.1:1", "--name", "x", "--work-dir",
                                 work_dir_, "--no-such-flag"},
        std::vector<std::string>{"--name", "x", "--work-dir", work_dir_}}) {
    std::string err;
    ChildCallbacks cb;
    cb.on_log = [&](const std::string&, const std::string& line) { err += line + "\n"; };
    std::vector<std::string> argv = {BinDir() + "/ulysses-worker"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto worker = ChildSupervisor::Start(argv, "", std::move(cb));
    ASSERT_TRUE(worker.ok());
    EXPECT_EQ((*worker)->Wait().description, "exit code 2") << err;
    EXPECT_FALSE(err.empty());
  }
}

TEST_F(WorkerAgentTest, ReconnectsToARestartedCoordinatorWithoutKillingTheChild) {
  auto peer = std::make_unique<PeerServer>();
  const int port = peer->port;
  StartWorker(port);
  ASSERT_TRUE(peer->service.WaitForSession(1, seconds(20)));
  // ~3 s of work: it must survive the coordinator's absence.
  ASSERT_TRUE(peer->service.Send(Assign(7, {"fake.steps=150", "fake.step_ms=20"})));
  ASSERT_TRUE(peer->service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 1; },
      seconds(20)));
  peer.reset();  // Coordinator gone.
  peer = std::make_unique<PeerServer>(port);
  ASSERT_EQ(peer->port, port);
  ASSERT_TRUE(peer->service.WaitFor(
      [](const Msgs&, const Regs& r) { return !r.empty() && r.back().has_running(); }, seconds(20)))
      << WorkerLog();
  const Regs regs = peer->service.Registers();
  EXPECT_EQ(regs.back().running().ref().job_id(), "job-000001");
  EXPECT_EQ(regs.back().running().ref().generation(), 7);
  EXPECT_GT(regs.back().running().pid(), 0);
  // The child ran on and its success is reported to the new coordinator.
  ASSERT_TRUE(
      peer->service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(30)))
      << WorkerLog();
  EXPECT_EQ(Exited(peer->service.Messages())->exit_code(), 0);
}

TEST_F(WorkerAgentTest, ARankThatEndedWhileDisconnectedIsClaimedUntilItsExitIsAcked) {
  auto peer = std::make_unique<PeerServer>();
  const int port = peer->port;
  StartWorker(port);
  ASSERT_TRUE(peer->service.WaitForSession(1, seconds(20)));
  ASSERT_TRUE(peer->service.Send(Assign(9, {"fake.steps=25", "fake.step_ms=20"})));
  ASSERT_TRUE(peer->service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 1; },
      seconds(20)));
  peer.reset();
  // The rank finishes while nobody listens.
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while (WorkerLog().find("exit code 0 -> succeeded") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_NE(WorkerLog().find("exit code 0 -> succeeded"), std::string::npos) << WorkerLog();
  peer = std::make_unique<PeerServer>(port);
  ASSERT_TRUE(
      peer->service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)))
      << WorkerLog();
  const Regs regs = peer->service.Registers();
  ASSERT_FALSE(regs.empty());
  EXPECT_EQ(regs.front().running().ref().generation(), 9) << "the ended rank was not claimed";
  EXPECT_EQ(Exited(peer->service.Messages())->exit_code(), 0);
}

// Runs ulysses-worker with `flags` to its exit; returns its exit description and output.
std::pair<std::string, std::string> RunWorkerWithFlags(const std::vector<std::string>& flags) {
  std::string out;
  ChildCallbacks cb;
  cb.on_log = [&out](const std::string&, const std::string& line) { out += line + "\n"; };
  std::vector<std::string> argv = {BinDir() + "/ulysses-worker"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto worker = ChildSupervisor::Start(argv, "", std::move(cb));
  if (!worker.ok()) return {std::string(worker.status().message()), ""};
  ChildResult result = (*worker)->Wait();
  return {result.description, out};
}

// Values that parse but are invalid: the config's own validation.
TEST_F(WorkerAgentTest, RejectsBadFlagsWithTheFlagName) {
  auto [exit, out] =
      RunWorkerWithFlags({"--coordinator", "nohostport", "--name", "x", "--work-dir", work_dir_,
                          "--device", "tpu", "--engine-bin", FAKE_RANK_PATH});
  EXPECT_EQ(exit, "exit code 2");
  EXPECT_NE(out.find("--coordinator: \"nohostport\" is not HOST:PORT"), std::string::npos) << out;
  EXPECT_NE(out.find("--device: \"tpu\" is not cpu or cuda:N"), std::string::npos) << out;
}

// Flags the command-line parser itself refuses (not a number, unknown, missing): the
// same exit 2 of the flag contract, naming the flag.
TEST_F(WorkerAgentTest, FlagParseErrorsExit2WithTheFlagName) {
  const std::vector<std::string> good = {"--coordinator", "127.0.0.1:1", "--name", "x",
                                         "--work-dir",    work_dir_};
  struct Case {
    std::vector<std::string> extra;
    bool drop_name;
    std::string flag;
  };
  for (const Case& c :
       {Case{{"--grace-period-s", "soon"}, false, "--grace-period-s"},
        Case{{"--no-such-flag"}, false, "--no-such-flag"}, Case{{}, true, "--name"}}) {
    SCOPED_TRACE(c.flag);
    std::vector<std::string> flags = good;
    if (c.drop_name) flags.erase(flags.begin() + 2, flags.begin() + 4);
    flags.insert(flags.end(), c.extra.begin(), c.extra.end());
    auto [exit, out] = RunWorkerWithFlags(flags);
    EXPECT_EQ(exit, "exit code 2") << out;
    EXPECT_NE(out.find(c.flag), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace ulysses::agent
