#include "worker/engine/train/launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/stop.h"

namespace ulysses::engine::train {

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "ulysses-train";
  buf[n] = '\0';
  return buf;
}

int RunProcesses(const std::vector<std::vector<std::string>>& argvs) {
  InstallStopSignalHandlers();
  std::vector<pid_t> pids;
  for (const auto& argv : argvs) {
    std::vector<char*> cargs;
    for (const auto& a : argv) cargs.push_back(const_cast<char*>(a.c_str()));
    cargs.push_back(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      execv(cargs[0], cargs.data());
      std::fprintf(stderr, "exec %s: %s\n", cargs[0], std::strerror(errno));
      _exit(127);
    }
    if (pid < 0) {
      ULOG(ERROR) << "fork failed: " << std::strerror(errno);
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      return 1;
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(pids.size(), -1);
  size_t running = pids.size();
  bool forwarded = false;
  bool failed = false;
  std::chrono::steady_clock::time_point kill_at{};
  while (running > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -1) continue;
      int status = 0;
      pid_t r = waitpid(pids[i], &status, WNOHANG);
      if (r != pids[i]) continue;
      codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      --running;
      if (codes[i] != 0 && codes[i] != 75 && !failed) {
        // A failed rank leaves its peers blocked in collectives: stop them.
        failed = true;
        for (size_t j = 0; j < pids.size(); ++j) {
          if (codes[j] == -1) kill(pids[j], SIGTERM);
        }
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      }
    }
    if (StopRequested() && !forwarded) {
      forwarded = true;
      for (size_t j = 0; j < pids.size(); ++j) {
        if (codes[j] == -1) kill(pids[j], SIGTERM);
      }
    }
    if (failed && running > 0 && std::chrono::steady_clock::now() > kill_at) {
      for (size_t j = 0; j < pids.size(); ++j) {
        if (codes[j] == -1) kill(pids[j], SIGKILL);
      }
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  bool any75 = false, any2 = false, any1 = false;
  for (int c : codes) {
    if (c == 75)
      any75 = true;
    else if (c == 2)
      any2 = true;
    else if (c != 0)
      any1 = true;
  }
  if (any2) return 2;
  if (any1) return 1;
  if (any75) return 75;
  return 0;
}

}  // namespace ulysses::engine::train
