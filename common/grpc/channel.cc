#include "common/grpc/channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/net/host_port.h"

namespace ulysses {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;
constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kMaxServerBytes = 1024;

// Adds `authorization: Bearer <token>` and the client's version to the initial metadata of
// every call (each when set).
class CallMetadataInterceptor final : public grpc::experimental::Interceptor {
 public:
  CallMetadataInterceptor(std::string authorization, std::string version)
      : authorization_(std::move(authorization)), version_(std::move(version)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      auto* metadata = methods->GetSendInitialMetadata();
      if (!authorization_.empty()) metadata->emplace("authorization", authorization_);
      if (!version_.empty()) metadata->emplace(kVersionMetadata, version_);
    }
    methods->Proceed();
  }

 private:
  const std::string authorization_;
  const std::string version_;
};

class CallMetadataInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  CallMetadataInterceptorFactory(absl::string_view token, std::string version)
      : authorization_(token.empty() ? "" : absl::StrCat("Bearer ", token)),
        version_(std::move(version)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new CallMetadataInterceptor(authorization_, version_);  // gRPC owns and deletes it.
  }

 private:
  const std::string authorization_;
  const std::string version_;
};

// Reads a PEM file for `field` ("ca", "cert", "key"), bounded, checking it is PEM.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": cannot read \"", path, "\": ", std::strerror(errno),
        " (give the path of a PEM file; scripts/dev_certs.sh makes a development set)"));
  }
  std::string text(kMaxPemBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": \"", path, "\" is larger than ",
                                                   kMaxPemBytes, " bytes (not a PEM file)"));
  }
  if (!absl::StrContains(text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": \"", path, "\" is not PEM (no -----BEGIN line; give a PEM certificate or key)"));
  }
  return text;
}

}  // namespace

bool IsLoopbackTarget(absl::string_view server) {
  if (absl::StartsWith(server, "unix:") || absl::StartsWith(server, "unix-abstract:")) {
    return true;
  }
  if (absl::ConsumePrefix(&server, "ipv4:") || absl::ConsumePrefix(&server, "ipv6:")) {
    // A comma-separated address list: every address must be loopback.
    for (absl::string_view address : absl::StrSplit(server, ',')) {
      if (!net::IsLoopbackHost(net::HostOf(address))) return false;
    }
    return !server.empty();
  }
  if (absl::ConsumePrefix(&server, "dns:")) {
    // dns:[//authority/]host[:port]
    if (absl::ConsumePrefix(&server, "//")) server = server.substr(server.find('/') + 1);
  }
  return net::IsLoopbackHost(net::HostOf(server));
}

absl::Status ValidateToken(absl::string_view token, absl::string_view field) {
  if (token.empty() || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": a token of ", token.size(), " bytes (a token has 1..",
                     kMaxTokenBytes, " bytes; `ulysses-coordinator token create` makes one)"));
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          field,
          ": the token contains a space or non-printable character (a token is visible "
          "ASCII only; check the file holds just the token)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": cannot read \"", path, "\": ", std::strerror(errno),
        " (give the file holding the token, e.g. <state_dir>/admin.token of the coordinator)"));
  }
  std::string text(kMaxTokenBytes + 2, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  std::string token(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
  if (absl::Status status = ValidateToken(token, absl::StrCat(field, " \"", path, "\""));
      !status.ok()) {
    return status;
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ChannelOptions& options) {
  return MakeChannel(options, grpc::ChannelArguments());
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ChannelOptions& options,
                                                           const grpc::ChannelArguments& args) {
  if (options.server.empty() || options.server.size() > kMaxServerBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("server: \"", options.server,
                     "\" is empty or too long (give the coordinator's HOST:PORT)"));
  }
  for (char c : options.server) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat("server: \"", options.server,
                       "\" contains a space or control character (give HOST:PORT)"));
    }
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cert/key: cert \"", options.cert_file,
                                                   "\" and key \"", options.key_file,
                                                   "\": give both (mutual TLS) or neither"));
  }
  if (!options.cert_file.empty() && options.ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cert: \"", options.cert_file,
        "\" given without a CA (a client certificate needs TLS: give the server's CA too)"));
  }
  if (!options.token.empty()) {
    if (absl::Status status = ValidateToken(options.token, "token"); !status.ok()) return status;
  }
  for (char c : options.version) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat("version: \"", options.version,
                       "\" contains a space or control character (a release "
                       "version is MAJOR.MINOR.PATCH)"));
    }
  }

  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadPem(options.ca_file, "ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    if (!options.cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadPem(options.cert_file, "cert");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPem(options.key_file, "key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    creds = grpc::SslCredentials(ssl);
  } else {
    if (!options.insecure && !IsLoopbackTarget(options.server)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server: \"", options.server,
          "\" is not a loopback address and no CA is given: plaintext would expose the token "
          "(give the coordinator's CA for TLS: ulyssesctl `config set-context NAME --server "
          "HOST:PORT --ca CA.pem`, ulysses-worker --ca CA.pem; or, if this network is trusted, "
          "allow plaintext: ulyssesctl `config set-context NAME --insecure true`, "
          "ulysses-worker --insecure)"));
    }
    creds = grpc::InsecureChannelCredentials();
  }

  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options.token.empty() || !options.version.empty()) {
    interceptors.push_back(
        std::make_unique<CallMetadataInterceptorFactory>(options.token, options.version));
  }
  grpc::ChannelArguments with_agent = args;
  if (!options.product.empty() && !options.version.empty()) {
    with_agent.SetUserAgentPrefix(absl::StrCat(options.product, "/", options.version));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(options.server, creds, with_agent,
                                                                 std::move(interceptors));
}

}  // namespace ulysses
