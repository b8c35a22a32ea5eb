// Runs one `ulysses-train rank` child process and watches it.
//
// Start() forks+execs argv in its own process group with stdout/stderr piped
// back. One supervisor thread (the child's parent thread, so PR_SET_PDEATHSIG
// fires only when the agent itself dies) reads both pipes, turns stdout JSON lines
// into TrainEvents (other stdout lines and all stderr lines go to on_log), enforces
// the kill tiers and reaps the child. Callbacks run on that thread, in output order;
// they must not call back into this object except Stop()/pid().
//
// Kill tiers: Stop(cause, grace) sends SIGTERM to the child's process group now
// and SIGKILL once `grace` passes without an exit. A later Stop() can only shorten
// the deadline. If the agent dies (even kill -9) the kernel SIGKILLs the child.
//
// Thread-safety: all public methods are thread-safe. The destructor SIGKILLs a
// child that is still running and joins the thread. Copy is deleted.
#ifndef ULYSSES_WORKER_AGENT_CHILD_SUPERVISOR_H_
#define ULYSSES_WORKER_AGENT_CHILD_SUPERVISOR_H_

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/agent/train_event.h"

namespace ulysses::agent {

struct ChildResult {
  AttemptOutcome outcome = AttemptOutcome::kFailed;
  int wait_status = 0;  // Raw waitpid() status.
  StopCause stop_cause = StopCause::kNone;
  bool sigkilled_by_agent = false;  // The SIGKILL tier fired.
  std::string description;          // "exit code 75", "killed by signal 9 (Killed)".
  std::string stderr_tail;          // Last stderr lines (for failure messages), <= ~2 KiB.
};

struct ChildCallbacks {
  std::function<void(const TrainEvent&)> on_event;
  // stream is "stdout" or "stderr"; the line has no trailing newline.
  std::function<void(const std::string& stream, const std::string& line)> on_log;
  // Called once, last, after the child was reaped.
  std::function<void(const ChildResult&)> on_exit;
};

class ChildSupervisor {
 public:
  using Clock = std::chrono::steady_clock;

  // argv[0] must be a path to an executable. `work_dir` ("" = inherit) becomes the cwd.
  // Fails with InvalidArgument (empty argv) or Internal (pipe/fork failed); exec
  // failures show up as exit code 127 with the reason on stderr.
  static absl::StatusOr<std::unique_ptr<ChildSupervisor>> Start(
      const std::vector<std::string>& argv, const std::string& work_dir, ChildCallbacks callbacks);

  ~ChildSupervisor();
  ChildSupervisor(const ChildSupervisor&) = delete;
  ChildSupervisor& operator=(const ChildSupervisor&) = delete;

  // SIGTERM now, SIGKILL after `grace` (0 = SIGKILL at once). No-op once exited.
  void Stop(StopCause cause, std::chrono::milliseconds grace);

  // Waits up to `timeout` for the child to be reaped; returns its result if so.
  std::optional<ChildResult> Wait(std::chrono::milliseconds timeout);
  ChildResult Wait();

  bool Running();
  pid_t pid() const { return pid_; }  // Set before Start() returns.

 private:
  ChildSupervisor(int out_fd, int err_fd, ChildCallbacks callbacks);
  void Loop();  // The supervisor thread.
  void HandleLine(bool is_stdout, std::string line);

  pid_t pid_ = 0;  // Written once by the thread before Start() returns.
  int fork_errno_ = 0;
  int out_fd_;
  int err_fd_;
  ChildCallbacks callbacks_;
  std::string stderr_tail_;  // Supervisor thread only.

  std::mutex mu_;
  std::condition_variable cv_;
  StopCause stop_cause_ = StopCause::kNone;         // GUARDED_BY(mu_)
  std::optional<Clock::time_point> kill_deadline_;  // GUARDED_BY(mu_)
  bool sigkill_sent_ = false;                       // GUARDED_BY(mu_)
  std::optional<ChildResult> result_;               // GUARDED_BY(mu_)
  std::thread thread_;
};

// The argv for one rank of one stage, per the `ulysses-train rank` contract.
struct RankLaunch {
  std::string engine_bin;
  std::string spec_path;
  std::string out_dir;
  int64_t stage = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string device = "cpu";
  std::vector<std::string> overrides;  // "spec.path=value", passed as --set.
};
std::vector<std::string> BuildRankArgv(const RankLaunch& launch);

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_CHILD_SUPERVISOR_H_
