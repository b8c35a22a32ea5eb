// Network addresses as users write them: "HOST:PORT" flags and config keys, and the loopback
// test every component applies before allowing plaintext or choosing a transport. One parser
// and one loopback rule for the coordinator, the worker agent, ulyssesctl and the engine.
#ifndef ULYSSES_COMMON_NET_HOST_PORT_H_
#define ULYSSES_COMMON_NET_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ulysses::net {

struct HostPort {
  std::string host;  // Without the brackets of "[v6]:port".
  int port = 0;      // 0..65535 (0: the system picks one).
};

// Splits "HOST:PORT" ("[::1]:50051" for IPv6). `field` names the flag or key in errors and
// `example` is shown as the fix, e.g. ParseHostPort("--metrics-listen", v, "0.0.0.0:9091").
absl::StatusOr<HostPort> ParseHostPort(absl::string_view field, absl::string_view value,
                                       absl::string_view example);

// "host:port", with an IPv6 host in brackets ("[::1]:50051"): ParseHostPort's inverse.
std::string JoinHostPort(absl::string_view host, int port);

// True for localhost, 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104 (address literals only: a
// DNS name other than localhost is never taken as loopback).
bool IsLoopbackHost(absl::string_view host);

// The host of "host:port", "[v6]:port" or a bare host / IPv6 literal without a port.
absl::string_view HostOf(absl::string_view address);

// True when TCP `port` can be bound on every IPv4 address of this host right now, with
// SO_REUSEADDR as a rank 0's rendezvous store binds it; false when another socket listens
// there (connections in TIME_WAIT do not count).
bool TcpPortFree(int port);

}  // namespace ulysses::net

#endif  // ULYSSES_COMMON_NET_HOST_PORT_H_
