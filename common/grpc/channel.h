// MakeChannel: the one way a Ulysses client (ulyssesctl, ulysses-worker) opens a gRPC
// channel to the coordinator.
//
// - TLS when `ca_file` is set: the server certificate must chain to that CA and name
//   the host dialled (DNS or IP SAN). With `cert_file` + `key_file` the client also
//   presents a certificate (mutual TLS: how workers prove their name).
// - Plaintext only when the server is on loopback (127.0.0.0/8, ::1, localhost, or a
//   unix: socket) or `insecure` is set; anything else is refused with the fix.
// - `token` is sent on every call as `authorization: Bearer <token>` metadata. A
//   client interceptor adds it, not gRPC call credentials: those are dropped on
//   plaintext channels, and the coordinator requires tokens in every mode.
// - `version` (the client's release, metrics::BuildVersion()) is sent on every call as
//   `ulysses-version` metadata (kVersionMetadata): the coordinator refuses versions outside
//   its policy (coordinator/version_policy.h).
//
// Files are read once, here; errors name the field, the value and the fix. Stateless
// and thread-safe; the channel is shared by every stub made from it.
#ifndef ULYSSES_COMMON_GRPC_CHANNEL_H_
#define ULYSSES_COMMON_GRPC_CHANNEL_H_

#include <grpcpp/channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ulysses {

// The metadata key that carries a client's release version (MAJOR.MINOR.PATCH).
inline constexpr char kVersionMetadata[] = "ulysses-version";
// ulyssesctl's product name in its user-agent ("ulyssesctl/<version> grpc-c++/...").
inline constexpr char kClientProduct[] = "ulyssesctl";

struct ChannelOptions {
  std::string server;     // HOST:PORT, [V6]:PORT or a gRPC target (dns:///, ipv4:, unix:).
  std::string ca_file;    // PEM CA of the server certificate; "" = plaintext.
  std::string cert_file;  // PEM client certificate (mutual TLS); needs key_file and ca_file.
  std::string key_file;   // PEM private key of cert_file.
  std::string token;      // Bearer token sent on every call; "" = none.
  bool insecure = false;  // Allow plaintext to a non-loopback server.
  std::string version;    // Sent as kVersionMetadata on every call; "" = none.
  // The client's name ("ulyssesctl"): with `version`, the user-agent starts with
  // "<product>/<version>", and a coordinator refuses a call from that product without its
  // version header (coordinator/version_policy.h). "" = a plain gRPC user-agent.
  std::string product;
};

// Checks `options` and builds the channel (it connects lazily). `args` are extra
// channel arguments (reconnect backoff, message sizes).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ChannelOptions& options);
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ChannelOptions& options,
                                                           const grpc::ChannelArguments& args);

// True when `server` (as in ChannelOptions) is a loopback address or a unix socket.
bool IsLoopbackTarget(absl::string_view server);

// Reads a token file: the first line, surrounding whitespace trimmed. Errors name
// `field` ("--token-file", "contexts[0].token_file") and the path.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view field);

// A token must be 1..4096 visible ASCII characters (it travels as a header value).
absl::Status ValidateToken(absl::string_view token, absl::string_view field);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_GRPC_CHANNEL_H_
