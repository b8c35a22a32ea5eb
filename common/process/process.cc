#include "common/process/process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ulysses::process {
namespace {

void WriteStderr(const char* text) {
  ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
  (void)ignored;
}

}  // namespace

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("child argv is empty");
  // Everything the child touches is prepared before fork: between fork and exec the
  // child may only call async-signal-safe functions.
  std::vector<char*> cargv;
  for (const std::string& arg : argv) cargv.push_back(const_cast<char*>(arg.c_str()));
  cargv.push_back(nullptr);
  // The child's environment: options.env or this process's, plus each default whose name is
  // unset there.
  std::vector<char*> cenv;
  if (options.env.has_value()) {
    for (const std::string& entry : *options.env) cenv.push_back(const_cast<char*>(entry.c_str()));
  } else {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) cenv.push_back(*e);
  }
  const size_t base = cenv.size();
  std::vector<std::string> added;
  for (const std::string& entry : options.env_defaults) {
    const size_t eq = entry.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("env default '", entry, "' is not NAME=VALUE"));
    }
    bool set = false;
    for (size_t i = 0; i < base && !set; ++i) set = strncmp(cenv[i], entry.c_str(), eq + 1) == 0;
    if (!set) added.push_back(entry);
  }
  for (std::string& entry : added) cenv.push_back(entry.data());
  cenv.push_back(nullptr);
  const char* cwd = options.work_dir.empty() ? nullptr : options.work_dir.c_str();
  const std::string exec_error = options.exec_error_prefix + ": ";
  const pid_t parent = getpid();
  // Every signal is blocked across fork (as posix_spawn does): a SIGTERM sent to the child
  // before it reset its handlers would otherwise run the parent's handler copied into it (the
  // agent's stop flag) and be lost, and the rank would never see its graceful stop. The child
  // resets the handlers first, then unblocks: a SIGTERM already sent gets the default action.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t pid = fork();
  if (pid != 0) {
    const int fork_errno = errno;
    // The parent makes the group too (as shells do): a kill(-pid) that comes before the child
    // ran its own setpgid would find no such group (ESRCH) and the stop would be lost. It fails
    // harmlessly (EACCES) when the child has already exec'd, which it does only after its own.
    if (pid > 0 && options.own_process_group) setpgid(pid, pid);
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(fork_errno)));
    return pid;
  }

  // Child.
  if (options.own_process_group) setpgid(0, 0);
  if (options.die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // The parent died before prctl took effect.
  }
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (options.stdout_fd >= 0) dup2(options.stdout_fd, STDOUT_FILENO);
  if (options.stderr_fd >= 0) dup2(options.stderr_fd, STDERR_FILENO);
  if (options.stdin_fd >= 0) {
    dup2(options.stdin_fd, STDIN_FILENO);
  } else if (options.stdin_from_dev_null) {
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  }
  if (cwd != nullptr && chdir(cwd) != 0) {
    WriteStderr(exec_error.c_str());
    WriteStderr("cannot chdir to the work dir\n");
    _exit(127);
  }
  execve(cargv[0], cargv.data(), cenv.data());
  const char* reason = strerror(errno);
  WriteStderr(exec_error.c_str());
  WriteStderr(reason);
  WriteStderr("\n");
  _exit(127);
}

bool KillTiers::Stop(std::optional<std::chrono::milliseconds> grace, Clock::time_point now) {
  if (grace.has_value()) {
    const Clock::time_point deadline = now + *grace;
    if (!deadline_.has_value() || deadline < *deadline_) deadline_ = deadline;
  }
  if (term_sent_) return false;
  term_sent_ = true;
  kill(target_, SIGTERM);
  return true;
}

bool KillTiers::Enforce(Clock::time_point now) {
  if (kill_sent_ || !deadline_.has_value() || now < *deadline_) return false;
  kill_sent_ = true;
  kill(target_, SIGKILL);
  return true;
}

contract::ProcessExit ProcessExitOf(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return contract::ProcessExit{128 + sig, sig};
  }
  return contract::ProcessExit{WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128, 0};
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* name = strsignal(sig);
    return absl::StrCat("killed by signal ", sig, " (", name ? name : "?", ")");
  }
  return absl::StrCat("wait status ", wait_status);
}

}  // namespace ulysses::process
