#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/process/process.h"

extern char** environ;

namespace ulysses::testing {
namespace {

using Clock = std::chrono::steady_clock;

// The name of a "NAME=VALUE" entry.
std::string NameOf(const std::string& entry) { return entry.substr(0, entry.find('=')); }

bool Unset(const std::string& name, const RunOptions& options) {
  for (const std::string& u : options.unset_env) {
    if (!u.empty() && u.back() == '*' ? name.rfind(u.substr(0, u.size() - 1), 0) == 0 : name == u) {
      return true;
    }
  }
  for (const std::string& e : options.env) {
    if (NameOf(e) == name) return true;  // Replaced below.
  }
  return false;
}

std::vector<std::string> ChildEnvironment(const RunOptions& options) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!Unset(NameOf(*e), options)) env.push_back(*e);
  }
  env.insert(env.end(), options.env.begin(), options.env.end());
  return env;
}

}  // namespace

Result Run(const std::vector<std::string>& argv, const RunOptions& options) {
  Result result;
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    result.description = absl::StrCat("not started: pipe: ", strerror(errno));
    ADD_FAILURE() << result.description;
    return result;
  }
  // stdin from an unlinked temp file: no writer to keep up with the child.
  FILE* in = nullptr;
  if (options.stdin_data.has_value()) {
    in = std::tmpfile();
    if (in == nullptr ||
        std::fwrite(options.stdin_data->data(), 1, options.stdin_data->size(), in) !=
            options.stdin_data->size() ||
        std::fflush(in) != 0) {
      ADD_FAILURE() << "cannot stage stdin: " << strerror(errno);
    } else {
      std::rewind(in);
    }
  }
  process::SpawnOptions spawn;
  spawn.stdout_fd = out_pipe[1];
  spawn.stderr_fd = err_pipe[1];
  spawn.stdin_fd = in != nullptr ? fileno(in) : -1;
  spawn.stdin_from_dev_null = true;
  spawn.own_process_group = true;  // A timeout kills what it started too.
  spawn.die_with_parent = true;
  spawn.env = ChildEnvironment(options);
  spawn.env_defaults = options.env_defaults;
  const absl::StatusOr<pid_t> pid = process::Spawn(argv, spawn);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (in != nullptr) std::fclose(in);
  if (!pid.ok()) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    result.description = absl::StrCat("not started: ", pid.status().ToString());
    ADD_FAILURE() << result.description;
    return result;
  }
  // Read both pipes until the child (and whatever it left holding them) closes them.
  const Clock::time_point deadline = Clock::now() + options.timeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timed_out = true;
      break;
    }
    const int ready = poll(fds, 2, static_cast<int>(left));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;  // Interrupted, or the deadline (checked above) came.
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  if (result.timed_out) {
    kill(-*pid, SIGKILL);
  } else {
    // Its pipes are closed; it exits now (bounded by the same deadline).
    while (waitpid(*pid, &status, WNOHANG) == 0) {
      if (Clock::now() >= deadline) {
        result.timed_out = true;
        kill(-*pid, SIGKILL);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  if (result.timed_out) {
    waitpid(*pid, &status, 0);
    result.description = absl::StrCat(
        "timed out after ",
        std::chrono::duration_cast<std::chrono::seconds>(options.timeout).count(), " s");
    if (options.timeout_fails) {
      ADD_FAILURE() << argv[0] << " " << result.description << "; stderr:\n" << result.err;
    }
    return result;
  }
  const contract::ProcessExit exit = process::ProcessExitOf(status);
  result.exit_code = exit.exit_code;
  result.signal = exit.signal;
  result.description = process::DescribeWaitStatus(status);
  return result;
}

Result RunBinary(const std::string& name, const std::vector<std::string>& args,
                 const RunOptions& options) {
  std::vector<std::string> argv = {BinDir() + "/" + name};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv, options);
}

std::string BinDir() {
  const char* dir = std::getenv("ULYSSES_BIN_DIR");
  return dir != nullptr ? dir : std::filesystem::absolute("build/bin").string();
}

std::string SourceDir() {
  const char* dir = std::getenv("ULYSSES_SOURCE_DIR");
  return dir != nullptr ? dir : std::filesystem::current_path().string();
}

}  // namespace ulysses::testing
