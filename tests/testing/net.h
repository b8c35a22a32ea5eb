// FreeLoopbackPort: a loopback TCP port for a test's own server or a program it starts.
#ifndef ULYSSES_TESTS_TESTING_NET_H_
#define ULYSSES_TESTS_TESTING_NET_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ulysses::testing {

// A currently free loopback TCP port, or -1 (the kernel may hand it out again later, so use it
// promptly).
inline int FreeLoopbackPort() {
  const int sock = socket(AF_INET, SOCK_STREAM, 0);
  if (sock < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = -1;
  socklen_t len = sizeof(addr);
  if (bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(sock);
  return port;
}

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_NET_H_
