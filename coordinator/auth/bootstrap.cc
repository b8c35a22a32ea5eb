#include "coordinator/auth/bootstrap.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/private_file.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::coordinator::auth {

absl::StatusOr<TokenEntry> EnsureAdminToken(const std::string& state_dir) {
  const std::string path = absl::StrCat(state_dir, "/", kAdminTokenFile);
  std::string token;
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if ((st.st_mode & 077) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": mode ", absl::Hex(st.st_mode & 0777),
                       " lets others read the admin token (chmod 600 it, or delete it to get "
                       "a new token)"));
    }
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    token = std::string(absl::StripAsciiWhitespace(ss.str()));
    if (token.size() < 16 || token.size() > 256 ||
        token.find_first_of(" \t\n") != std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": does not hold one token (delete it to get a new admin token at start)"));
    }
  } else {
    absl::StatusOr<std::string> fresh = NewToken();
    if (!fresh.ok()) return fresh.status();
    token = *fresh;
    if (absl::Status s = WritePrivateFile(path, token + "\n"); !s.ok()) return s;
  }
  TokenEntry e;
  e.user = kBootstrapUser;
  e.tenant = kBootstrapTenant;
  e.role = Role::kAdmin;
  e.sha256_hex = Sha256Hex(token);
  return e;
}

absl::StatusOr<std::string> WriteClientConfig(const std::string& state_dir,
                                              const std::string& server, const std::string& ca) {
  const std::string path = absl::StrCat(state_dir, "/", kClientConfigFile);
  // Absolute paths: the config is used from any working directory.
  std::error_code ec;
  const std::string abs_dir = std::filesystem::absolute(state_dir, ec).lexically_normal().string();
  const std::string abs_ca = ca.empty() ? "" : std::filesystem::absolute(ca, ec).string();
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "current-context" << YAML::Value << "local";
  out << YAML::Key << "contexts" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << "local";
  out << YAML::Key << "server" << YAML::Value << server;
  if (!abs_ca.empty()) out << YAML::Key << "ca" << YAML::Value << abs_ca;
  out << YAML::Key << "token_file" << YAML::Value << absl::StrCat(abs_dir, "/", kAdminTokenFile);
  out << YAML::EndMap << YAML::EndSeq << YAML::EndMap;
  if (absl::Status s = WritePrivateFile(path, std::string(out.c_str()) + "\n"); !s.ok()) return s;
  return path;
}

}  // namespace ulysses::coordinator::auth
