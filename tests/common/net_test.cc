#include "common/net/host_port.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace ulysses::net {
namespace {

TEST(HostPortTest, SplitsHostAndPortWithIpv6InBrackets) {
  absl::StatusOr<HostPort> v4 = ParseHostPort("listen", "0.0.0.0:50051", "0.0.0.0:50051");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "0.0.0.0");
  EXPECT_EQ(v4->port, 50051);
  absl::StatusOr<HostPort> v6 = ParseHostPort("listen", "[::1]:0", "x");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  absl::StatusOr<HostPort> name = ParseHostPort("listen", "coordinator.svc:443", "x");
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(name->host, "coordinator.svc");
}

TEST(HostPortTest, BadAddressesNameTheFieldTheValueAndTheFix) {
  struct Case {
    const char* value;
    const char* says;
  };
  for (const Case& c :
       {Case{"50051", "is not HOST:PORT (e.g. 0.0.0.0:9091)"}, Case{":50051", "is not HOST:PORT"},
        Case{"host:", "has no valid port (use 0..65535)"}, Case{"host:65536", "has no valid port"},
        Case{"host:-1", "has no valid port"}, Case{"host:+80", "has no valid port"},
        Case{"host:80x", "has no valid port"},
        Case{"::1:80", "write an IPv6 host in brackets, e.g. [::1]:80"}}) {
    absl::StatusOr<HostPort> hp = ParseHostPort("--metrics-listen", c.value, "0.0.0.0:9091");
    ASSERT_FALSE(hp.ok()) << c.value;
    const std::string m(hp.status().message());
    EXPECT_TRUE(absl::StartsWith(m, absl::StrCat("--metrics-listen: \"", c.value, "\""))) << m;
    EXPECT_TRUE(absl::StrContains(m, c.says)) << m;
  }
}

TEST(HostPortTest, LoopbackIsAnAddressLiteralOrLocalhostOnly) {
  for (const char* h :
       {"127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  // Names that merely start like a loopback address are DNS names another host can own.
  for (const char* h : {"0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "localhost.evil.com",
                        "127.evil.com", "127.0.0.1.nip.io", "::ffff:10.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
}

TEST(HostPortTest, HostOfTakesTheHostOfEveryAddressForm) {
  EXPECT_EQ(HostOf("10.0.0.1:50051"), "10.0.0.1");
  EXPECT_EQ(HostOf("[::1]:50051"), "::1");
  EXPECT_EQ(HostOf("::1"), "::1");  // A bare IPv6 literal has no port.
  EXPECT_EQ(HostOf("coordinator"), "coordinator");
}

TEST(HostPortTest, JoinHostPortIsParseHostPortsInverse) {
  EXPECT_EQ(JoinHostPort("10.0.0.1", 50051), "10.0.0.1:50051");
  EXPECT_EQ(JoinHostPort("::1", 7), "[::1]:7");
  for (const char* address : {"0.0.0.0:0", "[::]:50051", "coordinator:443"}) {
    absl::StatusOr<HostPort> parsed = ParseHostPort("listen", address, "");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(JoinHostPort(parsed->host, parsed->port), address);
  }
}

}  // namespace
}  // namespace ulysses::net
