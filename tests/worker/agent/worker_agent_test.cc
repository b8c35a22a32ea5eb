// Runs the real ulysses-worker binary against a test-side WorkerService peer (the
// coordinator is built in parallel; tests/e2e covers the real one) with fake_rank as
// the engine: registration, assignment -> child -> acked reports, abort, SIGTERM
// preemption, and reconnect to a restarted coordinator with the child still running.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/catalog.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/server_credentials.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/common/metrics/subprocess_for_test.h"
#include "tests/testing/certs.h"
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
  // What the server saw of one call's credentials.
  struct Caller {
    std::string rpc;            // "Register" | "Session".
    std::string authorization;  // The `authorization` metadata; "" when absent.
    std::string transport;      // "insecure" | "ssl".
    std::string client_cn;      // x509 common name of the client certificate.
  };

  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    RecordLocked("Register", ctx);
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
      RecordLocked("Session", ctx);
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
      if (msg.has_heartbeat()) {
        last_heartbeat_ = msg.heartbeat();
      } else {
        messages_.push_back(msg);
      }
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
  // Heartbeats are not kept in Messages(); the newest one is.
  v1::Heartbeat LastHeartbeat() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_heartbeat_;
  }
  std::vector<Caller> Callers() {
    std::lock_guard<std::mutex> lock(mu_);
    return callers_;
  }

 private:
  void RecordLocked(const char* rpc, grpc::ServerContext* ctx) {
    Caller caller;
    caller.rpc = rpc;
    auto it = ctx->client_metadata().find("authorization");
    if (it != ctx->client_metadata().end()) {
      caller.authorization.assign(it->second.data(), it->second.size());
    }
    auto auth = ctx->auth_context();
    for (const auto& v : auth->FindPropertyValues("transport_security_type")) {
      caller.transport.assign(v.data(), v.size());
    }
    for (const auto& v : auth->FindPropertyValues("x509_common_name")) {
      caller.client_cn.assign(v.data(), v.size());
    }
    callers_.push_back(std::move(caller));
  }

  std::mutex mu_;
  std::mutex write_mu_;
  std::condition_variable cv_;
  grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream_ = nullptr;
  std::vector<v1::WorkerMessage> messages_;
  v1::Heartbeat last_heartbeat_;
  std::vector<v1::RegisterRequest> registers_;
  std::vector<Caller> callers_;
  int sessions_ = 0;
  bool keep_running_ = true;
};

struct PeerServer {
  PeerCoordinator service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  // `tls`: the test PKI's server certificate; client certificates are required and
  // verified (as the coordinator does for workers with --tls-client-ca).
  explicit PeerServer(int want_port = 0, bool tls = false) {
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (tls) {
      const auto& certs = ::ulysses::testing::TestCerts({"w1", "w2"});
      grpc::SslServerCredentialsOptions ssl(
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      ssl.pem_root_certs = ::ulysses::testing::ReadFileOrEmpty(certs.ca);
      ssl.pem_key_cert_pairs.push_back({::ulysses::testing::ReadFileOrEmpty(certs.server_key),
                                        ::ulysses::testing::ReadFileOrEmpty(certs.server_cert)});
      creds = grpc::SslServerCredentials(ssl);
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", want_port), creds, &port);
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

  void StartWorker(int port, double grace_s = 10, const std::vector<std::string>& extra = {},
                   const std::string& host = "127.0.0.1") {
    std::vector<std::string> argv = {BinDir() + "/ulysses-worker",
                                     "--coordinator",
                                     absl::StrCat(host, ":", port),
                                     "--name",
                                     "t0",
                                     "--work-dir",
                                     work_dir_,
                                     "--engine-bin",
                                     FAKE_RANK_PATH,
                                     "--grace-period-s",
                                     absl::StrCat(grace_s)};
    argv.insert(argv.end(), extra.begin(), extra.end());
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
  // Polls the worker's output for `text` (after offset `from`) while it runs.
  bool WaitForLog(const std::string& text, milliseconds timeout, size_t from = 0) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (WorkerLog().find(text, from) != std::string::npos) return true;
      if (!worker_->Running()) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return WorkerLog().find(text, from) != std::string::npos;
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

// A worker with several slots (--devices cpu --capacity 2; a GPU node's worker has one per
// GPU): two ranks run at once, each on its assigned slot, heartbeats report both, and one
// Abort stops every rank of that generation on the worker. An assignment to a slot the
// worker does not have is refused with an exit report naming it.
TEST_F(WorkerAgentTest, ATwoSlotWorkerRunsTwoRanksAtOnceAndOneAbortStopsBoth) {
  PeerServer peer;
  StartWorker(peer.port, 10, {"--devices", "cpu", "--capacity", "2"});
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  const v1::RegisterRequest reg = peer.service.Registers().front();
  EXPECT_EQ(reg.capacity(), 2);
  EXPECT_EQ(std::vector<std::string>(reg.devices().begin(), reg.devices().end()),
            (std::vector<std::string>{"cpu", "cpu"}));
  for (int rank = 0; rank < 2; ++rank) {
    v1::CoordinatorMessage m = Assign(4, {"fake.steps=100000", "fake.step_ms=20"});
    m.mutable_assignment()->mutable_ref()->set_rank(rank);
    m.mutable_assignment()->set_world_size(2);
    m.mutable_assignment()->set_slot(1 - rank);  // Rank 0 on slot 1, rank 1 on slot 0.
    ASSERT_TRUE(peer.service.Send(m));
  }
  // Both children run: a heartbeat lists both ranks with their slots.
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while (peer.service.LastHeartbeat().running_ranks_size() < 2 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  const v1::Heartbeat hb = peer.service.LastHeartbeat();
  ASSERT_EQ(hb.running_ranks_size(), 2) << WorkerLog();
  for (const v1::RunningWork& r : hb.running_ranks()) {
    EXPECT_EQ(r.slot(), 1 - r.ref().rank()) << r.DebugString();
    EXPECT_GT(r.pid(), 0);
  }
  EXPECT_EQ(hb.running().ref().rank(), hb.running_ranks(0).ref().rank());
  Msgs msgs = peer.service.Messages();
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kStarted), 2);
  // A third rank on a slot it does not have.
  v1::CoordinatorMessage bad = Assign(4, {"fake.steps=1"});
  bad.mutable_assignment()->mutable_ref()->set_rank(2);
  bad.mutable_assignment()->set_slot(2);
  ASSERT_TRUE(peer.service.Send(bad));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kExited) >= 1; },
      seconds(10)));
  msgs = peer.service.Messages();
  ASSERT_NE(Exited(msgs), nullptr);
  EXPECT_EQ(Exited(msgs)->ref().rank(), 2);
  EXPECT_NE(Exited(msgs)->error_message().find("assigned slot 2 but has 2"), std::string::npos)
      << Exited(msgs)->error_message();
  // One abort for the generation stops both running ranks.
  v1::CoordinatorMessage abort;
  abort.mutable_abort()->mutable_ref()->set_job_id("job-000001");
  abort.mutable_abort()->mutable_ref()->set_generation(4);
  abort.mutable_abort()->set_reason("peer lost");
  abort.mutable_abort()->set_grace_period_ms(500);
  ASSERT_TRUE(peer.service.Send(abort));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kExited) >= 3; },
      seconds(10)))
      << WorkerLog();
  std::set<int> aborted;
  for (const auto& m : peer.service.Messages()) {
    if (m.has_exited() && m.exited().aborted()) aborted.insert(m.exited().ref().rank());
  }
  EXPECT_EQ(aborted, (std::set<int>{0, 1}));
  EXPECT_TRUE(worker_->Running());
}

// Per-rank metrics on --metrics-listen (a real scrape over loopback): exactly the
// worker's rows of the metrics catalogue, the rank's figures from its step events with
// labels {job_id, stage, rank}, and none of the attempt's series once it ended.
TEST_F(WorkerAgentTest, ServesTheRanksMetricsAndDropsThemWhenTheAttemptEnds) {
  PeerServer peer;
  const int metrics_port = metrics::FreeLoopbackPort();
  ASSERT_GT(metrics_port, 0);
  StartWorker(
      peer.port, 10,
      {"--metrics-listen", absl::StrCat("127.0.0.1:", metrics_port), "--peak-flops", "4e12"});
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  httplib::Client http("127.0.0.1", metrics_port);
  auto scrape = [&] {
    auto res = http.Get("/metrics");
    return res && res->status == 200 ? res->body : std::string();
  };
  // Before any work: every family of the worker, and only those (label-less ones aside,
  // they have no series yet).
  std::string body = scrape();
  std::set<std::string> exported, catalogue;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) == 0) exported.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  for (const metrics::MetricDef& def : metrics::Catalog()) {
    for (const std::string& b : def.binaries) {
      if (b == metrics::kWorkerBinary) catalogue.insert(def.name);
    }
  }
  EXPECT_EQ(exported, catalogue) << body;
  EXPECT_NE(body.find("ulysses_build_info{"), std::string::npos);

  // generation 3, stage 0, rank 0 (Assign); the fake rank's fixed figures.
  ASSERT_TRUE(peer.service.Send(Assign(3, {"fake.steps=100000", "fake.step_ms=20"})));
  const std::string rank = "job_id=\"job-000001\",stage=\"0\",rank=\"0\"";
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while (scrape().find("ulysses_rank_steps_total{" + rank) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_NE(scrape().find("ulysses_rank_steps_total{" + rank), std::string::npos) << WorkerLog();
  body = scrape();
  for (const std::string& want :
       {"ulysses_rank_step_seconds{" + rank + "} 0.05",
        "ulysses_rank_step_phase_seconds{" + rank + ",phase=\"data_wait\"} 0.01",
        "ulysses_rank_step_phase_seconds{" + rank + ",phase=\"forward\"} 0.02",
        "ulysses_rank_step_phase_seconds{" + rank + ",phase=\"backward\"} 0.015",
        "ulysses_rank_step_phase_seconds{" + rank + ",phase=\"optimizer\"} 0.005",
        "ulysses_alltoall_seconds{" + rank + "} 0.004",
        "ulysses_rank_memory_peak_bytes{" + rank + ",kind=\"allocated\"} 1048576",
        "ulysses_rank_memory_peak_bytes{" + rank + ",kind=\"reserved\"} 2097152",
        "ulysses_rank_memory_limit_bytes{" + rank + "} 8388608",
        "ulysses_rank_tokens_per_second{" + rank + "} 500",
        "ulysses_rank_mfu_ratio{" + rank + "} 0.25"}) {
    EXPECT_NE(body.find(want + "\n"), std::string::npos) << want << "\n" << body;
  }
  EXPECT_NE(body.find("ulysses_alltoall_bytes_total{" + rank + "} "), std::string::npos);

  v1::CoordinatorMessage abort;
  abort.mutable_abort()->mutable_ref()->set_job_id("job-000001");
  abort.mutable_abort()->mutable_ref()->set_generation(3);
  abort.mutable_abort()->set_reason("test over");
  abort.mutable_abort()->set_grace_period_ms(500);
  ASSERT_TRUE(peer.service.Send(abort));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(10)));
  body = scrape();
  EXPECT_EQ(body.find("job-000001"), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE ulysses_rank_step_seconds gauge"), std::string::npos);
}

TEST_F(WorkerAgentTest, MetricsListenOnABusyPortFailsTheWorker) {
  PeerServer peer;
  // A plain listening socket (no SO_REUSEPORT) holds the port.
  const int busy = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(busy, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(busy, 1), 0);
  ASSERT_EQ(getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  StartWorker(peer.port, 10, {"--metrics-listen", absl::StrCat("127.0.0.1:", port)});
  std::optional<ChildResult> r = worker_->Wait(seconds(20));
  close(busy);
  ASSERT_TRUE(r.has_value()) << "the worker kept running on a busy metrics port:\n" << WorkerLog();
  EXPECT_EQ(r->outcome, contract::RankOutcome::kFailed) << r->description;
  EXPECT_NE(WorkerLog().find(absl::StrCat("127.0.0.1:", port)), std::string::npos) << WorkerLog();
  EXPECT_EQ(peer.service.Registers().size(), 0u);  // Failed before registering.
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

// A priority preemption (Abort with preempt): the rank checkpoints and exits 75, the exit
// is reported as preempted (not aborted), no `preempting` notice (the worker is not
// draining), and the worker stays up and takes the next assignment.
TEST_F(WorkerAgentTest, APreemptingAbortCheckpointsAndKeepsTheWorker) {
  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  ASSERT_TRUE(peer.service.Send(Assign(5, {"fake.steps=100000", "fake.step_ms=20"})));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 2; },
      seconds(20)));
  v1::CoordinatorMessage preempt;
  preempt.mutable_abort()->mutable_ref()->set_job_id("job-000001");
  preempt.mutable_abort()->mutable_ref()->set_generation(5);
  preempt.mutable_abort()->set_reason("preempted for job-000002");
  preempt.mutable_abort()->set_grace_period_ms(20000);
  preempt.mutable_abort()->set_preempt(true);
  ASSERT_TRUE(peer.service.Send(preempt));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)))
      << WorkerLog();
  Msgs msgs = peer.service.Messages();
  const v1::AttemptExited* exited = Exited(msgs);
  EXPECT_EQ(exited->exit_code(), 75);
  EXPECT_TRUE(exited->preempted());
  EXPECT_FALSE(exited->aborted());
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kCheckpoint), 1);  // The preemption checkpoint.
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kPreempting), 0);
  EXPECT_TRUE(worker_->Running());
  ASSERT_TRUE(peer.service.Send(Assign(6, {"fake.steps=1"})));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) {
        for (const auto& x : m) {
          if (x.has_exited() && x.exited().ref().generation() == 6) return true;
        }
        return false;
      },
      seconds(20)))
      << WorkerLog();
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
  auto [exit, out] = RunWorkerWithFlags({"--coordinator", "nohostport", "--name", "x", "--work-dir",
                                         work_dir_, "--device", "tpu", "--engine-bin",
                                         FAKE_RANK_PATH, "--collective-timeout-s", "-5"});
  EXPECT_EQ(exit, "exit code 2");
  EXPECT_NE(out.find("--coordinator: \"nohostport\" is not HOST:PORT"), std::string::npos) << out;
  EXPECT_NE(out.find("--devices: \"tpu\" has \"tpu\", which is not cuda:N"), std::string::npos)
      << out;
  EXPECT_NE(out.find("--collective-timeout-s: -5 is outside 0..86400"), std::string::npos) << out;
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

// The token (--token-file, $ULYSSES_TOKEN) goes on Register and on the Session stream.
TEST_F(WorkerAgentTest, SendsTheTokenOnRegisterAndSession) {
  std::ofstream(dir_.Sub("token")) << "ul_worker-token\n";
  PeerServer peer;
  StartWorker(peer.port, 10, {"--token-file", dir_.Sub("token")});
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  std::vector<PeerCoordinator::Caller> callers = peer.service.Callers();
  ASSERT_GE(callers.size(), 2u);
  for (const auto& c : callers) {
    SCOPED_TRACE(c.rpc);
    EXPECT_EQ(c.authorization, "Bearer ul_worker-token");
    EXPECT_EQ(c.transport, "insecure");
  }
  EXPECT_EQ(callers[0].rpc, "Register");
  EXPECT_EQ(callers[1].rpc, "Session");
  worker_.reset();

  setenv("ULYSSES_TOKEN", "ul_from_env", 1);
  PeerServer env_peer;
  StartWorker(env_peer.port);
  unsetenv("ULYSSES_TOKEN");
  ASSERT_TRUE(env_peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  for (const auto& c : env_peer.service.Callers()) EXPECT_EQ(c.authorization, "Bearer ul_from_env");
}

// --ca/--cert/--key: TLS to the coordinator, presenting the worker's certificate.
TEST_F(WorkerAgentTest, MutualTlsPresentsTheWorkerCertificate) {
  const auto& certs = ::ulysses::testing::TestCerts({"w1", "w2"});
  PeerServer peer(0, /*tls=*/true);
  ASSERT_GT(peer.port, 0);
  std::ofstream(dir_.Sub("token")) << "ul_w1\n";
  StartWorker(peer.port, 10,
              {"--ca", certs.ca, "--cert", certs.WorkerCert("w1"), "--key", certs.WorkerKey("w1"),
               "--token-file", dir_.Sub("token")},
              "localhost");
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  std::vector<PeerCoordinator::Caller> callers = peer.service.Callers();
  ASSERT_GE(callers.size(), 2u);
  for (const auto& c : callers) {
    SCOPED_TRACE(c.rpc);
    EXPECT_EQ(c.transport, "ssl");
    EXPECT_EQ(c.client_cn, "w1");
    EXPECT_EQ(c.authorization, "Bearer ul_w1");
  }
  EXPECT_NE(WorkerLog().find("(mutual TLS, token)"), std::string::npos) << WorkerLog();
}

// A worker without a client certificate cannot reach a server that requires one.
TEST_F(WorkerAgentTest, WithoutAClientCertificateTheTlsPeerNeverSeesACall) {
  const auto& certs = ::ulysses::testing::TestCerts({"w1", "w2"});
  PeerServer peer(0, /*tls=*/true);
  ASSERT_GT(peer.port, 0);
  StartWorker(peer.port, 10, {"--ca", certs.ca});
  // Two failed attempts (the TLS handshake fails), and no call got through.
  const std::string failed = "coordinator session ended (UNAVAILABLE";
  ASSERT_TRUE(WaitForLog(failed, seconds(20))) << WorkerLog();
  ASSERT_TRUE(WaitForLog(failed, seconds(20), WorkerLog().find(failed) + 1)) << WorkerLog();
  EXPECT_TRUE(peer.service.Callers().empty());
  EXPECT_TRUE(peer.service.Registers().empty());
}

TEST_F(WorkerAgentTest, RejectsBadCredentialFlagsWithTheFlagName) {
  const std::vector<std::string> good = {"--name",       "x",           "--work-dir", work_dir_,
                                         "--engine-bin", FAKE_RANK_PATH};
  std::ofstream(dir_.Sub("token")) << "ul_t\n";
  struct Case {
    std::vector<std::string> extra;
    std::string expected;
  };
  const Case cases[] = {
      {{"--coordinator", "10.1.2.3:50051"},
       "--coordinator: \"10.1.2.3:50051\" is not a loopback address"},
      {{"--coordinator", "127.0.0.1:1", "--ca", dir_.Sub("missing.pem")},
       "--ca: cannot read \"" + dir_.Sub("missing.pem") + "\""},
      {{"--coordinator", "127.0.0.1:1", "--ca", dir_.Sub("token"), "--cert", dir_.Sub("token")},
       "give both (mutual TLS) or neither"},
      {{"--coordinator", "127.0.0.1:1", "--token-file", dir_.Sub("none")},
       "--token-file: cannot read"},
      {{"--coordinator", "127.0.0.1:1", "--token-file", dir_.Sub("token"), "--token", "ul_x"},
       "keep one"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    std::vector<std::string> flags = good;
    flags.insert(flags.end(), c.extra.begin(), c.extra.end());
    auto [exit, out] = RunWorkerWithFlags(flags);
    EXPECT_EQ(exit, "exit code 2") << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << out;
  }
  // --insecure allows plaintext off loopback: the flags pass and the agent starts.
  StartWorker(1, 10, {"--insecure"}, "10.1.2.3");
  EXPECT_TRUE(WaitForLog("-> coordinator 10.1.2.3:1 (plaintext, no token)", seconds(20)))
      << WorkerLog();
}

}  // namespace
}  // namespace ulysses::agent
