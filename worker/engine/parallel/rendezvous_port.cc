#include "worker/engine/parallel/rendezvous_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"

namespace ulysses::engine {
namespace {

// First port of the kernel's ephemeral range; 32768 (Linux's default) when unreadable.
int EphemeralStart() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (f >> low >> high && low > kRendezvousPortLow + 1000 && low <= 65535) return low;
  return 32768;
}

// True when `port` can be bound on every IPv4 address right now (what TCPStore binds).
bool Bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

absl::StatusOr<int> PickRendezvousPort() {
  const int high = std::min(kRendezvousPortHigh, EphemeralStart());  // exclusive
  std::random_device device;
  std::seed_seq seed{
      device(), static_cast<unsigned>(getpid()),
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(kRendezvousPortLow, high - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(gen);
    if (Bindable(port)) return port;
  }
  return absl::UnavailableError(absl::StrCat("no bindable rendezvous port in [", kRendezvousPortLow,
                                             ", ", high, ") after 200 tries"));
}

}  // namespace ulysses::engine
