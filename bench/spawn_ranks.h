// SpawnSelfAsRanks: the benches' one launcher for multi-rank runs on this host. Re-executes
// this binary (/proc/self/exe) with the same argv `world` times, each child with
// ULYSSES_BENCH_RANK=r, ULYSSES_BENCH_PORT=port (its TCPStore) and OMP_NUM_THREADS=1 added
// to the environment; waits for all and returns 0 when every child exited 0, else 1.
#ifndef ULYSSES_BENCH_SPAWN_RANKS_H_
#define ULYSSES_BENCH_SPAWN_RANKS_H_

#include <spawn.h>
#include <sys/wait.h>

#include <string>
#include <vector>

extern char** environ;

namespace ulysses::bench {

inline int SpawnSelfAsRanks(int world, int port, char** argv) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
    env.push_back("ULYSSES_BENCH_RANK=" + std::to_string(r));
    env.push_back("ULYSSES_BENCH_PORT=" + std::to_string(port));
    env.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return 1;
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}

}  // namespace ulysses::bench

#endif  // ULYSSES_BENCH_SPAWN_RANKS_H_
