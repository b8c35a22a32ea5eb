// Bearer tokens of ulysses-coordinator: the token file, its validation, lookup and
// the creation of new tokens.
//
// Token file (YAML; only SHA-256 hashes, never a token itself):
//   tokens:
//     - user: alice        # [a-z0-9]([a-z0-9-]*[a-z0-9])?, <= 63 chars
//       tenant: research   # same syntax
//       role: user         # admin | user | viewer | worker
//       sha256: <64 hex>   # sha256 of the token string
//       created: "2026-11-23T14:00:00Z"   # optional, for rotation bookkeeping
// A token is "ul_" + 43 base64url characters (32 random bytes).
#ifndef ULYSSES_COORDINATOR_AUTH_TOKENS_H_
#define ULYSSES_COORDINATOR_AUTH_TOKENS_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/auth/principal.h"

namespace ulysses::coordinator::auth {

struct TokenEntry {
  std::string user;
  std::string tenant;
  Role role = Role::kViewer;
  std::string sha256_hex;  // Lowercase.
  std::string created;     // Optional.
};

// Lowercase hex SHA-256 of `data` (OpenSSL libcrypto).
std::string Sha256Hex(const std::string& data);
// A fresh random token (RAND_bytes): "ul_" + 43 base64url characters.
absl::StatusOr<std::string> NewToken();
// `user`/`tenant` syntax; the error names `field` and the fix.
absl::Status CheckName(const std::string& field, const std::string& value);

// An immutable set of tokens (thread-safe to read).
class TokenSet {
 public:
  TokenSet() = default;
  explicit TokenSet(std::vector<TokenEntry> entries) : entries_(std::move(entries)) {}
  // The principal of `token`, or nullopt. Hashes the token and compares the digest
  // with every entry in constant time (CRYPTO_memcmp, no early exit).
  std::optional<Principal> Lookup(const std::string& token) const;
  const std::vector<TokenEntry>& entries() const { return entries_; }

 private:
  std::vector<TokenEntry> entries_;
};

// Parses and validates a token file's text; every problem is reported as
// `<source>: tokens[i].<field>: <value> <problem> (<fix>)`. Duplicate hashes are errors.
absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(const std::string& yaml_text,
                                                       const std::string& source);
absl::StatusOr<std::vector<TokenEntry>> LoadTokenFile(const std::string& path);
// Adds `entry` to the file at `path` (created with mode 0600 when missing; an existing
// file must be valid) by rewriting it atomically (temp file + rename, mode 0600).
absl::Status AppendTokenFile(const std::string& path, const TokenEntry& entry);
// `ulysses-coordinator token create`: checks user, tenant and role (errors name the flag),
// makes a new token and, when `token_file` is not empty, appends its hash there.
// Returns the token (shown once; only its hash is kept) and its entry.
absl::StatusOr<std::pair<std::string, TokenEntry>> CreateToken(const std::string& user,
                                                               const std::string& tenant,
                                                               const std::string& role,
                                                               const std::string& token_file);

// The YAML text of a token file holding `entries`.
std::string FormatTokenFile(const std::vector<TokenEntry>& entries);

}  // namespace ulysses::coordinator::auth

#endif  // ULYSSES_COORDINATOR_AUTH_TOKENS_H_
