#include "worker/engine/cmd/launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

#include "common/contract/exit.h"
#include "common/logging.h"
#include "common/process/cpu_share.h"
#include "common/process/process.h"
#include "common/stop.h"

namespace ulysses::engine::train {
namespace {

// A failed rank leaves its peers blocked in collectives: they get this long after
// SIGTERM before SIGKILL.
constexpr std::chrono::seconds kPeerFailureGrace{10};
constexpr std::chrono::milliseconds kPollInterval{20};

struct Rank {
  pid_t pid;
  process::KillTiers tiers;
  std::optional<contract::ProcessExit> exit;  // Set once reaped.
};

}  // namespace

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "ulysses-train";
  buf[n] = '\0';
  return buf;
}

int RunProcesses(const std::vector<std::vector<std::string>>& argvs) {
  InstallStopSignalHandlers();
  process::SpawnOptions options;
  options.exec_error_prefix = "ulysses-train: exec failed";
  options.env_defaults = process::RankEnvironmentDefaults();
  std::vector<Rank> ranks;
  for (const auto& argv : argvs) {
    absl::StatusOr<pid_t> pid = process::Spawn(argv, options);
    if (!pid.ok()) {
      ULOG(ERROR) << "cannot start rank " << ranks.size() << ": " << pid.status().message();
      for (Rank& r : ranks) kill(r.pid, SIGKILL);
      for (Rank& r : ranks) waitpid(r.pid, nullptr, 0);
      return contract::kExitFailure;
    }
    ranks.push_back(Rank{*pid, process::KillTiers(*pid), std::nullopt});
  }
  size_t running = ranks.size();
  bool failed = false;
  bool forwarded = false;
  while (running > 0) {
    for (Rank& r : ranks) {
      if (r.exit.has_value()) continue;
      int status = 0;
      if (waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.exit = process::ProcessExitOf(status);
      --running;
      const contract::RankOutcome outcome =
          contract::OutcomeOf(*r.exit, contract::StopRequest::kNone);
      if (!failed && outcome != contract::RankOutcome::kSucceeded &&
          outcome != contract::RankOutcome::kPreempted) {
        failed = true;
        for (Rank& peer : ranks) {
          if (!peer.exit.has_value()) peer.tiers.Stop(kPeerFailureGrace);
        }
      }
    }
    if (StopRequested() && !forwarded) {
      forwarded = true;  // Preemption: the ranks agree to stop and checkpoint; no deadline.
      for (Rank& r : ranks) {
        if (!r.exit.has_value()) r.tiers.Stop(std::nullopt);
      }
    }
    for (Rank& r : ranks) {
      if (!r.exit.has_value()) r.tiers.Enforce();
    }
    if (running > 0) std::this_thread::sleep_for(kPollInterval);
  }
  bool any_bad_input = false, any_failed = false, any_preempted = false;
  for (const Rank& r : ranks) {
    switch (contract::OutcomeOf(*r.exit, contract::StopRequest::kNone)) {
      case contract::RankOutcome::kBadInput:
        any_bad_input = true;
        break;
      case contract::RankOutcome::kPreempted:
        any_preempted = true;
        break;
      case contract::RankOutcome::kSucceeded:
        break;
      default:
        any_failed = true;
    }
  }
  if (any_bad_input) return contract::kExitBadInput;
  if (any_failed) return contract::kExitFailure;
  if (any_preempted) return contract::kExitPreempted;
  return contract::kExitOk;
}

}  // namespace ulysses::engine::train
