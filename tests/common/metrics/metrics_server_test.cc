#include "common/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/metrics/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/files.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"

namespace ulysses {
namespace metrics {
namespace {

using ::testing::HasSubstr;

constexpr char kPromtool[] = "/usr/bin/promtool";

// `promtool check metrics` of `text` (its stdin).
::ulysses::testing::Result PromtoolCheckMetrics(const std::string& text) {
  return ::ulysses::testing::Run({kPromtool, "check", "metrics"}, {.stdin_data = text});
}

MetricsServerConfig Loopback(int port = 0) {
  MetricsServerConfig config;
  config.host = "127.0.0.1";
  config.port = port;
  return config;
}

// One family of each kind the registry offers, with values. (The coordinator's real
// catalogue is checked against docs/METRICS.md and promtool in coordinator_grpc_test.)
void RegisterOneOfEachKind(Registry* r) {
  ASSERT_TRUE(RegisterBuildInfo(r).ok());
  auto tokens = r->AddCounter("ulysses_train_tokens_total", "Tokens.", {"job_id"});
  auto bytes = r->AddGauge("ulysses_checkpoint_bytes", "Checkpoint size.", {"job_id"});
  auto wait = r->AddHistogram("ulysses_gang_wait_seconds", "Gang wait.", {},
                              ExponentialBuckets(0.5, 2, 12));
  ASSERT_TRUE(tokens.ok() && bytes.ok() && wait.ok());
  ASSERT_TRUE(r->AddCallbackGauge("ulysses_queue_length", "Queue.", [] { return 1.0; }).ok());
  (*tokens)->WithLabels({"j1"})->Increment(12345);
  (*bytes)->WithLabels({"j1"})->Set(1.5e9);
  (*wait)->WithLabels()->Observe(3.5);
}

TEST(MetricsServerTest, ServesEveryMetricKindInAFormatPromtoolAccepts) {
  Registry registry;
  RegisterOneOfEachKind(&registry);
  MetricsServer server(&registry, Loopback());
  ASSERT_TRUE(server.Start().ok());
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.address(), "127.0.0.1:" + std::to_string(server.port()));

  httplib::Client client("127.0.0.1", server.port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, registry.Serialize());
  EXPECT_THAT(res->body, HasSubstr("ulysses_train_tokens_total{job_id=\"j1\"} 12345\n"));
  EXPECT_THAT(res->body, HasSubstr("ulysses_checkpoint_bytes{job_id=\"j1\"} 1500000000\n"));
  EXPECT_THAT(res->body, HasSubstr("ulysses_build_info{version=\""));

  if (!::ulysses::testing::IsExecutable(kPromtool)) {
    GTEST_SKIP() << kPromtool << " missing (Debian package prometheus)";
  }
  const ::ulysses::testing::Result check = PromtoolCheckMetrics(res->body);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  EXPECT_EQ(check.out + check.err, "") << "promtool lint problems:\n" << check.out << check.err;
}

TEST(MetricsServerTest, PromtoolCatchesABadlyNamedFamily) {
  if (!::ulysses::testing::IsExecutable(kPromtool)) {
    GTEST_SKIP() << kPromtool << " missing";
  }
  // The raw writer does not validate, so it can produce what the Registry refuses.
  FamilySnapshot bad{"ulysses_restarts", "Restarts.", MetricType::kCounter, {Sample{"", {}, 1}}};
  EXPECT_FALSE(ValidateMetricName(bad.name, bad.type).ok());
  const ::ulysses::testing::Result check = PromtoolCheckMetrics(WriteTextFormat({bad}));
  EXPECT_NE(check.exit_code, 0);
  EXPECT_THAT(check.out + check.err, HasSubstr("_total"));
}

TEST(MetricsServerTest, HealthzReportsHealthCheck) {
  Registry registry;
  absl::Status health = absl::OkStatus();
  std::mutex mu;
  MetricsServer server(&registry, Loopback(), [&] {
    std::lock_guard<std::mutex> lock(mu);
    return health;
  });
  ASSERT_TRUE(server.Start().ok());
  httplib::Client client("127.0.0.1", server.port());
  auto ok = client.Get("/healthz");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "ok\n");
  {
    std::lock_guard<std::mutex> lock(mu);
    health = absl::UnavailableError("state dir not writable");
  }
  auto bad = client.Get("/healthz");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 503);
  EXPECT_THAT(bad->body, HasSubstr("state dir not writable"));
  auto missing = client.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

// Readiness and liveness are separate answers: a server that is not ready (e.g. its store
// is read-only) stays live, and /healthz follows readiness.
TEST(MetricsServerTest, ReadyzAndLivezAnswerTheirOwnChecks) {
  Registry registry;
  absl::Status ready = absl::OkStatus();
  absl::Status live = absl::OkStatus();
  std::mutex mu;
  MetricsServer server(
      &registry, Loopback(),
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return ready;
      },
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return live;
      });
  ASSERT_TRUE(server.Start().ok());
  httplib::Client client("127.0.0.1", server.port());
  for (const char* path : {"/readyz", "/livez", "/healthz"}) {
    auto res = client.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200) << path;
    EXPECT_EQ(res->body, "ok\n") << path;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ready = absl::UnavailableError("store read-only");
  }
  auto not_ready = client.Get("/readyz");
  ASSERT_TRUE(not_ready);
  EXPECT_EQ(not_ready->status, 503);
  EXPECT_THAT(not_ready->body, HasSubstr("store read-only"));
  EXPECT_EQ(client.Get("/healthz")->status, 503);
  EXPECT_EQ(client.Get("/livez")->status, 200);
  {
    std::lock_guard<std::mutex> lock(mu);
    ready = absl::OkStatus();
    live = absl::UnavailableError("loop stalled");
  }
  auto dead = client.Get("/livez");
  ASSERT_TRUE(dead);
  EXPECT_EQ(dead->status, 503);
  EXPECT_THAT(dead->body, HasSubstr("loop stalled"));
  EXPECT_EQ(client.Get("/readyz")->status, 200);
}

// Without checks every probe endpoint answers ok (the worker's metrics server).
TEST(MetricsServerTest, ProbesWithoutChecksAnswerOk) {
  Registry registry;
  MetricsServer server(&registry, Loopback());
  ASSERT_TRUE(server.Start().ok());
  httplib::Client client("127.0.0.1", server.port());
  for (const char* path : {"/readyz", "/livez", "/healthz"}) {
    auto res = client.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200) << path;
  }
}

TEST(MetricsServerTest, PortInUseIsAClearError) {
  Registry registry;
  MetricsServer first(&registry, Loopback());
  ASSERT_TRUE(first.Start().ok());
  MetricsServer second(&registry, Loopback(first.port()));
  absl::Status status = second.Start();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(first.port())));
  second.Stop();  // Safe after a failed Start.
  // The first server is unaffected.
  httplib::Client client("127.0.0.1", first.port());
  auto res = client.Get("/healthz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(MetricsServerTest, StopIsCleanAndIdempotent) {
  Registry registry;
  MetricsServer server(&registry, Loopback());
  server.Stop();  // Before Start: no-op.
  MetricsServer running(&registry, Loopback());
  ASSERT_TRUE(running.Start().ok());
  const int port = running.port();
  EXPECT_EQ(running.Start().code(), absl::StatusCode::kFailedPrecondition);
  running.Stop();
  running.Stop();
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  EXPECT_FALSE(client.Get("/metrics"));  // Nothing listens any more.
  // The port can be reused right away.
  MetricsServer again(&registry, Loopback(port));
  EXPECT_TRUE(again.Start().ok());
}

// A raw TCP client, so a test can be the slow, half-finished or oversized peer that
// httplib::Client never is. `source` picks the loopback address it connects from (all of
// 127/8 is loopback), which is how the server counts its peers.
class RawClient {
 public:
  RawClient(int port, const char* source = "127.0.0.1") {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    inet_pton(AF_INET, source, &from.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    connected_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0 &&
                 connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0;
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  bool Send(const std::string& data) {
    return send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Everything the server sends until it closes the connection, or until `timeout_ms`
  // passes (then `closed` is false).
  std::string ReadUntilClosed(int timeout_ms, bool* closed) {
    std::string got;
    *closed = false;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        *closed = true;
        break;
      }
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// The finding: two anonymous clients that send a header line every few seconds held both
// of the old server's threads, so the kubelet's /livez timed out and the coordinator would
// have been restarted. Now slow clients (here 12, from another address, past their per-peer
// share) hold no thread: /livez answers within the probe's 1 s timeout while they dribble.
TEST(MetricsServerTest, SlowClientsCannotStarveLivez) {
  Registry registry;
  MetricsServer server(&registry, Loopback());
  ASSERT_TRUE(server.Start().ok());
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < 12; ++i) {
    slow.push_back(std::make_unique<RawClient>(server.port(), "127.0.0.2"));
    ASSERT_TRUE(slow.back()->connected());
    slow.back()->Send("GET /metrics HTTP/1.1\r\nHost: x\r\n");  // Headers never finish.
  }
  for (int round = 0; round < 3; ++round) {
    for (auto& c : slow) c->Send("X-Slow: 1\r\n");
    httplib::Client probe("127.0.0.1", server.port());
    probe.set_connection_timeout(1);
    probe.set_read_timeout(1);
    auto res = probe.Get("/livez");
    ASSERT_TRUE(res) << "round " << round << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, "ok\n");
  }
}

// A client that keeps a request open by dribbling header lines is cut at the read deadline
// (counted from the connection, not from its last byte), without an answer.
TEST(MetricsServerTest, DribblingClientIsCutAtTheReadDeadline) {
  Registry registry;
  MetricsServerConfig config = Loopback();
  config.read_deadline_ms = 300;
  MetricsServer server(&registry, config);
  ASSERT_TRUE(server.Start().ok());
  RawClient slow(server.port());
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.Send("GET /livez HTTP/1.1\r\n"));
  bool closed = false;
  std::string got;
  // Up to 100 lines 100 ms apart (10 s, far past the deadline): the server hangs up first.
  for (int line = 0; line < 100 && !closed; ++line) {
    slow.Send("X-Slow: 1\r\n");
    got += slow.ReadUntilClosed(100, &closed);
  }
  EXPECT_TRUE(closed) << "the server kept a request open past read_deadline_ms";
  EXPECT_EQ(got, "") << "a request that never finished its headers got an answer";
}

// One peer cannot take every connection: past max_connections_per_peer its new connections
// are closed at once, while another address is still served.
TEST(MetricsServerTest, OnePeerGetsItsShareOfConnections) {
  Registry registry;
  MetricsServerConfig config = Loopback();
  config.max_connections_per_peer = 3;
  MetricsServer server(&registry, config);
  ASSERT_TRUE(server.Start().ok());
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawClient>(server.port(), "127.0.0.3"));
    ASSERT_TRUE(held.back()->connected());
    held.back()->Send("GET");  // Open, unfinished.
  }
  // Each held connection is accepted before the next is refused; the 4th from the same
  // address is closed without an answer even though its request is complete.
  RawClient fourth(server.port(), "127.0.0.3");
  ASSERT_TRUE(fourth.connected());
  fourth.Send("GET /livez HTTP/1.1\r\n\r\n");
  bool closed = false;
  EXPECT_EQ(fourth.ReadUntilClosed(5000, &closed), "");
  EXPECT_TRUE(closed);
  RawClient other(server.port(), "127.0.0.4");
  ASSERT_TRUE(other.Send("GET /livez HTTP/1.1\r\n\r\n"));
  std::string answer = other.ReadUntilClosed(5000, &closed);
  EXPECT_TRUE(closed);
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(answer, HasSubstr("\r\n\r\nok\n"));
}

// Requests the listener does not serve get a clear status and never a read of a body.
TEST(MetricsServerTest, RefusesBodiesOtherMethodsAndOversizedHeaders) {
  Registry registry;
  MetricsServer server(&registry, Loopback());
  ASSERT_TRUE(server.Start().ok());
  auto ask = [&](const std::string& request) {
    RawClient c(server.port());
    EXPECT_TRUE(c.Send(request));
    bool closed = false;
    std::string answer = c.ReadUntilClosed(5000, &closed);
    EXPECT_TRUE(closed);
    return answer.substr(0, answer.find("\r\n"));
  };
  EXPECT_EQ(ask("POST /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_EQ(ask("GET /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n"),
            "HTTP/1.1 413 Payload Too Large");
  EXPECT_EQ(ask("GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "HTTP/1.1 413 Payload Too Large");
  EXPECT_EQ(ask("GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n"),
            "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(ask("nonsense\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(ask("HEAD /livez HTTP/1.1\r\n\r\n"), "HTTP/1.1 200 OK");
}

// The listener binds loopback unless told otherwise (the deploy passes the pod IP).
TEST(MetricsServerTest, DefaultsToLoopback) { EXPECT_EQ(MetricsServerConfig{}.host, "127.0.0.1"); }

TEST(MetricsServerTest, InvalidConfigIsRejected) {
  Registry registry;
  MetricsServerConfig config = Loopback(70000);
  MetricsServer server(&registry, config);
  absl::Status status = server.Start();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("metrics.port = 70000"));
  config.port = 0;
  config.host = "";
  EXPECT_THAT(ValidateMetricsServerConfig(config).message(), HasSubstr("metrics.host is empty"));
  config.host = "127.0.0.1";
  config.max_connections_per_peer = 500;
  EXPECT_THAT(ValidateMetricsServerConfig(config).message(),
              HasSubstr("metrics.max_connections_per_peer = 500 is out of range"));
  config.max_connections_per_peer = 8;
  config.read_deadline_ms = 0;
  EXPECT_THAT(ValidateMetricsServerConfig(config).message(),
              HasSubstr("metrics.read_deadline_ms = 0"));
}

}  // namespace
}  // namespace metrics
}  // namespace ulysses
