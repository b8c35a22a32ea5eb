#include "tests/testing/rank_processes.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "worker/engine/parallel/rendezvous_port.h"

extern char** environ;

namespace ulysses::testing {

int FreePort() {
  absl::StatusOr<int> port = engine::PickRendezvousPort();
  if (!port.ok()) {
    std::cerr << "rank_processes: " << port.status() << "\n";
    std::abort();
  }
  return *port;
}

std::vector<ChildResult> RunChildren(const std::string& scenario, int world,
                                     std::chrono::seconds deadline,
                                     const std::vector<std::string>& extra_env) {
  using Clock = std::chrono::steady_clock;
  const int port = FreePort();
  const auto start = Clock::now();
  std::vector<pid_t> pids(world, -1);
  std::vector<ChildResult> results(world);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "ULYSSES_PARALLEL_CHILD", 22) != 0) env_strings.push_back(*e);
    }
    env_strings.push_back("ULYSSES_PARALLEL_CHILD=" + scenario);
    env_strings.push_back("ULYSSES_PARALLEL_CHILD_RANK=" + std::to_string(r));
    env_strings.push_back("ULYSSES_PARALLEL_CHILD_WORLD=" + std::to_string(world));
    env_strings.push_back("ULYSSES_PARALLEL_CHILD_PORT=" + std::to_string(port));
    env_strings.push_back("OMP_NUM_THREADS=1");
    for (const auto& e : extra_env) env_strings.push_back(e);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    char* argv[] = {exe, nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) pid = -1;
    pids[r] = pid;
  }
  int remaining = 0;
  for (pid_t p : pids) remaining += p > 0 ? 1 : 0;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        results[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
        pids[r] = -1;
        --remaining;
      }
    }
    if (remaining > 0 && Clock::now() - start > deadline) {
      for (int r = 0; r < world; ++r) {
        if (pids[r] <= 0) continue;
        std::cerr << "RunChildren(" << scenario << "): rank " << r << " still running at the "
                  << deadline.count() << " s deadline; killing it\n";
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        results[r].exit_code = -1;
        results[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
        pids[r] = -1;
      }
      remaining = 0;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // poll
  }
  return results;
}

ChildEnv ReadChildEnv() {
  ChildEnv env;
  const char* s = std::getenv("ULYSSES_PARALLEL_CHILD");
  if (s == nullptr) return env;
  env.scenario = s;
  env.rank = std::atoi(std::getenv("ULYSSES_PARALLEL_CHILD_RANK"));
  env.world = std::atoi(std::getenv("ULYSSES_PARALLEL_CHILD_WORLD"));
  env.port = std::atoi(std::getenv("ULYSSES_PARALLEL_CHILD_PORT"));
  return env;
}

void ChildFail(const ChildEnv& env, const std::string& message) {
  std::cerr << "[child " << env.scenario << " rank " << env.rank << "/" << env.world << "] "
            << message << std::endl;
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace ulysses::testing
