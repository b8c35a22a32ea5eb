// CoordinatorServerTest: the fixture of the coordinator's gRPC tests. An in-process
// CoordinatorServer on 127.0.0.1:0 (real gRPC over TLS with worker client certificates
// and the test token file, real SQLite in a temp dir, real metrics HTTP server),
// FakeWorker protocol peers (each presenting its own client certificate) and a
// JobService client holding the admin token (auth_channel.h).
#ifndef ULYSSES_TESTS_COORDINATOR_GRPC_FIXTURE_H_
#define ULYSSES_TESTS_COORDINATOR_GRPC_FIXTURE_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "coordinator/server.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/coordinator/auth_channel.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/test_util.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::coordinator::testing {

class CoordinatorServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.listen = "127.0.0.1:0";
    config_.state_dir = dir_.path();
    config_.metrics_listen = "127.0.0.1:0";
    // Short enough to test loss quickly, long enough for a loaded 2-core CI box.
    config_.heartbeat_timeout_s = 2;
    config_.heartbeat_interval_s = 0.2;
    config_.lost_after_s = 2;  // No SUSPECT window unless Configure() opens one.
    config_.restart_backoff_base_s = 0.05;
    config_.restart_backoff_max_s = 0.2;
    UseTestSecurity(&config_, tokens_dir_.Sub("tokens.yaml"));
    Configure(&config_);
    ASSERT_TRUE(ValidateAndFinalize(&config_).ok());
    auto server = CoordinatorServer::Start(config_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = Channel(WithToken(TestTokens::kAdmin));
    jobs_ = v1::JobService::NewStub(channel_);
  }
  // A fixture's own settings, applied over the ones above before validation.
  virtual void Configure(CoordinatorConfig*) {}
  void TearDown() override {
    workers_.clear();
    if (server_) server_->Shutdown();
  }

  // Stops the coordinator and starts a new one on the same state dir (a restart), and
  // reconnects the admin JobService client (or starts it again after the test stopped it).
  // Workers must reconnect themselves.
  void RestartServer() {
    if (server_) server_->Shutdown();
    server_.reset();
    auto server = CoordinatorServer::Start(config_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = Channel(WithToken(TestTokens::kAdmin));
    jobs_ = v1::JobService::NewStub(channel_);
  }

  // A channel to the server (TLS) with `options`' token and worker certificate.
  std::shared_ptr<grpc::Channel> Channel(const TestChannelOptions& options) {
    return MakeTestChannel(server_->port(), options);
  }

  // A FakeWorker presenting the client certificate of `name`.
  FakeWorker& AddWorker(const std::string& name, const std::string& label = "",
                        const std::string& host = "") {
    workers_.push_back(std::make_unique<FakeWorker>(
        Channel(WithWorkerCert(name)), name, label,
        host.empty() ? "10.0.0." + std::to_string(workers_.size() + 1) : host));
    FakeWorker& w = *workers_.back();
    EXPECT_TRUE(w.Register().ok());
    w.Connect();
    w.StartHeartbeats(std::chrono::milliseconds(100));
    return w;
  }

  absl::StatusOr<std::string> Submit(const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    absl::Status s = FromGrpcStatus(jobs_->SubmitJob(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp.job_id();
  }

  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    req.set_include_events(true);
    v1::GetJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    grpc::Status s = jobs_->GetJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job();
  }

  // Every buffered log line of job `id` (GetJobLogs, tail_lines -1).
  std::vector<v1::LogLine> Logs(const std::string& id) {
    v1::GetJobLogsRequest req;
    req.set_job_id(id);
    req.set_tail_lines(-1);
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    auto reader = jobs_->GetJobLogs(&ctx, req);
    std::vector<v1::LogLine> lines;
    v1::GetJobLogsResponse resp;
    while (reader->Read(&resp)) lines.insert(lines.end(), resp.lines().begin(), resp.lines().end());
    EXPECT_TRUE(reader->Finish().ok());
    return lines;
  }

  // The /metrics body of the coordinator's metrics server.
  std::string Metrics() {
    httplib::Client http("127.0.0.1", server_->metrics_port());
    auto res = http.Get("/metrics");
    EXPECT_TRUE(res && res->status == 200);
    return res ? res->body : "";
  }

  // Sends `m` from `w` and returns the coordinator's Ack for it (nullopt: none came).
  std::optional<v1::Ack> SendForAck(FakeWorker& w, v1::WorkerMessage m,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    uint64_t seq = 0;
    EXPECT_TRUE(w.Send(std::move(m), &seq));
    return w.WaitAck(seq, timeout);
  }

  bool WaitState(const std::string& id, v1::JobState state,
                 std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    return PollUntil([&] { return GetJob(id).state() == state; }, timeout);
  }

  // Collects the assignments of one generation from `ws` (each worker at most one).
  std::map<int, std::pair<FakeWorker*, v1::Assignment>> CollectAssignments(
      const std::vector<FakeWorker*>& ws, size_t expected) {
    std::map<int, std::pair<FakeWorker*, v1::Assignment>> by_rank;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (by_rank.size() < expected && std::chrono::steady_clock::now() < deadline) {
      for (FakeWorker* w : ws) {
        auto a = w->WaitAssignment(std::chrono::milliseconds(20));
        if (a) by_rank[a->ref().rank()] = {w, *a};
      }
    }
    return by_rank;
  }

  // The raw answer of the standard grpc.health.v1.Health/Check, called as a generic
  // RPC: the request is HealthCheckRequest{service = ""} (empty bytes); SERVING is
  // HealthCheckResponse{status = 1}, i.e. the bytes 0x08 0x01. Empty on an RPC error.
  std::string HealthCheckBytes() {
    grpc::GenericStub stub(channel_);
    grpc::Slice empty("", 0);
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) { done.set_value(s); });
    grpc::Status status = done.get_future().get();
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<grpc::Slice> slices;
    if (!status.ok() || !response.Dump(&slices).ok()) return "";
    std::string bytes;
    for (const auto& sl : slices) {
      bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    return bytes;
  }
  bool Serving() { return HealthCheckBytes() == std::string("\x08\x01", 2); }

  TempDir dir_;
  TempDir tokens_dir_{"ulysses-tokens"};
  CoordinatorConfig config_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

}  // namespace ulysses::coordinator::testing

#endif  // ULYSSES_TESTS_COORDINATOR_GRPC_FIXTURE_H_
