#include "worker/agent/child_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ulysses::agent {
namespace {

constexpr size_t kStderrTailBytes = 2048;
constexpr size_t kMaxLineBytes = 64 * 1024;

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Reads what is available on `fd` into `buffer`, calling `on_line` for each full
// line. Returns false at EOF or on a hard error.
template <typename OnLine>
bool Pump(int fd, std::string& buffer, OnLine on_line) {
  char chunk[8192];
  const ssize_t n = read(fd, chunk, sizeof(chunk));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) {
    if (!buffer.empty()) on_line(std::move(buffer));
    buffer.clear();
    return false;
  }
  buffer.append(chunk, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
    on_line(buffer.substr(start, nl - start));
  }
  buffer.erase(0, start);
  if (buffer.size() > kMaxLineBytes) {  // A runaway line without newline: flush it.
    on_line(std::move(buffer));
    buffer.clear();
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildSupervisor>> ChildSupervisor::Start(
    const std::vector<std::string>& argv, const std::string& work_dir, ChildCallbacks callbacks) {
  if (argv.empty()) return absl::InvalidArgumentError("child argv is empty");

  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // The supervisor thread must be the forking thread (PDEATHSIG follows the parent
  // *thread*), so the thread forks, publishes the pid, then runs the loop.
  std::unique_ptr<ChildSupervisor> self(
      new ChildSupervisor(out_pipe[0], err_pipe[0], std::move(callbacks)));
  const pid_t parent_pid = getpid();
  const int child_out = out_pipe[1], child_err = err_pipe[1];
  std::string cwd_copy = work_dir;
  ChildSupervisor* me = self.get();
  me->thread_ = std::thread([me, argv, cwd_copy, parent_pid, child_out, child_err] {
    const char* cwd = cwd_copy.empty() ? nullptr : cwd_copy.c_str();
    // Built before fork: the child may only call async-signal-safe functions.
    std::vector<char*> cargv;
    for (const auto& arg : argv) cargv.push_back(const_cast<char*>(arg.c_str()));
    cargv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent_pid) _exit(127);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      signal(SIGTERM, SIG_DFL);
      signal(SIGINT, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      dup2(child_out, STDOUT_FILENO);
      dup2(child_err, STDERR_FILENO);
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, STDIN_FILENO);
      if (cwd != nullptr && chdir(cwd) != 0) {
        const char msg[] = "ulysses-worker: cannot chdir to the work dir\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)ignored;
        _exit(127);
      }
      execv(cargv[0], cargv.data());
      const char msg[] = "ulysses-worker: exec of the engine binary failed: ";
      ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
      const char* reason = strerror(errno);
      ignored = write(STDERR_FILENO, reason, strlen(reason));
      ignored = write(STDERR_FILENO, "\n", 1);
      (void)ignored;
      _exit(127);
    }
    const int fork_errno = errno;
    {
      std::lock_guard<std::mutex> lock(me->mu_);
      me->pid_ = pid;
      me->fork_errno_ = pid < 0 ? fork_errno : 0;
      me->cv_.notify_all();
    }
    if (pid > 0) me->Loop();
  });
  {
    std::unique_lock<std::mutex> lock(me->mu_);
    me->cv_.wait(lock, [&] { return me->pid_ != 0; });
  }
  close(child_out);
  close(child_err);
  if (me->pid_ < 0) {
    const int err = me->fork_errno_;
    me->thread_.join();
    return absl::InternalError(absl::StrCat("fork: ", strerror(err)));
  }
  return self;
}

ChildSupervisor::ChildSupervisor(int out_fd, int err_fd, ChildCallbacks callbacks)
    : out_fd_(out_fd), err_fd_(err_fd), callbacks_(std::move(callbacks)) {}

ChildSupervisor::~ChildSupervisor() {
  Stop(StopCause::kAbort, std::chrono::milliseconds(0));
  if (thread_.joinable()) thread_.join();
}

void ChildSupervisor::Stop(StopCause cause, std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(mu_);
  if (result_.has_value()) return;
  // The first cause wins: an abort that follows a preemption (the group breaking up
  // because of it) must not turn the preemption into an abort.
  if (stop_cause_ == StopCause::kNone) stop_cause_ = cause;
  const auto deadline = Clock::now() + grace;
  if (!kill_deadline_.has_value()) {
    kill(-pid_, SIGTERM);
    ULOG(INFO) << "sent SIGTERM to child pid " << pid_ << " (SIGKILL in " << grace.count()
               << " ms if it has not exited)";
  }
  if (!kill_deadline_.has_value() || deadline < *kill_deadline_) kill_deadline_ = deadline;
  cv_.notify_all();
}

std::optional<ChildResult> ChildSupervisor::Wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return result_.has_value(); });
  return result_;
}

ChildResult ChildSupervisor::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return result_.has_value(); });
  return *result_;
}

bool ChildSupervisor::Running() {
  std::lock_guard<std::mutex> lock(mu_);
  return !result_.has_value();
}

void ChildSupervisor::HandleLine(bool is_stdout, std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (is_stdout) {
    auto event = ParseTrainEvent(line);
    if (event.ok()) {
      if (callbacks_.on_event) callbacks_.on_event(*event);
      return;
    }
  } else {
    stderr_tail_.append(line).append("\n");
    if (stderr_tail_.size() > kStderrTailBytes) {
      stderr_tail_.erase(0, stderr_tail_.size() - kStderrTailBytes);
    }
  }
  if (callbacks_.on_log) callbacks_.on_log(is_stdout ? "stdout" : "stderr", line);
}

void ChildSupervisor::Loop() {
  std::string out_buf, err_buf;
  int status = 0;
  bool reaped = false;
  std::optional<Clock::time_point> reaped_at;
  while (true) {
    pollfd fds[2];
    int nfds = 0;
    if (out_fd_ >= 0) fds[nfds++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[nfds++] = {err_fd_, POLLIN, 0};
    if (nfds > 0) {
      const int ready = poll(fds, nfds, 50);
      for (int i = 0; ready > 0 && i < nfds; ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const bool is_out = fds[i].fd == out_fd_;
        int& fd = is_out ? out_fd_ : err_fd_;
        std::string& buf = is_out ? out_buf : err_buf;
        if (!Pump(fd, buf, [&](std::string line) { HandleLine(is_out, std::move(line)); })) {
          CloseFd(fd);
        }
      }
    } else if (!reaped) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
    if (!reaped) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        reaped = true;
        reaped_at = Clock::now();
      }
    }
    if (!reaped) {
      std::lock_guard<std::mutex> lock(mu_);
      if (kill_deadline_.has_value() && !sigkill_sent_ && Clock::now() >= *kill_deadline_) {
        ULOG(WARNING) << "child pid " << pid_ << " did not exit in its grace period: SIGKILL";
        kill(-pid_, SIGKILL);
        sigkill_sent_ = true;
      }
    }
    // Done once reaped and both pipes drained; a grandchild holding a pipe open
    // gets at most one second.
    if (reaped &&
        ((out_fd_ < 0 && err_fd_ < 0) || Clock::now() - *reaped_at > std::chrono::seconds(1))) {
      break;
    }
  }
  CloseFd(out_fd_);
  CloseFd(err_fd_);
  ChildResult result;
  result.wait_status = status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    result.stop_cause = stop_cause_;
    result.sigkilled_by_agent = sigkill_sent_;
  }
  result.outcome = MapExit(status, result.stop_cause);
  result.description = DescribeWaitStatus(status);
  result.stderr_tail = stderr_tail_;
  if (callbacks_.on_exit) callbacks_.on_exit(result);
  std::lock_guard<std::mutex> lock(mu_);
  result_ = result;
  cv_.notify_all();
}

std::vector<std::string> BuildRankArgv(const RankLaunch& launch) {
  std::vector<std::string> argv = {launch.engine_bin,
                                   "rank",
                                   "-f",
                                   launch.spec_path,
                                   "--out",
                                   launch.out_dir,
                                   "--stage",
                                   absl::StrCat(launch.stage),
                                   "--rank",
                                   absl::StrCat(launch.rank),
                                   "--world-size",
                                   absl::StrCat(launch.world_size),
                                   "--master-addr",
                                   launch.master_addr,
                                   "--master-port",
                                   absl::StrCat(launch.master_port),
                                   "--device",
                                   launch.device};
  for (const auto& set : launch.overrides) {
    argv.push_back("--set");
    argv.push_back(set);
  }
  return argv;
}

}  // namespace ulysses::agent
