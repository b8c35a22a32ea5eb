// Local process launcher for `ulysses-train train` and multi-rank `eval`: spawns
// N real OS processes of this binary (argv built by the caller), forwards
// SIGTERM/SIGINT to them, and aggregates their exit codes.
//
// Children are spawned and stopped with common/process (the same two kill tiers as
// the worker agent's ChildSupervisor) and their exits read with contract::OutcomeOf.
// Not thread-safe (uses waitpid on its own children). On return no child is left
// running: a child failure makes the launcher stop the others (SIGTERM, then
// SIGKILL after a grace period).
#ifndef ULYSSES_WORKER_ENGINE_CMD_LAUNCHER_H_
#define ULYSSES_WORKER_ENGINE_CMD_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ulysses::engine::train {

// Path of the running executable (/proc/self/exe).
std::string SelfExe();

// Runs every argv (argv[0] = program path) as a child and waits for all. Returns
// the aggregate exit code (common/contract/exit.h): 2 if any rank exited 2; else 1
// if any failed (another non-zero exit, or killed by a signal); else 75 if any exited
// 75; else 0. Forwards SIGTERM to the children when this process receives
// SIGTERM/SIGINT (via common/stop.h), with no SIGKILL deadline: they checkpoint.
int RunProcesses(const std::vector<std::vector<std::string>>& argvs);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_CMD_LAUNCHER_H_
