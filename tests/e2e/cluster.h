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
// Rendezvous ports: see RendezvousPortsConfig(); gRPC and metrics listen on port 0.
//
// Binaries come from $ULYSSES_BIN_DIR. The engine is $ULYSSES_BIN_DIR/ulysses-train
// (ULYSSES_E2E_ENGINE_BIN overrides it, for debugging the harness only).
#ifndef ULYSSES_TESTS_E2E_CLUSTER_H_
#define ULYSSES_TESTS_E2E_CLUSTER_H_

#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/grpc/channel.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"
#include "tests/testing/poll.h"
#include "tests/testing/subprocess.h"
#include "worker/agent/child_supervisor.h"

namespace ulysses::e2e {

using std::chrono::milliseconds;
using std::chrono::seconds;

using ::ulysses::testing::BinDir;
using ::ulysses::testing::SourceDir;
std::string EngineBin();

using ::ulysses::testing::Result;

// The coordinator config lines of this test's rendezvous port block
// ($ULYSSES_E2E_RENDEZVOUS_PORTS=LO-HI, which tests/CMakeLists.txt's RENDEZVOUS_PORTS gives
// each ctest entry, so entries run at once never hand out one port); "" when unset (the
// coordinator's default range: run one such binary at a time by hand).
std::string RendezvousPortsConfig();

// Runs argv to completion (killed after `timeout`: exit_code -1, no test failure, so a caller
// may retry), capturing stdout and stderr; with the environment defaults ranks get.
Result RunCommand(const std::vector<std::string>& argv, milliseconds timeout);

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

  Result Ctl(std::vector<std::string> args, milliseconds timeout = seconds(30));
  // `describe job ID -o json` (null json on failure).
  nlohmann::json Describe(const std::string& id);
  // Submits configs/jobs/<file> with --set overrides; returns the job id ("" on failure).
  std::string Submit(const std::string& spec_path, const std::vector<std::string>& sets,
                     Result* result = nullptr);
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
  nlohmann::json job;
  ::ulysses::testing::PollUntil(
      [&] {
        job = Describe(id);
        return !job.is_null() && pred(job);
      },
      timeout, milliseconds(300));
  return job;
}

// The fixture of the end-to-end tests: skips where ulysses-train is not built, requires the
// control-plane binaries, starts the coordinator (unless told not to) and prints every
// process's output when a test failed.
class ClusterTest : public ::testing::Test {
 protected:
  explicit ClusterTest(bool start_coordinator = true) : start_coordinator_(start_coordinator) {}

  void SetUp() override {
    if (!::ulysses::testing::IsExecutable(EngineBin())) {
      GTEST_SKIP() << "ulysses-train is not built at " << EngineBin()
                   << ": the end-to-end tests need the real engine (build the ulysses-train "
                      "target)";
    }
    for (const char* bin : {"ulysses-coordinator", "ulysses-worker", "ulyssesctl"}) {
      ASSERT_TRUE(::ulysses::testing::IsExecutable(BinDir() + "/" + bin)) << bin << " not built";
    }
    if (!start_coordinator_) return;
    cluster_.StartCoordinator();
    ASSERT_NE(cluster_.address(), "127.0.0.1:0") << cluster_.Logs();
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_.Logs();
  }

  Cluster cluster_;

 private:
  bool start_coordinator_;
};

}  // namespace ulysses::e2e

#endif  // ULYSSES_TESTS_E2E_CLUSTER_H_
