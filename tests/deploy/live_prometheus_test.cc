// The dashboard and the alerts proven live: a real Prometheus (Debian package) scrapes a
// loopback coordinator and three workers (their --metrics-listen) with a scrape config
// equivalent to deploy/k8s/prometheus (static targets instead of pod discovery) and the
// project's rules, while a real two-stage job runs on the real engine and one of its
// workers is killed -9. Then every dashboard expression is queried through Prometheus'
// HTTP API (template variables substituted) and must return data, and the stalled-job
// and worker-lost alerts must go pending or firing in a variant of the rules with short
// windows. Skipped (with the reason) when prometheus or ulysses-train is missing.
// The rules are the PrometheusRule of deploy/k8s/components/monitoring (its spec). A second
// case injects a dead worker and a full state store and sees the heartbeat and
// store-read-only alerts fire.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/testing/files.h"
#include "tests/testing/net.h"
#include "tests/testing/poll.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::e2e {
namespace {

using nlohmann::json;
constexpr char kPrometheus[] = "/usr/bin/prometheus";

using ::ulysses::testing::ReadFile;

// The shipped rules with windows short enough for a test: the stall window 15m -> 5s,
// the recording interval 30s -> 2s, every `for:` -> 1s. Everything else (expressions,
// labels) as shipped.
std::string ShortWindowRules(const std::string& rules) {
  std::string out = absl::StrReplaceAll(
      rules, {{"[15m]", "[5s]"}, {"offset 15m", "offset 5s"}, {"interval: 30s", "interval: 2s"}});
  return std::regex_replace(out, std::regex("for: [0-9]+m"), "for: 1s");
}

// The rules file inside the monitoring component's PrometheusRule (its spec), with short
// windows (ShortWindowRules).
std::string PrometheusRuleRules() {
  YAML::Node rule =
      YAML::LoadFile(SourceDir() + "/deploy/k8s/components/monitoring/prometheus-rule.yaml");
  YAML::Emitter out;
  out << rule["spec"];
  return ShortWindowRules(out.c_str());
}

// The expression of the shipped alert `name` (deploy/k8s/prometheus/ulysses-rules.yml): the test
// queries what the rule evaluates, not a copy of it. "" when there is no such alert.
std::string AlertExpr(const std::string& name) {
  YAML::Node rules = YAML::LoadFile(SourceDir() + "/deploy/k8s/prometheus/ulysses-rules.yml");
  for (const YAML::Node& group : rules["groups"]) {
    for (const YAML::Node& rule : group["rules"]) {
      if (rule["alert"] && rule["alert"].as<std::string>() == name) {
        return rule["expr"].as<std::string>();
      }
    }
  }
  return "";
}

// A dashboard expression with Grafana's template variables substituted.
std::string Substitute(const std::string& expr) {
  return absl::StrReplaceAll(expr,
                             {{"$__rate_interval", "1m"}, {"${job_id}", ".*"}, {"$job_id", ".*"}});
}

class LivePrometheusTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (prometheus_pid_ > 0) {
      kill(prometheus_pid_, SIGTERM);
      waitpid(prometheus_pid_, nullptr, 0);
    }
  }

  // Starts Prometheus on `config`; returns its web port (0 on failure).
  int StartPrometheus(const std::string& config, const std::string& dir) {
    const int port = ::ulysses::testing::FreeLoopbackPort();
    log_ = dir + "/prometheus.log";
    prometheus_pid_ = fork();
    if (prometheus_pid_ == 0) {
      FILE* log = std::fopen(log_.c_str(), "w");
      if (log != nullptr) {
        dup2(fileno(log), STDOUT_FILENO);
        dup2(fileno(log), STDERR_FILENO);
      }
      const std::string config_flag = "--config.file=" + config;
      const std::string data_flag = "--storage.tsdb.path=" + dir + "/tsdb";
      const std::string web_flag = absl::StrCat("--web.listen-address=127.0.0.1:", port);
      execl(kPrometheus, kPrometheus, config_flag.c_str(), data_flag.c_str(), web_flag.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    return prometheus_pid_ > 0 ? port : 0;
  }

  // Prometheus with the shipped rules (short windows) scraping deploy/k8s/prometheus/
  // prometheus.yml's jobs with static loopback targets: the cluster's coordinator and, when
  // given, `worker_targets` ("'HOST:PORT'"). Returns its web port (0 on failure).
  int StartPrometheusOn(const Cluster& cluster, const std::vector<std::string>& worker_targets) {
    const std::string rules_path = cluster.dir() + "/ulysses-rules.yml";
    std::ofstream(rules_path) << PrometheusRuleRules();
    const std::string config_path = cluster.dir() + "/prometheus.yml";
    std::ofstream config(config_path);
    config << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
           << "rule_files: ['" << rules_path << "']\n"
           << "scrape_configs:\n"
           << "  - job_name: ulysses-coordinator\n"
           << "    static_configs: [{targets: ['127.0.0.1:" << cluster.metrics_port() << "']}]\n";
    if (!worker_targets.empty()) {
      config << "  - job_name: ulysses-worker\n"
             << "    static_configs: [{targets: [" << absl::StrJoin(worker_targets, ", ")
             << "]}]\n";
    }
    config.close();
    return StartPrometheus(config_path, cluster.dir());
  }

  // Polls the active alerts until every name in `want` is pending or firing (or `timeout`);
  // returns the names seen.
  std::set<std::string> WaitForAlerts(httplib::Client* client, const std::set<std::string>& want,
                                      seconds timeout) {
    std::set<std::string> seen;
    ::ulysses::testing::PollUntil(
        [&] {
          for (const auto& [name, state] : Alerts(client)) {
            if (state == "pending" || state == "firing") seen.insert(name);
          }
          bool all = true;
          for (const std::string& w : want) all = all && seen.count(w) > 0;
          return all;
        },
        timeout, milliseconds(250));
    return seen;
  }

  // The result array of an instant query (empty on any failure).
  json Query(httplib::Client* client, const std::string& promql) {
    auto res = client->Get("/api/v1/query", httplib::Params{{"query", promql}}, {});
    if (!res || res->status != 200) return json::array();
    json j = json::parse(res->body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return json::array();
    return j["data"]["result"];
  }

  // Alert name -> state ("pending" / "firing") of every active alert.
  std::multimap<std::string, std::string> Alerts(httplib::Client* client) {
    std::multimap<std::string, std::string> out;
    auto res = client->Get("/api/v1/alerts");
    if (!res || res->status != 200) return out;
    json j = json::parse(res->body, nullptr, false);
    if (j.is_discarded()) return out;
    for (const json& a : j["data"]["alerts"]) {
      out.emplace(a["labels"].value("alertname", ""), a.value("state", ""));
    }
    return out;
  }

  pid_t prometheus_pid_ = -1;
  std::string log_;
};

TEST_F(LivePrometheusTest, EveryDashboardExpressionAndTheFailureAlertsWorkLive) {
  if (!::ulysses::testing::IsExecutable(kPrometheus)) GTEST_SKIP() << kPrometheus << " missing";
  if (!::ulysses::testing::IsExecutable(EngineBin())) GTEST_SKIP() << EngineBin() << " not built";
  Cluster cluster;
  cluster.StartCoordinator(/*heartbeat_timeout_s=*/4);
  ASSERT_GT(cluster.metrics_port(), 0) << cluster.Logs();
  std::vector<std::string> names = {"w0", "w1", "w2"};
  std::vector<std::string> worker_targets;
  for (const std::string& name : names) {
    const int port = ::ulysses::testing::FreeLoopbackPort();
    worker_targets.push_back(absl::StrCat("'127.0.0.1:", port, "'"));
    cluster.StartWorker(
        name, 30, {"--metrics-listen", absl::StrCat("127.0.0.1:", port), "--peak-flops", "1e11"});
  }
  ASSERT_TRUE(cluster.WaitForIdleWorkers(3, seconds(60))) << cluster.Logs();

  const int web = StartPrometheusOn(cluster, worker_targets);
  ASSERT_GT(web, 0);
  httplib::Client prom("127.0.0.1", web);
  prom.set_connection_timeout(2);
  prom.set_read_timeout(10);

  // Stage 1 (sp 1) with an eval that measures needle accuracy; stage 2 on a group of 2
  // (all-to-all), long enough to be killed and recover. The CLI's "stage" is 1-based.
  const std::string id = cluster.Submit(
      SourceDir() + "/configs/jobs/tiny-demo.yaml",
      {"spec.stages[0].steps=3", "spec.stages[1].steps=400", "spec.stages[0].warmup_steps=1",
       "spec.stages[1].warmup_steps=1", "spec.checkpoint.every_steps=2",
       "spec.data.synthetic.validation_sequences=2"});
  ASSERT_FALSE(id.empty()) << cluster.Logs();
  auto stage_step = [](const json& j, int stage) {
    return j.is_object() && j.value("stage", -1) == stage ? j.value("step", int64_t{0}) : -1;
  };
  json job = cluster.WaitForJob(
      id, [&](const json& j) { return stage_step(j, 2) >= 3; }, seconds(300));
  ASSERT_GE(stage_step(job, 2), 3) << job.dump(2) << cluster.Logs();
  const std::string victim = Cluster::NameFromId(job["attempts"].back()["worker_ids"][1]);
  cluster.worker(victim)->Kill9();

  // Worker lost and the job stalled while it recovers: pending or firing.
  const std::set<std::string> seen =
      WaitForAlerts(&prom, {"UlyssesWorkerLost", "UlyssesTrainingStalled"}, seconds(60));
  EXPECT_TRUE(seen.count("UlyssesWorkerLost")) << ReadFile(log_);
  EXPECT_TRUE(seen.count("UlyssesTrainingStalled")) << ReadFile(log_);

  // Recovered on the spare worker and training again.
  const int64_t before = stage_step(job, 2);
  job = cluster.WaitForJob(
      id,
      [&](const json& j) {
        return j.value("state", "") == "RUNNING" && j.value("restarts", 0) >= 1 &&
               stage_step(j, 2) > before;
      },
      seconds(180));
  ASSERT_EQ(job.value("state", ""), "RUNNING") << job.dump(2) << cluster.Logs();

  // Every dashboard expression returns data while the job runs.
  const json dashboard = json::parse(
      ReadFile(SourceDir() + "/deploy/k8s/components/monitoring/ulysses-dashboard.json"));
  std::vector<std::string> exprs;
  for (const json& panel : dashboard["panels"]) {
    if (!panel.contains("targets")) continue;
    for (const json& t : panel["targets"]) exprs.push_back(Substitute(t["expr"]));
  }
  ASSERT_GT(exprs.size(), 30u);
  std::set<std::string> empty(exprs.begin(), exprs.end());
  ::ulysses::testing::PollUntil(
      [&] {
        for (auto it = empty.begin(); it != empty.end();) {
          it = Query(&prom, *it).empty() ? std::next(it) : empty.erase(it);
        }
        return empty.empty();
      },
      seconds(90), milliseconds(500));
  for (const std::string& expr : empty) ADD_FAILURE() << "no data: " << expr;
  EXPECT_EQ(Query(&prom, "up{job=\"ulysses-worker\"} == 1").size(), 2u);  // The victim is down.
  // The settings the alerts read: the job's checkpoint.every_steps (2), the coordinator's
  // heartbeat timeout (4 s).
  EXPECT_FALSE(Query(&prom, "ulysses_checkpoint_every_steps == 2").empty());
  EXPECT_FALSE(Query(&prom, "ulysses_heartbeat_timeout_seconds == 4").empty());

  // One stage numbering (docs/CONTRACTS.md, "Stage numbers"): the job runs its second stage
  // of 2, and the CLI's JSON, its events (progress and the first stage's evaluation) and the
  // Prometheus series all call it 2 and the first stage 1.
  job = cluster.Describe(id);
  EXPECT_EQ(job.value("stage", -1), 2) << job.dump(2);
  int progress_stage = -1, eval_stage = -1;
  for (const json& e : job["events"]) {
    if (e.value("type", "") == "progress") progress_stage = e.value("stage", -1);
    if (e.value("type", "") == "eval" && eval_stage < 0) eval_stage = e.value("stage", -1);
  }
  EXPECT_EQ(progress_stage, 2) << job["events"].dump(1);
  EXPECT_EQ(eval_stage, 1) << job["events"].dump(1);
  const std::string of_job = absl::StrCat("{job_id=\"", id, "\"}");
  const json stage_gauge = Query(&prom, "ulysses_train_stage" + of_job);
  ASSERT_EQ(stage_gauge.size(), 1u) << stage_gauge.dump();
  EXPECT_EQ(stage_gauge[0]["value"][1], "2") << stage_gauge.dump();
  const json eval_series = Query(&prom, "ulysses_eval_loss" + of_job);
  ASSERT_FALSE(eval_series.empty());
  EXPECT_EQ(eval_series[0]["metric"].value("stage", ""), "1") << eval_series.dump();
  ::ulysses::testing::PollUntil(  // the spare worker's rank series of stage 2, once scraped
      [&] { return !Query(&prom, "ulysses_rank_steps_total{stage=\"2\"}").empty(); }, seconds(30),
      milliseconds(250));
  const json rank_series = Query(&prom, "ulysses_rank_steps_total" + of_job);
  ASSERT_FALSE(rank_series.empty());
  for (const json& s : rank_series) {
    EXPECT_EQ(s["metric"].value("stage", ""), "2") << rank_series.dump();
  }
  (void)cluster.Ctl({"cancel", id});
}

// The heartbeat and store-read-only alerts of the PrometheusRule fire under injected faults:
// a worker killed -9 (its heartbeats stop; the coordinator's heartbeat_timeout_s is 8 s, the
// alert's threshold half of it), then a state store capped at 1 MiB filled by submissions
// until a write fails for I/O. No job runs (the worker is dead before the submissions).
TEST_F(LivePrometheusTest, HeartbeatAndStoreReadOnlyAlertsFireUnderInjectedFaults) {
  if (!::ulysses::testing::IsExecutable(kPrometheus)) GTEST_SKIP() << kPrometheus << " missing";
  // The agent checks for the engine at start (no job runs on it here).
  if (!::ulysses::testing::IsExecutable(EngineBin())) GTEST_SKIP() << EngineBin() << " not built";
  Cluster cluster;
  const std::string config = cluster.dir() + "/coordinator-extra.yaml";
  std::ofstream(config) << "state_max_bytes: 1048576\n";
  cluster.StartCoordinator(/*heartbeat_timeout_s=*/8, /*lost_after_s=*/0, {"--config", config});
  ASSERT_GT(cluster.metrics_port(), 0) << cluster.Logs();
  cluster.StartWorker("w0");
  ASSERT_TRUE(cluster.WaitForIdleWorkers(1, seconds(60))) << cluster.Logs();

  const int web = StartPrometheusOn(cluster, {});
  ASSERT_GT(web, 0);
  httplib::Client prom("127.0.0.1", web);
  prom.set_connection_timeout(2);
  prom.set_read_timeout(10);

  // Healthy first: the settings gauge and an on-time heartbeat are scraped, and the rules
  // have been evaluated on them (the heartbeat rule's own expression answers), silently.
  const std::string late = AlertExpr("UlyssesWorkerHeartbeatStale");
  ASSERT_FALSE(late.empty()) << "no UlyssesWorkerHeartbeatStale in ulysses-rules.yml";
  ::ulysses::testing::PollUntil(
      [&] {
        return !Query(&prom, "ulysses_heartbeat_timeout_seconds == 8").empty() &&
               !Query(&prom, "ulysses_worker_heartbeat_age_seconds").empty() &&
               !Query(&prom, "ulysses_store_writable == 1").empty();
      },
      seconds(60), milliseconds(250));
  ASSERT_FALSE(Query(&prom, "ulysses_worker_heartbeat_age_seconds").empty()) << ReadFile(log_);
  EXPECT_TRUE(Query(&prom, late).empty());
  for (const auto& [name, state] : Alerts(&prom)) {
    EXPECT_NE(name, "UlyssesWorkerHeartbeatStale") << state;
    EXPECT_NE(name, "UlyssesStoreReadOnly") << state;
  }

  // Fault 1: the worker dies without a word.
  cluster.worker("w0")->Kill9();
  std::set<std::string> seen =
      WaitForAlerts(&prom, {"UlyssesWorkerHeartbeatStale", "UlyssesWorkerLost"}, seconds(60));
  EXPECT_TRUE(seen.count("UlyssesWorkerHeartbeatStale")) << ReadFile(log_) << cluster.Logs();
  EXPECT_TRUE(seen.count("UlyssesWorkerLost")) << ReadFile(log_);

  // Fault 2: the state store fills (specs with a 60 KB label against a 1 MiB cap) until a
  // write fails.
  const std::string fill = cluster.dir() + "/fill.yaml";
  {
    std::string spec = ReadFile(SourceDir() + "/configs/jobs/tiny-demo.yaml");
    const std::string label = "    purpose: demo\n";
    ASSERT_NE(spec.find(label), std::string::npos);
    spec.replace(spec.find(label), label.size(),
                 "    purpose: \"" + std::string(60000, 'n') + "\"\n");
    std::ofstream(fill) << spec;
  }
  Result refused;
  bool full = false;
  for (int i = 0; i < 60 && !full; ++i) {
    full = cluster.Submit(fill, {absl::StrCat("metadata.name=fill-", i)}, &refused).empty();
  }
  ASSERT_TRUE(full) << "the capped store never filled";
  // ulyssesctl retries; the last answer is the coordinator refusing while read-only.
  EXPECT_NE((refused.out + refused.err).find("state store"), std::string::npos) << refused.err;
  seen = WaitForAlerts(&prom, {"UlyssesStoreReadOnly"}, seconds(60));
  EXPECT_TRUE(seen.count("UlyssesStoreReadOnly")) << ReadFile(log_) << cluster.Logs();
  EXPECT_FALSE(Query(&prom, "ulysses_store_writable == 0").empty());
}

}  // namespace
}  // namespace ulysses::e2e
