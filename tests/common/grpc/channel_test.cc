// MakeChannel against a real in-process gRPC server on loopback: plaintext, TLS and
// mutual TLS with certificates made by openssl, the bearer token as the server sees
// it, and the refusals (plaintext off loopback, bad files, bad tokens).
#include "common/grpc/channel.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"
#include "tests/testing/recording_server.h"
#include "tests/testing/temp_dir.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses {
namespace {

using ::testing::HasSubstr;
namespace v1 = ::ulysses::v1;

const testing::DevCerts& Certs() { return testing::TestCerts({"w1", "w2"}); }

ChannelOptions Opts(std::string server, std::string ca = "", std::string cert = "",
                    std::string key = "", std::string token = "", bool insecure = false) {
  ChannelOptions options;
  options.server = std::move(server);
  options.ca_file = std::move(ca);
  options.cert_file = std::move(cert);
  options.key_file = std::move(key);
  options.token = std::move(token);
  options.insecure = insecure;
  return options;
}

class ChannelTest : public ::testing::Test {
 protected:
  void StartServer(bool tls) {
    if (tls) Certs();  // Made before the server reads them.
    server_ = std::make_unique<testing::RecordingServer>(tls);
    ASSERT_GT(server_->port(), 0);
  }
  std::string Address(const std::string& host = "127.0.0.1") const {
    return server_->address(host);
  }
  testing::RecordingServer::Seen Seen() { return server_->seen(); }
  // One ListWorkers call through a channel made from `options`.
  absl::Status Call(const ChannelOptions& options) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(options);
    if (!channel.ok()) return channel.status();
    auto stub = v1::JobService::NewStub(*channel);
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    v1::ListWorkersResponse response;
    return FromGrpcStatus(stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &response));
  }
  const testing::DevCerts& certs() { return Certs(); }

  std::unique_ptr<testing::RecordingServer> server_;
};

TEST_F(ChannelTest, PlaintextLoopbackSendsTheBearerTokenOnEveryCall) {
  StartServer(/*tls=*/false);
  ChannelOptions options = Opts(Address(), "", "", "", "ul_secret-token");
  auto channel = MakeChannel(options);
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto stub = v1::JobService::NewStub(*channel);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    v1::ListWorkersResponse response;
    ASSERT_TRUE(stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &response).ok());
  }
  testing::RecordingServer::Seen seen = Seen();
  EXPECT_EQ(seen.calls, 3);
  EXPECT_EQ(seen.authorization, "Bearer ul_secret-token");
  EXPECT_EQ(seen.transport, "insecure");
}

TEST_F(ChannelTest, NoTokenSendsNoAuthorizationHeader) {
  StartServer(/*tls=*/false);
  ASSERT_TRUE(Call(Opts(Address())).ok());
  EXPECT_EQ(Seen().calls, 1);
  EXPECT_EQ(Seen().authorization, "");
  EXPECT_EQ(Seen().version, "");
}

TEST_F(ChannelTest, TheVersionIsSentOnEveryCallAndABadOneIsRefused) {
  StartServer(/*tls=*/false);
  ChannelOptions options = Opts(Address());
  options.version = "0.1.0";
  ASSERT_TRUE(Call(options).ok());
  EXPECT_EQ(Seen().version, "0.1.0");
  EXPECT_EQ(Seen().authorization, "");  // A version alone adds no token.
  options.version = "0.1 .0";
  absl::Status bad = MakeChannel(options).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("version: \"0.1 .0\""), std::string::npos) << bad;
}

TEST_F(ChannelTest, TlsVerifiesTheServerAndSendsTheToken) {
  StartServer(/*tls=*/true);
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    SCOPED_TRACE(host);
    absl::Status status = Call(Opts(Address(host), certs().ca, "", "", "t0k"));
    ASSERT_TRUE(status.ok()) << status;
  }
  testing::RecordingServer::Seen seen = Seen();
  EXPECT_EQ(seen.calls, 2);
  EXPECT_EQ(seen.authorization, "Bearer t0k");
  EXPECT_EQ(seen.transport, "ssl");
  EXPECT_EQ(seen.client_cn, "");  // No client certificate given.
}

TEST_F(ChannelTest, MutualTlsPresentsTheClientCertificate) {
  StartServer(/*tls=*/true);
  absl::Status status =
      Call(Opts(Address(), certs().ca, certs().WorkerCert("w1"), certs().WorkerKey("w1")));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(Seen().client_cn, "w1");
  EXPECT_EQ(Seen().transport, "ssl");
}

TEST_F(ChannelTest, TlsRefusesAServerSignedByAnotherCa) {
  StartServer(/*tls=*/true);
  absl::Status status = Call(Opts(Address(), testing::OtherCaFile(), "", "", "t0k"));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(Seen().calls, 0);  // The token never reached the server.
}

TEST_F(ChannelTest, PlaintextClientCannotTalkToATlsServer) {
  StartServer(/*tls=*/true);
  EXPECT_EQ(Call(Opts(Address(), "", "", "", "t0k")).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Seen().calls, 0);
}

TEST_F(ChannelTest, RefusesPlaintextOffLoopbackUnlessInsecure) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> refused =
      MakeChannel(Opts("10.1.2.3:50051", "", "", "", "t0k"));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("server: \"10.1.2.3:50051\""));
  EXPECT_THAT(refused.status().message(), HasSubstr("--ca"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--insecure"));
  EXPECT_TRUE(MakeChannel(Opts("10.1.2.3:50051", "", "", "", "t0k", true)).ok());
  EXPECT_TRUE(MakeChannel(Opts("coord.example:50051", certs().ca)).ok());
}

TEST(IsLoopbackTargetTest, KnowsLoopbackFromTheRest) {
  for (const char* yes :
       {"127.0.0.1:50051", "127.1.2.3:1", "localhost:50051", "LOCALHOST:1", "[::1]:50051", "::1",
        "dns:///localhost:50051", "dns:127.0.0.1:5", "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv6:[::1]:5",
        "unix:/tmp/sock", "[::ffff:127.0.0.1]:5"}) {
    EXPECT_TRUE(IsLoopbackTarget(yes)) << yes;
  }
  for (const char* no :
       {"10.0.0.1:50051", "0.0.0.0:50051", "coord:50051", "localhost.evil.com:1", "[::]:5",
        "dns:///coord:50051", "ipv4:127.0.0.1:1,10.0.0.1:2", "128.0.0.1:1", "", "[::2]:5"}) {
    EXPECT_FALSE(IsLoopbackTarget(no)) << no;
  }
}

TEST_F(ChannelTest, BadFilesAndFlagsNameTheFieldAndTheFix) {
  testing::TempDir dir;
  std::ofstream(dir.Sub("not-pem")) << "hello\n";
  struct Case {
    ChannelOptions options;
    std::string expected;
  };
  const std::string ca = certs().ca;
  const Case cases[] = {
      {Opts("127.0.0.1:1", dir.Sub("missing.pem")),
       "ca: cannot read \"" + dir.Sub("missing.pem") + "\""},
      {Opts("127.0.0.1:1", dir.Sub("not-pem")), "is not PEM"},
      {Opts("127.0.0.1:1", ca, certs().WorkerCert("w1")), "give both (mutual TLS) or neither"},
      {Opts("127.0.0.1:1", ca, certs().WorkerCert("w1"), dir.Sub("nokey")), "key: cannot read"},
      {Opts("127.0.0.1:1", "", certs().WorkerCert("w1"), certs().WorkerKey("w1")), "without a CA"},
      {Opts(""), "server: \"\" is empty"},
      {Opts("127.0.0.1:1", "", "", "", "two words"), "token: the token contains a space"},
      {Opts("127.0.0.1:1", "", "", "", std::string(5000, 'a')), "token: a token of 5000 bytes"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(c.options);
    EXPECT_EQ(channel.status().code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_THAT(channel.status().message(), HasSubstr(c.expected));
  }
}

TEST(ReadTokenFileTest, ReadsTheFirstLineTrimmed) {
  testing::TempDir dir;
  std::ofstream(dir.Sub("ok")) << "  ul_abc-DEF_123 \nsecond line\n";
  std::ofstream(dir.Sub("empty")) << "\n";
  std::ofstream(dir.Sub("spaced")) << "ul abc\n";
  absl::StatusOr<std::string> token = ReadTokenFile(dir.Sub("ok"), "--token-file");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "ul_abc-DEF_123");
  absl::StatusOr<std::string> empty = ReadTokenFile(dir.Sub("empty"), "--token-file");
  EXPECT_THAT(empty.status().message(), HasSubstr("--token-file \"" + dir.Sub("empty") + "\""));
  EXPECT_THAT(empty.status().message(), HasSubstr("a token of 0 bytes"));
  EXPECT_FALSE(ReadTokenFile(dir.Sub("spaced"), "f").ok());
  absl::StatusOr<std::string> missing = ReadTokenFile(dir.Sub("nope"), "contexts[0].token_file");
  EXPECT_THAT(missing.status().message(), HasSubstr("contexts[0].token_file: cannot read"));
}

}  // namespace
}  // namespace ulysses
