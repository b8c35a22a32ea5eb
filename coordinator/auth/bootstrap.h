// First-start credentials of a coordinator without a token file: an admin token in
// <state_dir>/admin.token (mode 0600, one line) and a ulyssesctl config
// <state_dir>/ulyssesctl-config.yaml with one context `local`, so a local run works
// with no extra step (`export ULYSSES_CONFIG=<state_dir>/ulyssesctl-config.yaml`).
#ifndef ULYSSES_COORDINATOR_AUTH_BOOTSTRAP_H_
#define ULYSSES_COORDINATOR_AUTH_BOOTSTRAP_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/auth/tokens.h"

namespace ulysses::coordinator::auth {

inline constexpr char kAdminTokenFile[] = "admin.token";
inline constexpr char kClientConfigFile[] = "ulyssesctl-config.yaml";
inline constexpr char kBootstrapUser[] = "admin";
inline constexpr char kBootstrapTenant[] = "default";

// Reads <state_dir>/admin.token, or creates it (0600) with a new token. Returns the
// token's entry (user admin, tenant default, role admin). A file that is not a token
// (or is readable by others) is an error naming the fix.
absl::StatusOr<TokenEntry> EnsureAdminToken(const std::string& state_dir);

// Writes <state_dir>/ulyssesctl-config.yaml (0600): context `local` with `server`,
// `ca` (omitted when empty) and `token_file` = <state_dir>/admin.token (paths made
// absolute).
// Returns the path.
absl::StatusOr<std::string> WriteClientConfig(const std::string& state_dir,
                                              const std::string& server, const std::string& ca);

}  // namespace ulysses::coordinator::auth

#endif  // ULYSSES_COORDINATOR_AUTH_BOOTSTRAP_H_
