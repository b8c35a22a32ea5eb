#include "worker/agent/child_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/contract/rank_control.h"
#include "common/logging.h"
#include "common/process/cpu_share.h"

extern char** environ;

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
    const std::vector<std::string>& argv, const std::string& work_dir, ChildCallbacks callbacks,
    const std::vector<std::string>& env) {
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
  // The control channel (common/contract/rank_control.h): the child's stdin. Never blocks the
  // agent: a child that does not read it (no --control stdin) just fills the pipe.
  int in_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  fcntl(in_pipe[1], F_SETFL, fcntl(in_pipe[1], F_GETFL) | O_NONBLOCK);
  std::unique_ptr<ChildSupervisor> self(
      new ChildSupervisor(out_pipe[0], err_pipe[0], std::move(callbacks)));
  self->in_fd_ = in_pipe[1];
  process::SpawnOptions options;
  options.work_dir = work_dir;
  options.stdout_fd = out_pipe[1];
  options.stderr_fd = err_pipe[1];
  options.stdin_fd = in_pipe[0];
  options.own_process_group = true;
  options.die_with_parent = true;
  options.exec_error_prefix = "ulysses-worker: exec of the engine binary failed";
  options.env_defaults = process::RankEnvironmentDefaults();
  if (!env.empty()) {
    std::vector<std::string> whole;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('=') + 1);
      const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& v) {
        return v.compare(0, name.size(), name) == 0;
      });
      if (!replaced) whole.push_back(entry);
    }
    whole.insert(whole.end(), env.begin(), env.end());
    options.env = std::move(whole);
  }
  // The supervisor thread must be the spawning thread (PDEATHSIG follows the parent
  // *thread*), so the thread spawns, publishes the pid, then runs the loop.
  ChildSupervisor* me = self.get();
  me->thread_ = std::thread([me, argv, options] {
    absl::StatusOr<pid_t> pid = process::Spawn(argv, options);
    {
      absl::MutexLock lock(&me->mu_);
      if (pid.ok()) {
        me->pid_ = *pid;
        me->tiers_ = process::KillTiers(-*pid);  // The child leads its own group.
      } else {
        me->spawn_error_ = pid.status();
        me->pid_ = -1;
      }
    }
    if (pid.ok()) me->Loop();
  });
  {
    absl::MutexLock lock(&me->mu_);
    me->mu_.Await(absl::Condition(
        +[](pid_t* pid) { return *pid != 0; }, &me->pid_));
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(in_pipe[0]);
  if (me->pid_ < 0) {
    me->thread_.join();
    return me->spawn_error_;
  }
  return self;
}

ChildSupervisor::ChildSupervisor(int out_fd, int err_fd, ChildCallbacks callbacks)
    : out_fd_(out_fd), err_fd_(err_fd), callbacks_(std::move(callbacks)) {}

ChildSupervisor::~ChildSupervisor() {
  Stop(contract::StopRequest::kAbort, std::chrono::milliseconds(0));
  if (thread_.joinable()) thread_.join();
  if (in_fd_ >= 0) close(in_fd_);
}

bool ChildSupervisor::SendLine(const std::string& line) {
  absl::MutexLock lock(&mu_);
  if (result_.has_value() || in_fd_ < 0) return false;
  const std::string text = line + "\n";
  // A child that exited but is not reaped yet: EPIPE, and a SIGPIPE that must not end the agent
  // (blocked on this thread, then taken back).
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  const ssize_t n = write(in_fd_, text.data(), text.size());
  const int err = errno;
  if (n < 0 && err == EPIPE) {
    const timespec zero{0, 0};
    sigtimedwait(&pipe_set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  return n == static_cast<ssize_t>(text.size());
}

void ChildSupervisor::Stop(contract::StopRequest stop, std::chrono::milliseconds grace) {
  absl::MutexLock lock(&mu_);
  if (result_.has_value() || pid_ <= 0) return;
  // The first request wins: an abort that follows a preemption (the group breaking up
  // because of it) must not turn the preemption into an abort.
  if (stop_cause_ == contract::StopRequest::kNone) stop_cause_ = stop;
  if (tiers_.Stop(grace)) {
    ULOG(INFO) << "sent SIGTERM to child pid " << pid_ << " (SIGKILL in " << grace.count()
               << " ms if it has not exited)";
  }
  ++stop_calls_;
}

std::optional<ChildResult> ChildSupervisor::Wait(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](std::optional<ChildResult>* r) { return r->has_value(); }, &result_),
                       absl::FromChrono(timeout));
  return result_;
}

ChildResult ChildSupervisor::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::optional<ChildResult>* r) { return r->has_value(); }, &result_));
  return *result_;
}

bool ChildSupervisor::Running() {
  absl::MutexLock lock(&mu_);
  return !result_.has_value();
}

void ChildSupervisor::HandleLine(bool is_stdout, std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (is_stdout) {
    absl::StatusOr<std::optional<contract::RankEvent>> event = contract::ParseRankEventLine(line);
    if (event.ok() && event->has_value()) {
      if (callbacks_.on_event) callbacks_.on_event(**event);
      return;
    }
    if (!event.ok() && callbacks_.on_bad_event) callbacks_.on_bad_event(line, event.status());
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
      // No pipe left to poll: wait 50 ms for the child, or less when Stop() is called.
      absl::MutexLock lock(&mu_);
      const uint64_t calls = stop_calls_;
      auto stop_called = [this, calls]()
                             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_calls_ != calls; };
      mu_.AwaitWithTimeout(absl::Condition(&stop_called), absl::Milliseconds(50));
    }
    if (!reaped) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        reaped = true;
        reaped_at = Clock::now();
      }
    }
    if (!reaped) {
      absl::MutexLock lock(&mu_);
      if (tiers_.Enforce()) {
        ULOG(WARNING) << "child pid " << pid_ << " did not exit in its grace period: SIGKILL";
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
    absl::MutexLock lock(&mu_);
    result.stop_cause = stop_cause_;
    result.sigkilled_by_agent = tiers_.kill_sent();
  }
  result.outcome = contract::OutcomeOf(process::ProcessExitOf(status), result.stop_cause);
  result.description = process::DescribeWaitStatus(status);
  result.stderr_tail = stderr_tail_;
  if (callbacks_.on_exit) callbacks_.on_exit(result);
  absl::MutexLock lock(&mu_);
  result_ = result;
}

std::vector<std::string> RankEnvironment(const RankLaunch& launch) {
  if (launch.rendezvous_secret.empty()) return {};
  return {absl::StrCat(contract::kRendezvousSecretEnv, "=", launch.rendezvous_secret)};
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
                                   launch.device,
                                   "--step-events",
                                   "all"};
  if (!launch.job_id.empty()) {
    argv.push_back("--job-id");
    argv.push_back(launch.job_id);
    argv.push_back("--tenant");
    argv.push_back(launch.tenant);
  }
  if (launch.generation >= 0) {
    argv.push_back("--generation");
    argv.push_back(absl::StrCat(launch.generation));
  }
  if (launch.collective_timeout_s > 0) {
    argv.push_back("--collective-timeout-s");
    argv.push_back(absl::StrCat(launch.collective_timeout_s));
  }
  if (launch.peak_flops > 0) {
    char peak[32];
    std::snprintf(peak, sizeof(peak), "%.17g", launch.peak_flops);
    argv.push_back("--peak-flops");
    argv.push_back(peak);
  }
  if (launch.intra_op_threads > 0) {
    argv.push_back("--intra-op-threads");
    argv.push_back(absl::StrCat(launch.intra_op_threads));
  }
  if (launch.control_stdin) {
    argv.push_back("--control");
    argv.push_back("stdin");
  }
  if (launch.stop_grace_s > 0) {
    char grace[32];
    std::snprintf(grace, sizeof(grace), "%.3f", launch.stop_grace_s);
    argv.push_back("--stop-grace-s");
    argv.push_back(grace);
  }
  for (const auto& set : launch.overrides) {
    argv.push_back("--set");
    argv.push_back(set);
  }
  return argv;
}

}  // namespace ulysses::agent
