#include "tests/e2e/cluster.h"
#include "common/file_tree.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/process/cpu_share.h"
#include "sqlite3.h"
#include "tests/testing/certs.h"

namespace ulysses::e2e {

namespace fs = std::filesystem;

std::string EngineBin() {
  const char* over = std::getenv("ULYSSES_E2E_ENGINE_BIN");
  if (over != nullptr && *over != '\0') return over;
  return BinDir() + "/ulysses-train";
}

Result RunCommand(const std::vector<std::string>& argv, milliseconds timeout) {
  return testing::Run(argv, {.env_defaults = process::RankEnvironmentDefaults(),
                             .timeout = timeout,
                             .timeout_fails = false});
}

std::unique_ptr<Process> Process::Start(const std::vector<std::string>& argv) {
  auto process = std::unique_ptr<Process>(new Process());
  Process* p = process.get();
  agent::ChildCallbacks cb;
  cb.on_log = [p](const std::string&, const std::string& line) {
    std::lock_guard<std::mutex> lock(p->mu_);
    p->output_ += line + "\n";
  };
  auto child = agent::ChildSupervisor::Start(argv, "", std::move(cb));
  if (!child.ok()) return nullptr;
  p->child_ = std::move(*child);
  return process;
}

Process::~Process() {
  if (child_ && child_->Running()) Stop(milliseconds(3000));
}

agent::ChildResult Process::Stop(milliseconds grace) {
  child_->Stop(contract::StopRequest::kAbort, grace);
  return child_->Wait();
}

void Process::Kill9() {
  kill(child_->pid(), SIGKILL);
  child_->Wait();
}

std::string Process::Output() {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
}

std::optional<std::string> Process::WaitForLine(const std::string& text, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const size_t at = output_.find(text);
      if (at != std::string::npos) {
        const size_t start = output_.rfind('\n', at);
        const size_t end = output_.find('\n', at);
        return output_.substr(start == std::string::npos ? 0 : start + 1,
                              end == std::string::npos
                                  ? std::string::npos
                                  : end - (start == std::string::npos ? 0 : start + 1));
      }
    }
    if (!child_->Running()) return std::nullopt;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return std::nullopt;
}

Cluster::Cluster() {
  char tmpl[] = "/tmp/ulysses-e2e-XXXXXX";
  dir_ = mkdtemp(tmpl) != nullptr ? tmpl : "/tmp/ulysses-e2e";
  std::error_code ec;
  fs::create_directories(data_root(), ec);
}

Cluster::~Cluster() {
  workers_.clear();  // Workers first: their children get SIGTERM through them.
  coordinator_.reset();
  if (std::getenv("ULYSSES_E2E_KEEP") == nullptr) ulysses::RemoveTree(dir_).IgnoreError();
}

std::string RendezvousPortsConfig() {
  const char* env = std::getenv("ULYSSES_E2E_RENDEZVOUS_PORTS");
  if (env == nullptr || *env == '\0') return "";
  int lo = 0, hi = 0;
  if (std::sscanf(env, "%d-%d", &lo, &hi) != 2 || lo < 1 || hi > 65535 || lo > hi) {
    ADD_FAILURE() << "ULYSSES_E2E_RENDEZVOUS_PORTS=" << env << ": want LO-HI, e.g. 29500-29599";
    return "";
  }
  return absl::StrCat("rendezvous_port_min: ", lo, "\nrendezvous_port_max: ", hi, "\n");
}

void Cluster::StartCoordinator(double heartbeat_timeout_s, double lost_after_s,
                               const std::vector<std::string>& extra) {
  if (coordinator_) dead_logs_ += "=== coordinator (previous)\n" + coordinator_->Output();
  const testing::DevCerts& certs = testing::TestCerts();
  std::vector<std::string> argv = {BinDir() + "/ulysses-coordinator",
                                   "--listen",
                                   absl::StrCat("127.0.0.1:", port_),
                                   "--state-dir",
                                   state_dir(),
                                   "--metrics-listen",
                                   "127.0.0.1:0",
                                   "--heartbeat-timeout-s",
                                   absl::StrCat(heartbeat_timeout_s),
                                   "--tls-cert",
                                   certs.server_cert,
                                   "--tls-key",
                                   certs.server_key,
                                   "--tls-client-ca",
                                   certs.ca,
                                   "--data-root",
                                   data_root()};
  if (lost_after_s >= 0) {
    argv.push_back("--lost-after-s");
    argv.push_back(absl::StrCat(lost_after_s > 0 ? lost_after_s : heartbeat_timeout_s));
  }
  std::vector<std::string> rest = extra;
  const std::string ports = RendezvousPortsConfig();
  if (!ports.empty()) {
    // The test's own --config, if any, with the rendezvous block added to it.
    std::string config_text;
    for (size_t i = 0; i + 1 < rest.size(); ++i) {
      if (rest[i] != "--config") continue;
      std::ifstream in(rest[i + 1]);
      config_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (!config_text.empty() && config_text.back() != '\n') config_text += "\n";
      rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(i),
                 rest.begin() + static_cast<std::ptrdiff_t>(i) + 2);
      break;
    }
    const std::string path = dir_ + "/coordinator.yaml";
    std::ofstream(path) << config_text << ports;
    argv.insert(argv.end(), {"--config", path});
  }
  argv.insert(argv.end(), rest.begin(), rest.end());
  coordinator_ = Process::Start(argv);
  if (!coordinator_) return;
  auto line = coordinator_->WaitForLine("listening grpc=", seconds(30));
  if (!line) return;
  const size_t at = line->find("grpc=");
  port_ = std::atoi(line->c_str() + at + 5);
  const size_t metrics_at = line->find("metrics=");
  if (metrics_at != std::string::npos) metrics_port_ = std::atoi(line->c_str() + metrics_at + 8);
  // The admin token a coordinator without a token file creates.
  token_file_ = state_dir() + "/admin.token";
  std::ofstream config(config_path());
  config << "current-context: e2e\ncontexts:\n  - name: e2e\n    server: " << address()
         << "\n    ca: " << certs.ca << "\n    token_file: " << token_file_ << "\n";
}

ChannelOptions Cluster::Channel() const {
  ChannelOptions options;
  options.server = address();
  options.ca_file = testing::TestCerts().ca;
  if (!token_file_.empty()) {
    std::ifstream in(token_file_);
    std::getline(in, options.token);
  }
  return options;
}

void Cluster::KillCoordinator() {
  if (!coordinator_) return;
  coordinator_->Kill9();
}

std::string Cluster::address() const { return absl::StrCat("127.0.0.1:", port_); }

void Cluster::StartWorker(const std::string& name, double grace_period_s,
                          const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {BinDir() + "/ulysses-worker",
                                   "--coordinator",
                                   address(),
                                   "--name",
                                   name,
                                   "--device",
                                   "cpu",
                                   "--work-dir",
                                   dir_ + "/workers/" + name,
                                   "--engine-bin",
                                   EngineBin(),
                                   "--grace-period-s",
                                   absl::StrCat(grace_period_s)};
  // Mutual TLS: the certificate named after the worker is its identity (no token).
  const testing::DevCerts& certs = testing::TestCerts({name});
  argv.insert(argv.end(),
              {"--ca", certs.ca, "--cert", certs.WorkerCert(name), "--key", certs.WorkerKey(name)});
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto process = Process::Start(argv);
  workers_[name] = std::move(process);
}

std::string Cluster::NameFromId(const std::string& worker_id) {
  return worker_id.rfind("w-", 0) == 0 ? worker_id.substr(2) : worker_id;
}

Result Cluster::Ctl(std::vector<std::string> args, milliseconds timeout) {
  args.insert(args.begin(), {BinDir() + "/ulyssesctl", "--config", config_path()});
  return RunCommand(args, timeout);
}

nlohmann::json Cluster::Describe(const std::string& id) {
  Result r = Ctl({"describe", "job", id, "-o", "json"});
  if (r.exit_code != 0) return nullptr;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

std::string Cluster::Submit(const std::string& spec_path, const std::vector<std::string>& sets,
                            Result* result) {
  // Tests run jobs of one spec side by side (a victim and its reference): the name of a
  // live job is not unique for them (tests/coordinator covers the refusal).
  std::vector<std::string> args = {"submit", "-f", spec_path, "--allow-duplicate"};
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  Result r = Ctl(args);
  if (result != nullptr) *result = r;
  if (r.exit_code != 0) return "";
  std::string id = r.out;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

bool Cluster::WaitForIdleWorkers(int n, milliseconds timeout) {
  return testing::PollUntil(
      [&] {
        Result r = Ctl({"get", "workers", "-o", "json"});
        nlohmann::json list = nlohmann::json::parse(r.out, nullptr, false);
        if (r.exit_code != 0 || !list.is_array()) return false;
        int idle = 0;
        for (const auto& w : list) idle += w.value("state", "") == "IDLE";
        return idle >= n;
      },
      timeout, milliseconds(200));
}

int64_t Cluster::StoreRows(const std::string& table) const {
  sqlite3* db = nullptr;
  const std::string path = state_dir() + "/coordinator.db";
  int64_t rows = -1;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    const std::string sql = "SELECT COUNT(*) FROM " + table;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      rows = sqlite3_column_int64(stmt, 0);
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db);
  return rows;
}

std::string Cluster::Logs() {
  std::string all = dead_logs_;
  if (coordinator_) all += "=== coordinator\n" + coordinator_->Output();
  for (auto& [name, w] : workers_) {
    if (w) all += "=== worker " + name + "\n" + w->Output();
  }
  if (all.size() > 60000) all = "...\n" + all.substr(all.size() - 60000);
  return all;
}

std::string JobState(const nlohmann::json& job) {
  return job.is_object() ? job.value("state", "") : "";
}

bool JobTerminal(const nlohmann::json& job) {
  const std::string s = JobState(job);
  return s == "SUCCEEDED" || s == "FAILED" || s == "CANCELLED";
}

double JobFinalLoss(const nlohmann::json& job) {
  const nlohmann::json& last = job["stages"].back();
  const double eval = last.value("eval_loss", 0.0);
  return eval > 0 ? eval : last.value("loss", 0.0);
}

}  // namespace ulysses::e2e
