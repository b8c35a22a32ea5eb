#include "worker/engine/parallel/rendezvous_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/net/host_port.h"

namespace ulysses::engine {
namespace {

// First port of the kernel's ephemeral range; 32768 (Linux's default) when unreadable.
int EphemeralStart() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (f >> low >> high && low > kRendezvousPortLow + 1000 && low <= 65535) return low;
  return 32768;
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
    if (net::TcpPortFree(port)) return port;
  }
  return absl::UnavailableError(absl::StrCat("no bindable rendezvous port in [", kRendezvousPortLow,
                                             ", ", high, ") after 200 tries"));
}

}  // namespace ulysses::engine
