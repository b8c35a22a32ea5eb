#include "common/metrics/metrics_server.h"

#include <string>

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
}

}  // namespace
}  // namespace metrics
}  // namespace ulysses
