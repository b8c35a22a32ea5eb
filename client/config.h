// ulyssesctl's client config, like a kubeconfig: named contexts, each a coordinator
// address with the CA that signs its certificate and the caller's bearer token.
//
//   current-context: local
//   contexts:
//     - name: local
//       server: 127.0.0.1:50051
//       ca: /path/ca.pem                 # absent: plaintext (loopback only, or insecure)
//       token_file: /path/admin.token    # or `token: ul_...`; relative paths are
//       insecure: false                  # relative to this file's directory
//
// Where it is read from: --config, else $ULYSSES_CONFIG, else
// ~/.config/ulysses/config.yaml ($XDG_CONFIG_HOME when set). A missing default file is
// an empty config; a file named explicitly must exist.
//
// What a call uses (ResolveConnection): the context from --context, else current-context
// (none: the defaults); server from --coordinator, else $ULYSSES_COORDINATOR, else the
// context, else 127.0.0.1:50051; token from $ULYSSES_TOKEN, else the context's token or
// token_file. A local ulysses-coordinator started without a token file writes
// <state_dir>/ulyssesctl-config.yaml for `export ULYSSES_CONFIG=...`.
#ifndef ULYSSES_CLIENT_CONFIG_H_
#define ULYSSES_CLIENT_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc/channel.h"

namespace ulysses::client {

inline constexpr char kDefaultServer[] = "127.0.0.1:50051";

struct ClientContextConfig {
  std::string name;        // [A-Za-z0-9._-], 1..63 characters, unique.
  std::string server;      // HOST:PORT. Required.
  std::string ca;          // PEM CA path (absolute once loaded); "" = plaintext.
  std::string token;       // Inline token, or
  std::string token_file;  // a file holding it (absolute once loaded). Not both.
  bool insecure = false;   // Allow plaintext to a non-loopback server.
};

struct ClientConfig {
  std::string current_context;  // "" or the name of one of `contexts`.
  std::vector<ClientContextConfig> contexts;

  // The context named `name`, or nullptr.
  const ClientContextConfig* Find(const std::string& name) const;
  ClientContextConfig* Find(const std::string& name);
  // Checks every field; all problems, one per line, each `field: value problem (fix)`.
  absl::Status Validate() const;
};

// The config path: `flag`, else $ULYSSES_CONFIG, else the default. `explicit_path` tells
// whether it was named (flag or environment) rather than defaulted.
std::string ConfigPath(const std::string& flag, bool* explicit_path = nullptr);

// Parses and validates config YAML; relative paths resolve against `base_dir`. Error
// lines are prefixed with `origin` (the file).
absl::StatusOr<ClientConfig> ParseClientConfig(const std::string& yaml, const std::string& origin,
                                               const std::string& base_dir);
// Loads `path`. A missing file is kNotFound (callers decide whether that is an error).
absl::StatusOr<ClientConfig> LoadClientConfig(const std::string& path);
// Validates and writes `config` to `path` atomically (mode 0600; parent dirs created).
absl::Status SaveClientConfig(const std::string& path, const ClientConfig& config);
std::string ClientConfigToYaml(const ClientConfig& config);

// How ulyssesctl reaches the coordinator, with where each part came from (for errors).
struct Connection {
  ChannelOptions channel;
  std::string config_path;   // "" when no config file was read.
  std::string context;       // "" when no context is used.
  std::string token_source;  // "$ULYSSES_TOKEN", "context NAME (token_file F)", or "".
};

struct ConnectionFlags {
  std::string config;       // --config
  std::string context;      // --context
  std::string coordinator;  // --coordinator
};

// Applies the precedence above (reads the environment, the config and the token file).
absl::StatusOr<Connection> ResolveConnection(const ConnectionFlags& flags);

// What to do about an UNAUTHENTICATED answer, given what was sent: "" for other codes.
std::string AuthHint(const absl::Status& status, const Connection& connection);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_CONFIG_H_
