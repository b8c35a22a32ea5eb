// A real Ulysses control plane on loopback for end-to-end tests: the real
// ulysses-coordinator, real ulysses-worker processes running the real ulysses-train,
// and the real ulyssesctl. Processes are children of the test (ChildSupervisor:
// own process group, killed if the test dies) and are stopped in the destructor;
// the temp dir is removed.
//
// Credentials, as in production: the coordinator serves TLS with a server certificate
// from scripts/dev_certs.sh (tests/testing/certs.h) and verifies worker client
// certificates against the same CA; each worker presents its own certificate (mutual
// TLS: its identity). The coordinator runs without a token file, so it creates
// <state_dir>/admin.token; ulyssesctl uses it through a client config (config_path(),
// context "e2e": address, CA, token_file).
//
// Binaries come from $ULYSSES_BIN_DIR. The engine is $ULYSSES_BIN_DIR/ulysses-train
// (ULYSSES_E2E_ENGINE_BIN overrides it, for debugging the harness only).
#ifndef ULYSSES_TESTS_E2E_CLUSTER_H_
#define ULYSSES_TESTS_E2E_CLUSTER_H_

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/grpc/channel.h"
#include "nlohmann/json.hpp"
#include "worker/agent/child_supervisor.h"

namespace ulysses::e2e {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string BinDir();
std::string SourceDir();
std::string EngineBin();

struct CommandResult {
  int exit_code = -1;  // -1: timed out (killed).
  std::string out;
  std::string err;
};

// Runs argv to completion (killed after `timeout`), capturing stdout and stderr.
CommandResult RunCommand(const std::vector<std::string>& argv, milliseconds timeout);

// A long-running process with its output captured.
class Process {
 public:
  static std::unique_ptr<Process> Start(const std::vector<std::string>& argv);
  ~Process();
  pid_t pid() const { return child_->pid(); }
  bool Running() { return child_->Running(); }
  // SIGTERM (grace, then SIGKILL) and wait.
  agent::ChildResult Stop(milliseconds grace = milliseconds(5000));
  void Kill9();
  std::optional<agent::ChildResult> Wait(milliseconds timeout) { return child_->Wait(timeout); }
  std::string Output();
  // Waits until a captured line contains `text`; returns that line.
  std::optional<std::string> WaitForLine(const std::string& text, milliseconds timeout);

 private:
  std::unique_ptr<agent::ChildSupervisor> child_;
  std::mutex mu_;
  std::string output_;
};

class Cluster {
 public:
  Cluster();
  ~Cluster();

  // Starts (or restarts on the same port and state dir) the coordinator. `lost_after_s`:
  // 0 = heartbeat_timeout_s (no SUSPECT window: a silent worker is LOST at once), < 0 = the
  // coordinator's default (45 s). `extra`: more ulysses-coordinator flags.
  void StartCoordinator(double heartbeat_timeout_s = 4, double lost_after_s = 0,
                        const std::vector<std::string>& extra = {});
  void KillCoordinator();
  std::string address() const;
  // The coordinator's bound metrics port (from its ready line; 0 before).
  int metrics_port() const { return metrics_port_; }
  // The admin token file the coordinator created ("" until it exists).
  const std::string& token_file() const { return token_file_; }
  // The ulyssesctl config Ctl() uses (context "e2e": address, ca, token_file).
  std::string config_path() const { return dir_ + "/ulyssesctl.yaml"; }
  // For a test's own gRPC client: the address, the CA and the admin token.
  ChannelOptions Channel() const;

  // `extra`: more ulysses-worker flags (e.g. --metrics-listen).
  void StartWorker(const std::string& name, double grace_period_s = 30,
                   const std::vector<std::string>& extra = {});
  Process* worker(const std::string& name) { return workers_.at(name).get(); }
  // Worker name from a coordinator worker id ("w-<name>").
  static std::string NameFromId(const std::string& worker_id);

  CommandResult Ctl(std::vector<std::string> args, milliseconds timeout = seconds(30));
  // `describe job ID -o json` (null json on failure).
  nlohmann::json Describe(const std::string& id);
  // Submits configs/jobs/<file> with --set overrides; returns the job id ("" on failure).
  std::string Submit(const std::string& spec_path, const std::vector<std::string>& sets,
                     CommandResult* result = nullptr);
  // Polls describe until `pred(job)` holds; returns the last job json.
  template <typename Pred>
  nlohmann::json WaitForJob(const std::string& id, Pred pred, milliseconds timeout);
  // Polls until `n` workers are registered and IDLE.
  bool WaitForIdleWorkers(int n, milliseconds timeout);

  const std::string& dir() const { return dir_; }
  // The coordinator's --state-dir (default <dir>/state); a restore test points the next
  // StartCoordinator at another one.
  std::string state_dir() const { return state_dir_.empty() ? dir_ + "/state" : state_dir_; }
  void set_state_dir(const std::string& path) { state_dir_ = path; }
  // The coordinator's data root (--data-root): job specs may name data files under it.
  std::string data_root() const { return dir_ + "/data"; }
  // Rows of `table` in the coordinator's SQLite store (-1 if it cannot be read).
  int64_t StoreRows(const std::string& table) const;
  // Everything the processes printed, for failure messages.
  std::string Logs();

 private:
  std::string dir_;
  std::string state_dir_;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string token_file_;
  std::unique_ptr<Process> coordinator_;
  std::map<std::string, std::unique_ptr<Process>> workers_;
  std::string dead_logs_;
};

// Reading `describe job -o json`.
// The job's state ("" for a null or non-object json).
std::string JobState(const nlohmann::json& job);
// SUCCEEDED, FAILED or CANCELLED.
bool JobTerminal(const nlohmann::json& job);
// The job's final loss: the last stage's eval loss (deterministic given the weights), else
// its last training loss.
double JobFinalLoss(const nlohmann::json& job);

template <typename Pred>
nlohmann::json Cluster::WaitForJob(const std::string& id, Pred pred, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  nlohmann::json job;
  while (std::chrono::steady_clock::now() < deadline) {
    job = Describe(id);
    if (!job.is_null() && pred(job)) return job;
    std::this_thread::sleep_for(milliseconds(300));
  }
  return job;
}

}  // namespace ulysses::e2e

#endif  // ULYSSES_TESTS_E2E_CLUSTER_H_
