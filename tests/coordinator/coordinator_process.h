// CoordinatorProcess: the real ulysses-coordinator binary as a child process for
// tests (kill -9, restart, signals), and the flags that run it with TLS, worker client
// certificates and the test token file (auth_channel.h).
#ifndef ULYSSES_TESTS_COORDINATOR_COORDINATOR_PROCESS_H_
#define ULYSSES_TESTS_COORDINATOR_COORDINATOR_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/testing/certs.h"

namespace ulysses::coordinator::testing {

inline std::string CoordinatorBinary() {
  const char* dir = std::getenv("ULYSSES_BIN_DIR");
  return std::string(dir ? dir : "build/bin") + "/ulysses-coordinator";
}

// A coordinator child process; reads "listening grpc=P metrics=M" from its stdout.
class CoordinatorProcess {
 public:
  // `stderr_path`: where the child's stderr (its log) goes ("" = the test's stderr).
  explicit CoordinatorProcess(const std::vector<std::string>& args,
                              const std::string& stderr_path = "") {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      if (!stderr_path.empty()) {
        int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (err >= 0) dup2(err, STDERR_FILENO);
      }
      close(out[0]);
      close(out[1]);
      std::vector<char*> argv;
      std::string bin = CoordinatorBinary();
      argv.push_back(bin.data());
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    out_ = fdopen(out[0], "r");
  }
  ~CoordinatorProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      Wait();
    }
    if (out_) fclose(out_);
  }
  // Blocks until the ready line (bounded by the child's lifetime: EOF when it dies).
  bool ReadPorts() {
    char line[512];
    while (out_ && fgets(line, sizeof(line), out_)) {
      if (sscanf(line, "ulysses-coordinator listening grpc=%d metrics=%d", &port_,
                 &metrics_port_) == 2) {
        return true;
      }
    }
    return false;
  }
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }
  void Signal(int sig) { kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  int port_ = 0;
  int metrics_port_ = 0;
  bool reaped_ = false;
};

inline std::vector<std::string> PlainArgs(const std::string& state_dir) {
  return {
      "--listen",    "127.0.0.1:0",           "--state-dir", state_dir,        "--metrics-listen",
      "127.0.0.1:0", "--heartbeat-timeout-s", "3",           "--lost-after-s", "3"};
}

// PlainArgs plus TLS (dev certificates), worker client certificates and `token_file`.
inline std::vector<std::string> SecureArgs(const std::string& state_dir,
                                           const std::string& token_file) {
  const ::ulysses::testing::DevCerts& certs = ::ulysses::testing::TestCerts();
  std::vector<std::string> args = PlainArgs(state_dir);
  for (const std::string& a :
       {std::string("--tls-cert"), certs.server_cert, std::string("--tls-key"), certs.server_key,
        std::string("--tls-client-ca"), certs.ca, std::string("--token-file"), token_file}) {
    args.push_back(a);
  }
  return args;
}

}  // namespace ulysses::coordinator::testing

#endif  // ULYSSES_TESTS_COORDINATOR_COORDINATOR_PROCESS_H_
