#include "common/net/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ulysses::net {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view field, absl::string_view value,
                                       absl::string_view example) {
  const size_t colon = value.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", value, "\" is not HOST:PORT (e.g. ", example, ")"));
  }
  HostPort out;
  absl::string_view host = value.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": \"", value, "\" is ambiguous (write an IPv6 host in brackets, e.g. [::1]:",
        value.substr(colon + 1), ")"));
  }
  const absl::string_view port = value.substr(colon + 1);
  if (port.empty() || !absl::c_all_of(port, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &out.port) || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", value, "\" has no valid port (use 0..65535)"));
  }
  out.host = std::string(host);
  return out;
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  const std::string h(host);
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

absl::string_view HostOf(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "[")) return address.substr(0, address.find(']'));
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return address;
  if (address.find(':') != colon) return address;  // A bare IPv6 literal: no port.
  return address.substr(0, colon);
}

bool TcpPortFree(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  // As the store binds (c10d sets SO_REUSEADDR): the TIME_WAIT connections of an earlier
  // attempt's store on this port do not hold it; a socket listening there does.
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace ulysses::net
