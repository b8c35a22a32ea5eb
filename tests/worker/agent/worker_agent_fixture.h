// The worker agent test rig: a test-side WorkerService peer (the coordinator side of the
// worker session protocol) and a fixture that runs the real ulysses-worker binary with
// fake_rank as its engine. Shared by worker_agent_test.cc (sessions, ranks, preemption,
// reconnects) and worker_agent_flags_test.cc (flags and credentials).
#ifndef ULYSSES_TESTS_WORKER_AGENT_WORKER_AGENT_FIXTURE_H_
#define ULYSSES_TESTS_WORKER_AGENT_WORKER_AGENT_FIXTURE_H_

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
#include "tests/testing/certs.h"
#include "tests/testing/files.h"
#include "tests/testing/net.h"
#include "tests/testing/poll.h"
#include "tests/testing/temp_dir.h"
#include "ulysses/v1/worker_service.grpc.pb.h"
#include "worker/agent/child_supervisor.h"

namespace ulysses::agent {

namespace v1 = ::ulysses::v1;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::ulysses::testing::PollUntil;

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
        heartbeat_times_.push_back(std::chrono::steady_clock::now());
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
  // When each heartbeat arrived.
  std::vector<std::chrono::steady_clock::time_point> HeartbeatTimes() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeat_times_;
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
  std::vector<std::chrono::steady_clock::time_point> heartbeat_times_;
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
      ssl.pem_root_certs = ::ulysses::testing::ReadFile(certs.ca);
      ssl.pem_key_cert_pairs.push_back({::ulysses::testing::ReadFile(certs.server_key),
                                        ::ulysses::testing::ReadFile(certs.server_cert)});
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

inline std::string BinDir() {
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
    auto found = [&] { return WorkerLog().find(text, from) != std::string::npos; };
    PollUntil([&] { return found() || !worker_->Running(); }, timeout, milliseconds(20));
    return found();
  }

  ::ulysses::testing::TempDir dir_{"ulysses-worker-test"};
  const std::string work_dir_ = dir_.path();
  std::unique_ptr<ChildSupervisor> worker_;
  std::mutex log_mu_;
  std::string worker_log_;
};

using Msgs = std::vector<v1::WorkerMessage>;
using Regs = std::vector<v1::RegisterRequest>;

}  // namespace ulysses::agent

#endif  // ULYSSES_TESTS_WORKER_AGENT_WORKER_AGENT_FIXTURE_H_
