// A TCP port for a job's rendezvous (c10d TCPStore on rank 0's host).
//
// Asking the kernel for a free ephemeral port (bind to 0, close, hand the number to the
// ranks) races with everything else on the machine that binds port 0 in between, Gloo
// itself included: every Gloo pair listens on a fresh ephemeral port, so with several jobs
// (or test binaries) starting at once, rank 0's store could find its port taken, or a rank
// could connect to another job's Gloo listener. PickRendezvousPort therefore draws a random
// port BELOW the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, usually
// 32768-60999), where nothing binds by accident, and under the coordinator's default
// rendezvous range (29500-29999, coordinator/config.h), and checks that it can be bound on
// all addresses right now. Two launchers only collide if they draw the same number.
//
// Thread-safe. Errors: Unavailable when no bindable port was found in 200 draws.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_RENDEZVOUS_PORT_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_RENDEZVOUS_PORT_H_

#include "absl/status/statusor.h"

namespace ulysses::engine {

// Drawn from [kRendezvousPortLow, min(kRendezvousPortHigh, ephemeral range start)).
inline constexpr int kRendezvousPortLow = 10000;
inline constexpr int kRendezvousPortHigh = 29500;

absl::StatusOr<int> PickRendezvousPort();

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_RENDEZVOUS_PORT_H_
