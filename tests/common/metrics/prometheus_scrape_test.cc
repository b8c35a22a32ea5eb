// End to end with the real Prometheus server: it scrapes our MetricsServer over
// loopback and its query API must see the target up and our counter's value.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/file_tree.h"
#include "common/metrics/build_info.h"
#include "common/metrics/metrics_server.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"
#include "tests/testing/net.h"

namespace ulysses {
namespace metrics {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";

// Starts a child process; its stdout/stderr go to `log_path`.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_path) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* log = std::fopen(log_path.c_str(), "w");
    if (log != nullptr) {
      dup2(fileno(log), STDOUT_FILENO);
      dup2(fileno(log), STDERR_FILENO);
    }
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const std::string& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// SIGTERM, then SIGKILL if it has not exited within `grace`.
void Terminate(pid_t pid, std::chrono::seconds grace) {
  if (pid <= 0) {
    return;
  }
  kill(pid, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

using ::ulysses::testing::ReadFile;

// Runs an instant query; returns the value of the single result, or "" if the
// query failed or did not return exactly one series.
std::string QueryOne(httplib::Client* client, const std::string& promql) {
  auto res = client->Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) {
    return "";
  }
  auto json = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || json.value("status", "") != "success") {
    return "";
  }
  const auto& result = json["data"]["result"];
  if (!result.is_array() || result.size() != 1) {
    return "";
  }
  return result[0]["value"][1].get<std::string>();
}

class PrometheusScrapeTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Terminate(prometheus_pid_, std::chrono::seconds(10));
    if (!dir_.empty()) {
      ulysses::RemoveTree(dir_).IgnoreError();
    }
  }

  pid_t prometheus_pid_ = -1;
  std::string dir_;
};

TEST_F(PrometheusScrapeTest, PrometheusScrapesOurServer) {
  if (!::ulysses::testing::IsExecutable(kPrometheus)) {
    GTEST_SKIP() << kPrometheus << " missing (Debian prometheus)";
  }
  // A counter, a histogram and the build info, with values Prometheus must read back.
  // (The coordinator's real catalogue: coordinator_grpc_test.)
  Registry registry;
  ASSERT_TRUE(RegisterBuildInfo(&registry).ok());
  auto tokens_family = registry.AddCounter("ulysses_train_tokens_total", "Tokens.", {"job_id"});
  auto wait = registry.AddHistogram("ulysses_gang_wait_seconds", "Gang wait.", {},
                                    ExponentialBuckets(0.5, 2, 12));
  ASSERT_TRUE(tokens_family.ok() && wait.ok());
  (*tokens_family)->WithLabels({"j1"})->Increment(12345);
  (*wait)->WithLabels()->Observe(3.5);
  MetricsServerConfig config;
  config.host = "127.0.0.1";
  config.port = 0;
  MetricsServer server(&registry, config);
  ASSERT_TRUE(server.Start().ok());

  char tmpl[] = "/tmp/ulysses_prometheus_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  dir_ = tmpl;
  const char* source_dir = std::getenv("ULYSSES_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "run through ctest (sets ULYSSES_SOURCE_DIR)";
  const std::string rules_path =
      std::string(source_dir) + "/deploy/k8s/prometheus/ulysses-rules.yml";
  const std::string config_path = dir_ + "/prometheus.yml";
  std::ofstream(config_path) << "global:\n"
                                "  scrape_interval: 1s\n"
                                "  evaluation_interval: 1s\n"
                                "rule_files: ['"
                             << rules_path
                             << "']\n"
                                "scrape_configs:\n"
                                "  - job_name: ulysses-coordinator\n"
                                "    static_configs:\n"
                                "      - targets: ['"
                             << server.address() << "']\n";
  const int web_port = ::ulysses::testing::FreeLoopbackPort();
  ASSERT_GT(web_port, 0);
  const std::string log_path = dir_ + "/prometheus.log";
  prometheus_pid_ =
      Spawn({kPrometheus, "--config.file=" + config_path, "--storage.tsdb.path=" + dir_ + "/data",
             "--web.listen-address=127.0.0.1:" + std::to_string(web_port)},
            log_path);
  ASSERT_GT(prometheus_pid_, 0);

  httplib::Client client("127.0.0.1", web_port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  std::string up, tokens, build;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(45);
  while (std::chrono::steady_clock::now() < deadline) {
    up = QueryOne(&client, "up{job=\"ulysses-coordinator\"}");
    tokens = QueryOne(&client, "ulysses_train_tokens_total{job_id=\"j1\"}");
    if (up == "1" && tokens == "12345") {
      break;
    }
    ASSERT_NE(waitpid(prometheus_pid_, nullptr, WNOHANG), prometheus_pid_)
        << "prometheus exited early:\n"
        << ReadFile(log_path);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(up, "1") << ReadFile(log_path);
  EXPECT_EQ(tokens, "12345");
  // Histograms are usable in PromQL as exported (le labels parse as numbers).
  EXPECT_EQ(QueryOne(&client, "histogram_quantile(1, ulysses_gang_wait_seconds_bucket)"), "4");
  EXPECT_EQ(QueryOne(&client, "count(ulysses_build_info)"), "1");

  // The shipped alert rules load into the real server and evaluate against our real
  // exposition without errors (health "ok" once evaluated; the alerting group runs
  // every evaluation_interval = 1 s).
  int alert_rules = 0, healthy = 0;
  std::string last_error;
  const auto rules_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < rules_deadline) {
    auto res = client.Get("/api/v1/rules?type=alert");
    if (res && res->status == 200) {
      auto json = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
      alert_rules = healthy = 0;
      if (!json.is_discarded()) {
        for (const auto& group : json["data"]["groups"]) {
          for (const auto& rule : group["rules"]) {
            ++alert_rules;
            if (rule.value("health", "") == "ok") {
              ++healthy;
            }
            if (!rule.value("lastError", "").empty()) {
              last_error = rule["lastError"].get<std::string>();
            }
          }
        }
      }
      if (alert_rules > 0 && healthy == alert_rules) {
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(alert_rules, 12) << ReadFile(log_path);
  EXPECT_EQ(healthy, alert_rules) << last_error;
}

}  // namespace
}  // namespace metrics
}  // namespace ulysses
