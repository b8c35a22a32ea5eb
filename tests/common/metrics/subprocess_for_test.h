// Small helpers for tests that run real tools (promtool, prometheus).
#ifndef ULYSSES_TESTS_COMMON_METRICS_SUBPROCESS_FOR_TEST_H_
#define ULYSSES_TESTS_COMMON_METRICS_SUBPROCESS_FOR_TEST_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace ulysses {
namespace metrics {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together.
};

// Runs `command` through /bin/sh with `input` on stdin.
inline CommandResult RunWithStdin(const std::string& command, const std::string& input) {
  char path[] = "/tmp/ulysses_stdin_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    return {};
  }
  close(fd);
  std::ofstream(path, std::ios::binary) << input;
  CommandResult result;
  FILE* pipe = popen((command + " < " + path + " 2>&1").c_str(), "r");
  if (pipe != nullptr) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) {
      result.output.append(buf, n);
    }
    int status = pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  unlink(path);
  return result;
}

inline bool FileExists(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// A currently free loopback TCP port (the kernel may hand it out again later, so
// use it promptly).
inline int FreeLoopbackPort() {
  int sock = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = -1;
  if (bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  close(sock);
  return port;
}

}  // namespace metrics
}  // namespace ulysses

#endif  // ULYSSES_TESTS_COMMON_METRICS_SUBPROCESS_FOR_TEST_H_
