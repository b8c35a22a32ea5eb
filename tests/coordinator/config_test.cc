// CoordinatorConfig: the security settings (TLS files, client CA, token file, --insecure)
// and the loopback rule for plaintext, each problem named with its field and fix.
#include <cmath>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/config.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::coordinator {
namespace {

using ::ulysses::testing::TempDir;

CoordinatorConfig Base(const TempDir& dir) {
  CoordinatorConfig c;
  c.state_dir = dir.path();
  return c;
}

TEST(ConfigTest, DefaultListenIsLoopback) {
  TempDir dir;
  CoordinatorConfig c = Base(dir);
  EXPECT_EQ(c.listen, "127.0.0.1:50051");
  EXPECT_TRUE(ValidateAndFinalize(&c).ok());
}

TEST(ConfigTest, PlaintextOffLoopbackNeedsInsecureOrTls) {
  TempDir dir;
  const std::string pem = dir.Sub("x.pem");
  std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\n";
  CoordinatorConfig c = Base(dir);
  c.listen = "0.0.0.0:50051";
  absl::Status s = ValidateAndFinalize(&c);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "listen: \"0.0.0.0:50051\" is not a loopback address "
                                "and TLS is off"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--insecure")) << s;
  c = Base(dir);
  c.listen = "[::]:50051";
  c.insecure = true;
  EXPECT_TRUE(ValidateAndFinalize(&c).ok());
  c = Base(dir);
  c.listen = "0.0.0.0:50051";
  c.tls_cert = pem;
  c.tls_key = pem;
  EXPECT_TRUE(ValidateAndFinalize(&c).ok());
}

TEST(ConfigTest, TlsFilesComeInPairsExistAndTheClientCaNeedsTls) {
  TempDir dir;
  const std::string pem = dir.Sub("x.pem");
  std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\n";
  CoordinatorConfig c = Base(dir);
  c.tls_cert = pem;
  absl::Status s = ValidateAndFinalize(&c);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "tls_cert/tls_key:")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "set both for TLS, or neither")) << s;

  c = Base(dir);
  c.tls_client_ca = pem;
  s = ValidateAndFinalize(&c);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "tls_client_ca: \"" + pem + "\" needs TLS")) << s;

  c = Base(dir);
  c.tls_cert = dir.Sub("missing.pem");
  c.tls_key = pem;
  c.token_file = dir.Sub("missing.yaml");
  s = ValidateAndFinalize(&c);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(
      absl::StrContains(s.message(), "tls_cert: \"" + dir.Sub("missing.pem") + "\" cannot be read"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "token_file: \"" + dir.Sub("missing.yaml") + "\" cannot be read"))
      << s;
}

TEST(ConfigTest, SecurityKeysLoadFromYaml) {
  CoordinatorConfig c;
  ASSERT_TRUE(ApplyConfigYaml("tls_cert: /a.pem\ntls_key: /a.key\ntls_client_ca: /ca.pem\n"
                              "token_file: /t.yaml\ninsecure: true\n",
                              &c)
                  .ok());
  EXPECT_EQ(c.tls_cert, "/a.pem");
  EXPECT_EQ(c.tls_key, "/a.key");
  EXPECT_EQ(c.tls_client_ca, "/ca.pem");
  EXPECT_EQ(c.token_file, "/t.yaml");
  EXPECT_TRUE(c.insecure);
  EXPECT_FALSE(ApplyConfigYaml("insecure: maybe\n", &c).ok());
}

TEST(ConfigTest, MetricsDefaultToLoopbackAndJobSeriesParses) {
  CoordinatorConfig c;
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:9091");  // Not every interface.
  EXPECT_EQ(c.metrics_job_series, JobSeries::kAll);
  ASSERT_TRUE(ApplyConfigYaml("metrics: {job_series: labels}\n", &c).ok());
  EXPECT_EQ(c.metrics_job_series, JobSeries::kLabels);
  ASSERT_TRUE(ApplyConfigYaml("metrics: {job_series: none}\n", &c).ok());
  EXPECT_EQ(c.metrics_job_series, JobSeries::kNone);
  absl::Status bad = ApplyConfigYaml("metrics: {job_series: some}\n", &c);
  EXPECT_TRUE(absl::StrContains(bad.message(), "metrics.job_series: \"some\" is not")) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "use all")) << bad;
  absl::Status unknown = ApplyConfigYaml("metrics: {jobs: all}\n", &c);
  EXPECT_TRUE(absl::StrContains(unknown.message(), "metrics.jobs: unknown setting")) << unknown;
  EXPECT_EQ(c.metrics_job_series, JobSeries::kNone);  // A refused value changes nothing.
}

TEST(ConfigTest, TenantStreamCapDefaultsToAQuarterAndStaysBetweenTheOthers) {
  TempDir dir;
  CoordinatorConfig c = Base(dir);
  ASSERT_TRUE(ValidateAndFinalize(&c).ok());
  EXPECT_EQ(c.max_streams_per_tenant, 1024);  // 4096 / 4.
  CoordinatorConfig above = Base(dir);
  above.max_streams_per_tenant = 5000;
  absl::Status s = ValidateAndFinalize(&above);
  EXPECT_TRUE(absl::StrContains(s.message(), "max_streams_per_tenant: 5000 is out of range")) << s;
}

TEST(ConfigTest, StreamCapsAreBoundedAndTheTotalCoversOneIdentity) {
  TempDir dir;
  CoordinatorConfig c = Base(dir);
  ASSERT_TRUE(ApplyConfigYaml("max_streams_per_identity: 8\nmax_streams: 100\n", &c).ok());
  EXPECT_TRUE(ValidateAndFinalize(&c).ok());
  EXPECT_EQ(c.max_streams_per_identity, 8);
  EXPECT_EQ(c.max_streams, 100);

  CoordinatorConfig zero = Base(dir);
  zero.max_streams_per_identity = 0;
  absl::Status s = ValidateAndFinalize(&zero);
  EXPECT_TRUE(absl::StrContains(s.message(), "max_streams_per_identity: 0 is out of range")) << s;

  CoordinatorConfig below = Base(dir);
  below.max_streams_per_identity = 64;
  below.max_streams = 10;
  s = ValidateAndFinalize(&below);
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "max_streams: 10 is out of range (use "
                                "max_streams_per_identity (64) .. 100000"))
      << s;
}

TEST(ConfigTest, SessionQueuesAreReadAndBounded) {
  TempDir dir;
  CoordinatorConfig c = Base(dir);
  EXPECT_EQ(c.session_queues, 8);
  ASSERT_TRUE(ApplyConfigYaml("session_queues: 3\n", &c).ok());
  EXPECT_TRUE(ValidateAndFinalize(&c).ok());
  EXPECT_EQ(c.session_queues, 3);
  for (int64_t bad : {0, 65}) {
    CoordinatorConfig out = Base(dir);
    out.session_queues = bad;
    absl::Status s = ValidateAndFinalize(&out);
    EXPECT_TRUE(absl::StrContains(
        s.message(), absl::StrCat("session_queues: ", bad, " is out of range (use 1..64")))
        << s;
  }
}

TEST(ConfigTest, HeartbeatIntervalGrowsWithTheClusterUpToHalfTheTimeoutAndSuspicionWithIt) {
  TempDir dir;
  CoordinatorConfig c = Base(dir);
  ASSERT_TRUE(ValidateAndFinalize(&c).ok());
  EXPECT_EQ(c.max_heartbeats_per_s, 5000);
  EXPECT_DOUBLE_EQ(c.heartbeat_interval_s, 2.5);  // heartbeat_timeout_s 10 / 4.
  EXPECT_DOUBLE_EQ(HeartbeatIntervalFor(c, 0), 2.5);
  EXPECT_DOUBLE_EQ(HeartbeatIntervalFor(c, 12500), 2.5);  // 5,000 a second at 2.5 s.
  EXPECT_DOUBLE_EQ(HeartbeatIntervalFor(c, 20000), 4.0);
  EXPECT_DOUBLE_EQ(HeartbeatIntervalFor(c, 25000), 5.0);
  EXPECT_DOUBLE_EQ(HeartbeatIntervalFor(c, 200000), 5.0);  // Capped: two within the timeout.
  // SUSPECT after heartbeat_timeout_s, or three told intervals when longer.
  EXPECT_EQ(SuspectAfterMs(c, 0), 10000);     // Not told (recovered after a restart).
  EXPECT_EQ(SuspectAfterMs(c, 2500), 10000);  // 3 x 2.5 s is shorter.
  EXPECT_EQ(SuspectAfterMs(c, 5000), 15000);  // The cap: one heartbeat may go missing.
  c.max_heartbeats_per_s = 0;
  EXPECT_DOUBLE_EQ(HeartbeatIntervalFor(c, 25000), 2.5);  // Off: fixed.
  ASSERT_TRUE(ApplyConfigYaml("max_heartbeats_per_s: 800\n", &c).ok());
  EXPECT_EQ(c.max_heartbeats_per_s, 800);
  for (double bad : {-1.0, 0.5, 2e7}) {
    CoordinatorConfig out = Base(dir);
    out.max_heartbeats_per_s = bad;
    absl::Status s = ValidateAndFinalize(&out);
    EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("max_heartbeats_per_s: ", bad,
                                                            " is out of range (use 1 .. 10000000")))
        << s;
  }
}

// The SUSPECT window: heartbeat_timeout_s is no longer capped at 10 s, lost_after_s
// (default 45: a 30 s blip stays below it) must cover it, and a bad pair names the field,
// the value and the fix.
TEST(ConfigTest, LostAfterCoversTheHeartbeatTimeoutWhichIsNoLongerCappedAtTenSeconds) {
  TempDir dir;
  CoordinatorConfig c = Base(dir);
  EXPECT_EQ(c.heartbeat_timeout_s, 10);
  EXPECT_EQ(c.lost_after_s, 45);
  EXPECT_GT(c.lost_after_s, 30 + c.heartbeat_timeout_s / 4);
  ASSERT_TRUE(ApplyConfigYaml("heartbeat_timeout_s: 20\nlost_after_s: 120\n", &c).ok());
  EXPECT_TRUE(ValidateAndFinalize(&c).ok());
  EXPECT_EQ(c.heartbeat_timeout_s, 20);
  EXPECT_EQ(c.lost_after_s, 120);

  CoordinatorConfig equal = Base(dir);  // No SUSPECT window: the old behaviour.
  equal.heartbeat_timeout_s = 4;
  equal.lost_after_s = 4;
  EXPECT_TRUE(ValidateAndFinalize(&equal).ok());

  CoordinatorConfig below = Base(dir);
  below.heartbeat_timeout_s = 30;
  below.lost_after_s = 20;
  absl::Status s = ValidateAndFinalize(&below);
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "lost_after_s: 20 is out of range (use heartbeat_timeout_s (30) "
                                ".. 86400 seconds"))
      << s;

  CoordinatorConfig huge = Base(dir);
  huge.lost_after_s = 100000;
  s = ValidateAndFinalize(&huge);
  EXPECT_TRUE(absl::StrContains(s.message(), "lost_after_s: 100000 is out of range")) << s;

  CoordinatorConfig zero = Base(dir);
  zero.heartbeat_timeout_s = 0;
  s = ValidateAndFinalize(&zero);
  EXPECT_TRUE(absl::StrContains(s.message(), "heartbeat_timeout_s: 0 is out of range")) << s;
}

// reconnect_window_s: 0 takes the later of 2 x heartbeat_timeout_s and lost_after_s (jobs
// wait as long as their workers may take to come back), a YAML value is kept, and a value
// out of 0..86400 (or not a number) names the field, the value and the range.
TEST(ConfigTest, ReconnectWindowDefaultsToTheWorkersOwnGraceAndIsBounded) {
  TempDir dir;
  CoordinatorConfig c = Base(dir);
  c.heartbeat_timeout_s = 10;
  c.lost_after_s = 45;
  ASSERT_TRUE(ValidateAndFinalize(&c).ok());
  EXPECT_EQ(c.reconnect_window_s, 45);
  CoordinatorConfig no_suspect_window = Base(dir);
  no_suspect_window.heartbeat_timeout_s = 10;
  no_suspect_window.lost_after_s = 10;
  ASSERT_TRUE(ValidateAndFinalize(&no_suspect_window).ok());
  EXPECT_EQ(no_suspect_window.reconnect_window_s, 20);
  CoordinatorConfig set = Base(dir);
  ASSERT_TRUE(ApplyConfigYaml("reconnect_window_s: 300\n", &set).ok());
  ASSERT_TRUE(ValidateAndFinalize(&set).ok());
  EXPECT_EQ(set.reconnect_window_s, 300);
  for (double bad : {-1.0, 100000.0, std::nan("")}) {
    CoordinatorConfig b = Base(dir);
    b.reconnect_window_s = bad;
    absl::Status s = ValidateAndFinalize(&b);
    EXPECT_TRUE(absl::StrContains(s.message(), "reconnect_window_s: ")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "is out of range (use 0 .. 86400 seconds")) << s;
  }
}

}  // namespace
}  // namespace ulysses::coordinator
