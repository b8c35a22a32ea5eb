#include "client/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/metrics/build_info.h"
#include "common/private_file.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::client {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxConfigBytes = 1 << 20;
constexpr size_t kMaxContexts = 256;

const char kSetContextHint[] =
    "ulyssesctl config set-context NAME --server HOST:PORT --ca CA.pem --token-file FILE";

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

std::string Resolve(const std::string& path, const std::string& base_dir) {
  if (path.empty() || fs::path(path).is_absolute() || base_dir.empty()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

// Reads a scalar string field; records a problem when it is not a scalar.
std::string Scalar(const YAML::Node& node, const std::string& field,
                   std::vector<std::string>* problems) {
  if (!node.IsScalar()) {
    problems->push_back(absl::StrCat(field, ": is not a string (write `", field, ": VALUE`)"));
    return "";
  }
  return node.Scalar();
}

}  // namespace

const ClientContextConfig* ClientConfig::Find(const std::string& name) const {
  for (const auto& c : contexts) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

ClientContextConfig* ClientConfig::Find(const std::string& name) {
  for (auto& c : contexts) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

absl::Status ClientConfig::Validate() const {
  std::vector<std::string> problems;
  std::set<std::string> names;
  if (contexts.size() > kMaxContexts) {
    problems.push_back(absl::StrCat("contexts: ", contexts.size(), " contexts (at most ",
                                    kMaxContexts, "; remove unused ones)"));
  }
  for (size_t i = 0; i < contexts.size(); ++i) {
    const ClientContextConfig& c = contexts[i];
    const std::string at = absl::StrCat("contexts[", i, "]");
    if (!ValidName(c.name)) {
      problems.push_back(absl::StrCat(at, ".name: ", Quoted(c.name),
                                      " is not a context name (use 1..63 of [A-Za-z0-9._-])"));
    } else if (!names.insert(c.name).second) {
      problems.push_back(absl::StrCat(at, ".name: ", Quoted(c.name),
                                      " is used twice (give each context its own name)"));
    }
    if (c.server.empty()) {
      problems.push_back(
          absl::StrCat(at, ".server: is missing (give the coordinator's HOST:PORT)"));
    } else if (c.server.size() > 1024 || c.server.find_first_of(" \t\r\n") != std::string::npos) {
      problems.push_back(absl::StrCat(at, ".server: ", Quoted(c.server),
                                      " is not HOST:PORT (give the coordinator's address)"));
    }
    if (!c.token.empty() && !c.token_file.empty()) {
      problems.push_back(absl::StrCat(at, ".token: both token and token_file are set (keep one)"));
    }
    if (!c.token.empty()) {
      if (absl::Status s = ValidateToken(c.token, at + ".token"); !s.ok()) {
        problems.emplace_back(s.message());
      }
    }
    if (!c.ca.empty() && c.insecure) {
      problems.push_back(absl::StrCat(at, ".insecure: true with ca ", Quoted(c.ca),
                                      " (ca means TLS, insecure means plaintext: drop one)"));
    }
  }
  if (!current_context.empty() && Find(current_context) == nullptr) {
    std::vector<std::string> all;
    for (const auto& c : contexts) all.push_back(c.name);
    problems.push_back(
        absl::StrCat("current-context: ", Quoted(current_context),
                     " names no context (have: ", all.empty() ? "none" : absl::StrJoin(all, ", "),
                     "; run `ulyssesctl config use-context NAME`)"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

std::string ConfigPath(const std::string& flag, bool* explicit_path) {
  if (explicit_path != nullptr) *explicit_path = true;
  if (!flag.empty()) return flag;
  const char* env = std::getenv("ULYSSES_CONFIG");
  if (env != nullptr && *env != '\0') return env;
  if (explicit_path != nullptr) *explicit_path = false;
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && *xdg != '\0') return absl::StrCat(xdg, "/ulysses/config.yaml");
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : "", "/.config/ulysses/config.yaml");
}

absl::StatusOr<ClientConfig> ParseClientConfig(const std::string& yaml, const std::string& origin,
                                               const std::string& base_dir) {
  auto error = [&origin](const std::string& text) {
    std::string out;
    for (size_t start = 0; start < text.size();) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      absl::StrAppend(&out, out.empty() ? "" : "\n", origin, ": ", text.substr(start, end - start));
      start = end + 1;
    }
    return absl::InvalidArgumentError(out);
  };
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return error(absl::StrCat("line ", e.mark.line + 1, ": not YAML: ", e.msg,
                              " (fix the syntax; `ulyssesctl config --help` shows the format)"));
  }
  ClientConfig config;
  if (root.IsNull()) return config;  // An empty file is an empty config.
  if (!root.IsMap()) {
    return error("the file is not a mapping (expected `current-context:` and `contexts:`)");
  }
  std::vector<std::string> problems;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>("");
    if (key == "current-context") {
      config.current_context = Scalar(kv.second, key, &problems);
    } else if (key == "contexts") {
      if (kv.second.IsNull()) continue;
      if (!kv.second.IsSequence()) {
        problems.push_back("contexts: is not a list (write `contexts:` then `- name: ...` items)");
        continue;
      }
      for (size_t i = 0; i < kv.second.size(); ++i) {
        const YAML::Node item = kv.second[i];
        const std::string at = absl::StrCat("contexts[", i, "]");
        if (!item.IsMap()) {
          problems.push_back(at + ": is not a mapping (give name, server, ca, token_file)");
          continue;
        }
        ClientContextConfig c;
        for (const auto& field : item) {
          const std::string name = field.first.as<std::string>("");
          const std::string path = absl::StrCat(at, ".", name);
          if (name == "name") {
            c.name = Scalar(field.second, path, &problems);
          } else if (name == "server") {
            c.server = Scalar(field.second, path, &problems);
          } else if (name == "ca") {
            c.ca = Resolve(Scalar(field.second, path, &problems), base_dir);
          } else if (name == "token") {
            c.token = Scalar(field.second, path, &problems);
          } else if (name == "token_file") {
            c.token_file = Resolve(Scalar(field.second, path, &problems), base_dir);
          } else if (name == "insecure") {
            const std::string v = Scalar(field.second, path, &problems);
            if (v == "true" || v == "false") {
              c.insecure = v == "true";
            } else {
              problems.push_back(absl::StrCat(path, ": ", Quoted(v), " is not true or false"));
            }
          } else {
            problems.push_back(
                absl::StrCat(path,
                             ": unknown field (a context has name, server, ca, token, token_file, "
                             "insecure)"));
          }
        }
        config.contexts.push_back(std::move(c));
      }
    } else {
      problems.push_back(absl::StrCat(
          Quoted(key), ": unknown field (the config has current-context and contexts)"));
    }
  }
  if (problems.empty()) {
    if (absl::Status status = config.Validate(); !status.ok()) {
      return error(std::string{status.message()});
    }
    return config;
  }
  return error(absl::StrJoin(problems, "\n"));
}

absl::StatusOr<ClientConfig> LoadClientConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string message = absl::StrCat(path, ": cannot read: ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    return absl::InvalidArgumentError(message + " (check the file's permissions)");
  }
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": larger than ", kMaxConfigBytes, " bytes (not a ulyssesctl config)"));
  }
  return ParseClientConfig(text, path, fs::path(path).parent_path().string());
}

std::string ClientConfigToYaml(const ClientConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "current-context" << YAML::Value << config.current_context;
  out << YAML::Key << "contexts" << YAML::Value << YAML::BeginSeq;
  for (const auto& c : config.contexts) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << c.name;
    out << YAML::Key << "server" << YAML::Value << c.server;
    if (!c.ca.empty()) out << YAML::Key << "ca" << YAML::Value << c.ca;
    if (!c.token.empty()) out << YAML::Key << "token" << YAML::Value << c.token;
    if (!c.token_file.empty()) out << YAML::Key << "token_file" << YAML::Value << c.token_file;
    if (c.insecure) out << YAML::Key << "insecure" << YAML::Value << true;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

absl::Status SaveClientConfig(const std::string& path, const ClientConfig& config) {
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": cannot create its directory: ", ec.message(), " (pick another --config)"));
  }
  absl::Status written = WritePrivateFile(path, ClientConfigToYaml(config));
  if (!written.ok()) {
    return absl::Status(written.code(), absl::StrCat(written.message(),
                                                     " (pick another --config; the old file, "
                                                     "if any, is unchanged)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Connection> ResolveConnection(const ConnectionFlags& flags) {
  Connection conn;
  bool explicit_path = false;
  const std::string path = ConfigPath(flags.config, &explicit_path);
  ClientConfig config;
  absl::StatusOr<ClientConfig> loaded = LoadClientConfig(path);
  if (loaded.ok()) {
    config = *std::move(loaded);
    conn.config_path = path;
  } else if (loaded.status().code() != absl::StatusCode::kNotFound || explicit_path) {
    std::string message(loaded.status().message());
    if (loaded.status().code() == absl::StatusCode::kNotFound) {
      absl::StrAppend(&message, " (the config named by ",
                      flags.config.empty() ? "$ULYSSES_CONFIG" : "--config",
                      " must exist; create it with `", kSetContextHint, "`)");
    }
    return absl::InvalidArgumentError(message);
  }

  const ClientContextConfig* context = nullptr;
  if (!flags.context.empty()) {
    context = config.Find(flags.context);
    if (context == nullptr) {
      std::vector<std::string> names;
      for (const auto& c : config.contexts) names.push_back(c.name);
      return absl::InvalidArgumentError(
          absl::StrCat("--context: ", Quoted(flags.context), " is not in ",
                       conn.config_path.empty() ? path + " (no such file)" : conn.config_path,
                       " (have: ", names.empty() ? "none" : absl::StrJoin(names, ", "),
                       "; add it with `", kSetContextHint, "`)"));
    }
  } else if (!config.current_context.empty()) {
    context = config.Find(config.current_context);
  }

  ChannelOptions& ch = conn.channel;
  ch.version = metrics::BuildVersion();  // Checked by the coordinator's version policy.
  ch.product = kClientProduct;           // Which makes the version header required.
  if (context != nullptr) {
    conn.context = context->name;
    ch.server = context->server;
    ch.ca_file = context->ca;
    ch.insecure = context->insecure;
  }
  const char* env_server = std::getenv("ULYSSES_COORDINATOR");
  if (!flags.coordinator.empty()) {
    ch.server = flags.coordinator;
  } else if (env_server != nullptr && *env_server != '\0') {
    ch.server = env_server;
  } else if (ch.server.empty()) {
    ch.server = kDefaultServer;
  }

  const char* env_token = std::getenv("ULYSSES_TOKEN");
  if (env_token != nullptr && *env_token != '\0') {
    if (absl::Status s = ValidateToken(env_token, "$ULYSSES_TOKEN"); !s.ok()) return s;
    ch.token = env_token;
    conn.token_source = "$ULYSSES_TOKEN";
  } else if (context != nullptr && !context->token.empty()) {
    ch.token = context->token;
    conn.token_source = absl::StrCat("context ", context->name, " (token)");
  } else if (context != nullptr && !context->token_file.empty()) {
    const size_t index = static_cast<size_t>(context - config.contexts.data());
    absl::StatusOr<std::string> token = ReadTokenFile(
        context->token_file, absl::StrCat(conn.config_path, ": contexts[", index, "].token_file"));
    if (!token.ok()) return token.status();
    ch.token = *std::move(token);
    conn.token_source =
        absl::StrCat("context ", context->name, " (token_file ", context->token_file, ")");
  }
  return conn;
}

std::string AuthHint(const absl::Status& status, const Connection& connection) {
  if (status.code() != absl::StatusCode::kUnauthenticated) return "";
  if (connection.channel.token.empty()) {
    return absl::StrCat("no token was sent: set ULYSSES_TOKEN, or run `", kSetContextHint,
                        "` (a local coordinator writes <state_dir>/ulyssesctl-config.yaml: export "
                        "ULYSSES_CONFIG=<that file>)");
  }
  return absl::StrCat("the token from ", connection.token_source,
                      " was refused: check it is current (`ulysses-coordinator token create` "
                      "issues a new one)");
}

}  // namespace ulysses::client
