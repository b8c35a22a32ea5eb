// Local process launcher for `ulysses-train train` and multi-rank `eval`: spawns
// N real OS processes of this binary (argv built by the caller), forwards
// SIGTERM/SIGINT to them, and aggregates their exit codes.
//
// Not thread-safe (uses waitpid on its own children). On return no child is left
// running: a child failure makes the launcher stop the others (SIGTERM, then
// SIGKILL after a grace period).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_LAUNCHER_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ulysses::engine::train {

// Path of the running executable (/proc/self/exe).
std::string SelfExe();

// Runs every argv (argv[0] = program path) as a child and waits for all. Returns
// the aggregate exit code: 0 if all exited 0; else 75 if any exited 75 (and none
// failed otherwise); else 2 if any exited 2; else 1. Signals the children with
// SIGTERM when this process receives SIGTERM/SIGINT (via common/stop.h).
int RunProcesses(const std::vector<std::vector<std::string>>& argvs);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_LAUNCHER_H_
