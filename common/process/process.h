// Child processes: spawn, stop in two tiers (SIGTERM, then SIGKILL when a grace
// period runs out) and read how they ended. Shared by the worker agent's
// ChildSupervisor (one `ulysses-train rank` per assignment) and the engine's local
// launcher (`ulysses-train train` / multi-process `eval`), so both stop and report
// children the same way.
//
// Thread-safety: Spawn and the wait-status helpers are thread-safe. KillTiers is not:
// its owner serializes calls (ChildSupervisor holds its mutex).
#ifndef ULYSSES_COMMON_PROCESS_PROCESS_H_
#define ULYSSES_COMMON_PROCESS_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/contract/exit.h"

namespace ulysses::process {

struct SpawnOptions {
  std::string work_dir;  // The child's cwd; "" = inherit.
  int stdout_fd = -1;    // Becomes the child's stdout; -1 = inherit.
  int stderr_fd = -1;    // Becomes the child's stderr; -1 = inherit.
  bool stdin_from_dev_null = false;
  int stdin_fd = -1;  // Becomes the child's stdin (before stdin_from_dev_null); -1 = not.
  // The child leads a new process group (pgid = pid), so KillTiers(-pid) reaches
  // everything it spawns, and a terminal's Ctrl-C does not reach it directly.
  bool own_process_group = false;
  // The kernel SIGKILLs the child when the *calling thread* exits (PR_SET_PDEATHSIG),
  // even if this process is killed with SIGKILL. Call Spawn from the thread that
  // outlives the child.
  bool die_with_parent = false;
  // Prefix of the line the child writes to its stderr when exec fails (it then exits
  // 127): "<prefix>: <strerror>".
  std::string exec_error_prefix = "exec failed";
  // The child's whole environment ("NAME=VALUE" entries); nullopt = this process's.
  std::optional<std::vector<std::string>> env;
  // "NAME=VALUE" entries added to the child's environment when NAME is not set in it (in
  // `env`, or else in this process's; the child otherwise gets that environment as it is).
  std::vector<std::string> env_defaults;
};

// Forks and execs argv (argv[0] is a path; no PATH search). The child starts with
// an empty signal mask and default SIGTERM/SIGINT/SIGPIPE dispositions. Returns the
// pid; InvalidArgument for an empty argv, Internal when fork fails. Exec failures
// show up as exit code 127 with the reason on the child's stderr.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const SpawnOptions& options);

// The two-tier stop of one child (or process group): SIGTERM at the first Stop(),
// SIGKILL once the deadline passes (checked by Enforce()). A later Stop() can only
// bring the deadline closer. Not thread-safe.
class KillTiers {
 public:
  using Clock = std::chrono::steady_clock;

  // `target` is what kill(2) gets: a pid, or -pgid for a whole process group.
  explicit KillTiers(pid_t target) : target_(target) {}

  // Sends SIGTERM on the first call. `grace`: SIGKILL after this long (0 = at the
  // next Enforce()); nullopt = no SIGKILL deadline (yet). Returns true if it sent
  // SIGTERM now.
  bool Stop(std::optional<std::chrono::milliseconds> grace, Clock::time_point now = Clock::now());

  // Sends SIGKILL if the deadline has passed and it was not sent yet. Returns true
  // if it sent it now.
  bool Enforce(Clock::time_point now = Clock::now());

  bool term_sent() const { return term_sent_; }
  bool kill_sent() const { return kill_sent_; }
  std::optional<Clock::time_point> deadline() const { return deadline_; }

 private:
  pid_t target_;
  bool term_sent_ = false;
  bool kill_sent_ = false;
  std::optional<Clock::time_point> deadline_;
};

// How a waitpid() status ended: exit code (128 + signal when killed) and signal.
contract::ProcessExit ProcessExitOf(int wait_status);

// "exit code 2", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

}  // namespace ulysses::process

#endif  // ULYSSES_COMMON_PROCESS_PROCESS_H_
