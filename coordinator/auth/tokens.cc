#include "coordinator/auth/tokens.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/private_file.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::coordinator::auth {
namespace {

constexpr size_t kMaxNameLen = 63;
constexpr size_t kMaxTokenFileBytes = 16 << 20;

std::string Digest(const std::string& data) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), md);
  return std::string(reinterpret_cast<const char*>(md), sizeof(md));
}

}  // namespace

std::string Sha256Hex(const std::string& data) { return absl::BytesToHexString(Digest(data)); }

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("token: the OpenSSL random generator failed (RAND_bytes)");
  }
  std::string b64;
  absl::WebSafeBase64Escape(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)),
                            &b64);  // Unpadded: 43 characters.
  return "ul_" + b64;
}

absl::Status CheckName(const std::string& field, const std::string& value) {
  bool ok = !value.empty() && value.size() <= kMaxNameLen;
  for (size_t i = 0; ok && i < value.size(); ++i) {
    char c = value[i];
    bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    ok = alnum || (c == '-' && i != 0 && i + 1 != value.size());
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": \"", absl::CHexEscape(value.substr(0, 80)),
                   "\" is not a name (use 1..63 of [a-z0-9-], starting and ending alphanumeric)"));
}

std::optional<Principal> TokenSet::Lookup(const std::string& token) const {
  const std::string digest = Digest(token);
  std::optional<Principal> found;
  for (const TokenEntry& e : entries_) {
    const std::string want = absl::HexStringToBytes(e.sha256_hex);  // Validated at parse.
    if (want.size() != digest.size()) continue;
    // Constant time in the digest; every entry is compared (no early exit).
    bool match = CRYPTO_memcmp(want.data(), digest.data(), digest.size()) == 0;
    if (match && !found) found = Principal{e.user, e.tenant, e.role, false, e.sha256_hex};
  }
  return found;
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(const std::string& yaml_text,
                                                       const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not valid YAML (", e.what(), "; see docs/SECURITY.md)"));
  }
  if (!root.IsMap() || !root["tokens"]) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": top level must be a mapping with a `tokens:` list (see docs/SECURITY.md)"));
  }
  std::vector<std::string> errors;
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>("");
    if (key != "tokens") errors.push_back(absl::StrCat(key, ": unknown key (only `tokens`)"));
  }
  const YAML::Node list = root["tokens"];
  std::vector<TokenEntry> entries;
  if (!list.IsNull() && !list.IsSequence()) {
    errors.push_back("tokens: must be a list of {user, tenant, role, sha256}");
  }
  std::set<std::string> hashes;
  for (size_t i = 0; list.IsSequence() && i < list.size(); ++i) {
    const std::string at = absl::StrCat("tokens[", i, "]");
    const YAML::Node n = list[i];
    if (!n.IsMap()) {
      errors.push_back(absl::StrCat(at, ": must be a mapping {user, tenant, role, sha256}"));
      continue;
    }
    TokenEntry e;
    std::string role;
    for (const auto& f : n) {
      std::string key = f.first.as<std::string>("");
      if (!f.second.IsScalar()) {
        errors.push_back(absl::StrCat(at, ".", key, ": must be a string"));
        continue;
      }
      std::string value = f.second.as<std::string>();
      if (key == "user") {
        e.user = value;
      } else if (key == "tenant") {
        e.tenant = value;
      } else if (key == "role") {
        role = value;
      } else if (key == "sha256") {
        e.sha256_hex = absl::AsciiStrToLower(value);
      } else if (key == "created") {
        e.created = value;
      } else {
        errors.push_back(absl::StrCat(
            at, ".", key, ": unknown key (known: user, tenant, role, sha256, created)"));
      }
    }
    if (absl::Status s = CheckName(at + ".user", e.user); !s.ok()) {
      errors.push_back(std::string(s.message()));
    }
    if (absl::Status s = CheckName(at + ".tenant", e.tenant); !s.ok()) {
      errors.push_back(std::string(s.message()));
    }
    if (std::optional<Role> r = ParseRole(role)) {
      e.role = *r;
    } else {
      errors.push_back(absl::StrCat(at, ".role: \"", absl::CHexEscape(role.substr(0, 80)),
                                    "\" is not a role (use admin, user, viewer or worker)"));
    }
    bool hex = e.sha256_hex.size() == 64;
    for (char c : e.sha256_hex) hex = hex && absl::ascii_isxdigit(c);
    if (!hex) {
      errors.push_back(absl::StrCat(at, ".sha256: \"", absl::CHexEscape(e.sha256_hex.substr(0, 80)),
                                    "\" is not 64 hex characters (store sha256 of the token, "
                                    "e.g. `ulysses-coordinator token create`)"));
    } else if (!hashes.insert(e.sha256_hex).second) {
      errors.push_back(absl::StrCat(at, ".sha256: ", e.sha256_hex,
                                    " appears twice (one token maps to one principal; "
                                    "remove the duplicate)"));
    }
    entries.push_back(std::move(e));
  }
  if (!errors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", absl::StrJoin(errors, absl::StrCat("\n", source, ": "))));
  }
  return entries;
}

absl::StatusOr<std::vector<TokenEntry>> LoadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("token_file: \"", path, "\" cannot be read (",
                                                   std::strerror(errno), "; check the path)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().size() > kMaxTokenFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_file: \"", path, "\" is larger than 16 MiB (not a token file?)"));
  }
  return ParseTokenFile(ss.str(), path);
}

std::string FormatTokenFile(const std::vector<TokenEntry>& entries) {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "tokens" << YAML::Value << YAML::BeginSeq;
  for (const TokenEntry& e : entries) {
    out << YAML::BeginMap;
    out << YAML::Key << "user" << YAML::Value << e.user;
    out << YAML::Key << "tenant" << YAML::Value << e.tenant;
    out << YAML::Key << "role" << YAML::Value << RoleName(e.role);
    out << YAML::Key << "sha256" << YAML::Value << e.sha256_hex;
    if (!e.created.empty()) out << YAML::Key << "created" << YAML::Value << e.created;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

absl::Status AppendTokenFile(const std::string& path, const TokenEntry& entry) {
  std::vector<TokenEntry> entries;
  if (access(path.c_str(), F_OK) == 0) {
    absl::StatusOr<std::vector<TokenEntry>> existing = LoadTokenFile(path);
    if (!existing.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(existing.status().message(), "\n(fix the file before adding a token)"));
    }
    entries = std::move(*existing);
  }
  entries.push_back(entry);
  // Validate what we are about to write (user/tenant syntax, duplicate hash).
  const std::string text = FormatTokenFile(entries);
  if (absl::StatusOr<std::vector<TokenEntry>> check = ParseTokenFile(text, path); !check.ok()) {
    return check.status();
  }
  if (absl::Status s = WritePrivateFile(path, text); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--token-file: ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, TokenEntry>> CreateToken(const std::string& user,
                                                               const std::string& tenant,
                                                               const std::string& role,
                                                               const std::string& token_file) {
  std::vector<std::string> errors;
  if (absl::Status s = CheckName("--user", user); !s.ok()) errors.emplace_back(s.message());
  if (absl::Status s = CheckName("--tenant", tenant); !s.ok()) errors.emplace_back(s.message());
  std::optional<Role> r = ParseRole(role);
  if (!r) {
    errors.push_back(absl::StrCat("--role: \"", absl::CHexEscape(role.substr(0, 80)),
                                  "\" is not a role (use admin, user, viewer or worker)"));
  }
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  absl::StatusOr<std::string> token = NewToken();
  if (!token.ok()) return token.status();
  TokenEntry e{user, tenant, *r, Sha256Hex(*token),
               absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())};
  if (!token_file.empty()) {
    if (absl::Status s = AppendTokenFile(token_file, e); !s.ok()) return s;
  }
  return std::make_pair(*token, e);
}

}  // namespace ulysses::coordinator::auth
