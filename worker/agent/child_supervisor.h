// Runs one `ulysses-train rank` child process and watches it.
//
// Start() forks+execs argv in its own process group with stdout/stderr piped
// back (common/process Spawn). One supervisor thread (the child's parent thread, so
// PR_SET_PDEATHSIG fires only when the agent itself dies) reads both pipes, turns
// stdout event lines into contract::RankEvents (common/contract/rank_event.h; other
// stdout lines and all stderr lines go to on_log), enforces the kill tiers and reaps
// the child. Callbacks run on that thread, in output order; they must not call back
// into this object except Stop()/pid().
//
// Kill tiers (common/process KillTiers): Stop(stop, grace) sends SIGTERM to the
// child's process group now and SIGKILL once `grace` passes without an exit. A later
// Stop() can only shorten the deadline. If the agent dies (even kill -9) the kernel
// SIGKILLs the child. The exit is read with contract::OutcomeOf.
//
// Thread-safety: all public methods are thread-safe. The destructor SIGKILLs a
// child that is still running and joins the thread. Copy is deleted.
#ifndef ULYSSES_WORKER_AGENT_CHILD_SUPERVISOR_H_
#define ULYSSES_WORKER_AGENT_CHILD_SUPERVISOR_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/contract/exit.h"
#include "common/contract/rank_event.h"
#include "common/process/process.h"

namespace ulysses::agent {

struct ChildResult {
  contract::RankOutcome outcome = contract::RankOutcome::kFailed;
  int wait_status = 0;  // Raw waitpid() status.
  contract::StopRequest stop_cause = contract::StopRequest::kNone;
  bool sigkilled_by_agent = false;  // The SIGKILL tier fired.
  std::string description;          // "exit code 75", "killed by signal 9 (Killed)".
  std::string stderr_tail;          // Last stderr lines (for failure messages), <= ~2 KiB.
};

struct ChildCallbacks {
  std::function<void(const contract::RankEvent&)> on_event;
  // stream is "stdout" or "stderr"; the line has no trailing newline.
  std::function<void(const std::string& stream, const std::string& line)> on_log;
  // A stdout event line that breaks the protocol (`error` says how). The line itself
  // also goes to on_log.
  std::function<void(const std::string& line, const absl::Status& error)> on_bad_event;
  // Called once, last, after the child was reaped.
  std::function<void(const ChildResult&)> on_exit;
};

class ChildSupervisor {
 public:
  using Clock = std::chrono::steady_clock;

  // argv[0] must be a path to an executable. `work_dir` ("" = inherit) becomes the cwd.
  // Fails with InvalidArgument (empty argv) or Internal (pipe/fork failed); exec
  // failures show up as exit code 127 with the reason on stderr.
  // `env`: "NAME=VALUE" entries set in the child's environment (replacing the agent's own).
  static absl::StatusOr<std::unique_ptr<ChildSupervisor>> Start(
      const std::vector<std::string>& argv, const std::string& work_dir, ChildCallbacks callbacks,
      const std::vector<std::string>& env = {});

  ~ChildSupervisor();
  ChildSupervisor(const ChildSupervisor&) = delete;
  ChildSupervisor& operator=(const ChildSupervisor&) = delete;

  // SIGTERM now, SIGKILL after `grace` (0 = SIGKILL at once). No-op once exited.
  // The first stop request is the one the result reports.
  void Stop(contract::StopRequest stop, std::chrono::milliseconds grace);

  // Waits up to `timeout` for the child to be reaped; returns its result if so.
  std::optional<ChildResult> Wait(std::chrono::milliseconds timeout);
  ChildResult Wait();

  bool Running();
  pid_t pid() const { return pid_; }  // Set before Start() returns.

  // Writes `line` and a newline to the child's stdin (the control channel of `ulysses-train
  // rank --control stdin`, common/contract/rank_control.h) without blocking. False when the
  // child is gone or the pipe is full (a line is small; a child reading it never fills it).
  bool SendLine(const std::string& line);

 private:
  ChildSupervisor(int out_fd, int err_fd, ChildCallbacks callbacks);
  void Loop();  // The supervisor thread.
  void HandleLine(bool is_stdout, std::string line);

  // Written once by the supervisor thread under mu_, before Start() returns (-1: spawn failed);
  // read-only after that.
  pid_t pid_ = 0;
  absl::Status spawn_error_;  // Why the spawn failed; written before pid_.
  int out_fd_;
  int err_fd_;
  int in_fd_ = -1;  // The write end of the child's stdin.
  ChildCallbacks callbacks_;
  std::string stderr_tail_;  // Supervisor thread only.

  absl::Mutex mu_;
  contract::StopRequest stop_cause_ ABSL_GUARDED_BY(mu_) = contract::StopRequest::kNone;
  process::KillTiers tiers_ ABSL_GUARDED_BY(mu_){0};  // Targets the child's group.
  uint64_t stop_calls_ ABSL_GUARDED_BY(mu_) = 0;      // Wakes the loop to enforce tiers_.
  std::optional<ChildResult> result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// The argv for one rank of one stage, per the `ulysses-train rank` contract.
struct RankLaunch {
  std::string engine_bin;
  std::string spec_path;
  // The job's identity (assignment ref.job_id and tenant): --job-id, --tenant when set.
  std::string job_id;
  std::string tenant;
  int64_t generation = -1;  // >= 0: --generation
  // The attempt's rendezvous secret: in the rank's environment (kRendezvousSecretEnv), not its
  // argv (RankEnvironment).
  std::string rendezvous_secret;
  std::string out_dir;
  int64_t stage = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string device = "cpu";
  std::vector<std::string> overrides;  // "spec.path=value", passed as --set.
  int collective_timeout_s = 0;        // > 0: --collective-timeout-s (0 = the engine's 60 s).
  double peak_flops = 0;               // > 0: --peak-flops (the step events then carry mfu).
  int intra_op_threads = 0;            // > 0: --intra-op-threads (0 = libtorch's default).
  bool control_stdin = false;          // --control stdin (the agent sends interval updates).
  // > 0: --stop-grace-s, the agent's --grace-period-s (SIGTERM -> SIGKILL): the rank leaves
  // within it even mid-step (worker/engine/train/preemption.h).
  double stop_grace_s = 0;
};
std::vector<std::string> BuildRankArgv(const RankLaunch& launch);
// "NAME=VALUE" entries the rank gets in its environment on top of the agent's.
std::vector<std::string> RankEnvironment(const RankLaunch& launch);

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_CHILD_SUPERVISOR_H_
