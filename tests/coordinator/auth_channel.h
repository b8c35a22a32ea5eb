// Credentials for the coordinator tests, which run the coordinator with TLS, worker
// client certificates and a token file (docs/SECURITY.md):
// - TestTokens: the fixed tokens of the test token file (admin, users of two tenants,
//   a viewer, a worker token) and WriteTestTokenFile() that stores their hashes;
// - MakeTestChannel(): a channel to 127.0.0.1:<port> over TLS against the dev CA
//   (tests/testing/certs.h), optionally presenting a worker's client certificate and
//   sending a bearer token as call credentials (`authorization: Bearer <token>`).
#ifndef ULYSSES_TESTS_COORDINATOR_AUTH_CHANNEL_H_
#define ULYSSES_TESTS_COORDINATOR_AUTH_CHANNEL_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/auth/tokens.h"
#include "coordinator/config.h"
#include "tests/testing/certs.h"

namespace ulysses::coordinator::testing {

struct TestTokens {
  static constexpr char kAdmin[] = "ul_test-admin-token";         // admin, tenant default
  static constexpr char kAlice[] = "ul_test-alice-token";         // user, tenant research
  static constexpr char kBob[] = "ul_test-bob-token";             // user, tenant other
  static constexpr char kViewer[] = "ul_test-viewer-token";       // viewer, tenant research
  static constexpr char kWorkerW9[] = "ul_test-worker-w9-token";  // worker w9, tenant infra
};

// Writes the hashes of TestTokens to `path` (only hashes: as in production).
inline void WriteTestTokenFile(const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  auto entry = [&](const char* user, const char* tenant, const char* role, const char* token) {
    out << "  - {user: " << user << ", tenant: " << tenant << ", role: " << role
        << ", sha256: " << auth::Sha256Hex(token) << "}\n";
  };
  out << "tokens:\n";
  entry("root", "default", "admin", TestTokens::kAdmin);
  entry("alice", "research", "user", TestTokens::kAlice);
  entry("bob", "other", "user", TestTokens::kBob);
  entry("vera", "research", "viewer", TestTokens::kViewer);
  entry("w9", "infra", "worker", TestTokens::kWorkerW9);
}

// TLS + worker client certificates + the test token file.
inline void UseTestSecurity(CoordinatorConfig* config, const std::string& token_file) {
  const ::ulysses::testing::DevCerts& certs = ::ulysses::testing::TestCerts();
  config->tls_cert = certs.server_cert;
  config->tls_key = certs.server_key;
  config->tls_client_ca = certs.ca;
  config->token_file = token_file;
  WriteTestTokenFile(token_file);
}

struct TestChannelOptions {
  bool tls = true;          // false: plaintext (tokens as call credentials need TLS).
  std::string token;        // "" = none.
  std::string worker_cert;  // Worker name whose client certificate to present ("" = none).
  std::string user_agent;   // A user-agent prefix ("ulyssesctl/0.1.0"); "" = gRPC's own.
  // > 0: the HTTP/2 flow-control window this client grants per stream, fixed (no BDP
  // probing): a client that does not read then stalls the server's writes at once.
  int stream_window_bytes = 0;
};

inline TestChannelOptions WithToken(const std::string& token) {
  TestChannelOptions o;
  o.token = token;
  return o;
}
inline TestChannelOptions WithWorkerCert(const std::string& name) {
  TestChannelOptions o;
  o.worker_cert = name;
  return o;
}

inline std::shared_ptr<grpc::Channel> MakeTestChannel(int port, const TestChannelOptions& o) {
  const std::string target = absl::StrCat("127.0.0.1:", port);
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // No connection sharing across identities.
  if (!o.user_agent.empty()) args.SetUserAgentPrefix(o.user_agent);
  if (o.stream_window_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, o.stream_window_bytes);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  }
  if (!o.tls) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  const ::ulysses::testing::DevCerts& certs = o.worker_cert.empty()
                                                  ? ::ulysses::testing::TestCerts()
                                                  : ::ulysses::testing::TestCerts({o.worker_cert});
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ::ulysses::testing::ReadFile(certs.ca);
  if (!o.worker_cert.empty()) {
    ssl.pem_cert_chain = ::ulysses::testing::ReadFile(certs.WorkerCert(o.worker_cert));
    ssl.pem_private_key = ::ulysses::testing::ReadFile(certs.WorkerKey(o.worker_cert));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
  if (!o.token.empty()) {
    creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(o.token));
  }
  return grpc::CreateCustomChannel(target, creds, args);
}

}  // namespace ulysses::coordinator::testing

#endif  // ULYSSES_TESTS_COORDINATOR_AUTH_CHANNEL_H_
