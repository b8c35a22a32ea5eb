// `ulyssesctl config`: get-contexts, current-context, use-context, set-context on the
// client config (client/config.h).
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/config.h"
#include "common/contract/exit.h"
#include "common/grpc/channel.h"
#include "nlohmann/json.hpp"

namespace ulysses::client {
namespace {

namespace fs = std::filesystem;

struct ConfigArgs {
  std::string name;
  std::string server, ca, token_file;
  bool insecure = false;
};

// Loads the config for a config verb: a missing file is an empty config when
// `missing_ok`. Prints the error and sets the exit code otherwise.
std::optional<ClientConfig> LoadForVerb(CliContext& ctx, const std::string& path, bool missing_ok) {
  absl::StatusOr<ClientConfig> config = LoadClientConfig(path);
  if (config.ok()) return *std::move(config);
  if (config.status().code() == absl::StatusCode::kNotFound && missing_ok) return ClientConfig();
  std::string message(config.status().message());
  if (config.status().code() == absl::StatusCode::kNotFound) {
    absl::StrAppend(&message,
                    " (create it with `ulyssesctl config set-context NAME --server HOST:PORT`)");
  }
  PrintErrorLines(ctx, "error", message);
  ctx.exit_code = contract::kExitBadInput;
  return std::nullopt;
}

bool Save(CliContext& ctx, const std::string& path, const ClientConfig& config) {
  if (absl::Status status = SaveClientConfig(path, config); !status.ok()) {
    PrintErrorLines(ctx, "error", status.message());
    ctx.exit_code = contract::ExitCodeFor(status);
    return false;
  }
  return true;
}

std::string TokenText(const ClientContextConfig& c) {
  if (!c.token_file.empty()) return "file:" + c.token_file;
  if (!c.token.empty()) return "(inline)";
  return "-";
}

void GetContexts(CliContext& ctx) {
  const std::string path = ConfigPath(ctx.config);
  std::optional<ClientConfig> config = LoadForVerb(ctx, path, /*missing_ok=*/true);
  if (!config) return;
  if (ctx.output == "json" || ctx.output == "yaml") {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& c : config->contexts) {
      list.push_back({{"name", c.name},
                      {"current", c.name == config->current_context},
                      {"server", c.server},
                      {"ca", c.ca},
                      {"token", TokenText(c)},
                      {"insecure", c.insecure}});
    }
    *ctx.out << (ctx.output == "yaml" ? JsonToYaml(list) : list.dump(2) + "\n");
    return;
  }
  if (config->contexts.empty()) {
    *ctx.out << "No contexts in " << path
             << " (add one: ulyssesctl config set-context NAME --server HOST:PORT)\n";
    return;
  }
  size_t name_w = 4, server_w = 6;
  for (const auto& c : config->contexts) {
    name_w = std::max(name_w, c.name.size());
    server_w = std::max(server_w, c.server.size());
  }
  *ctx.out << std::left << std::setw(8) << "CURRENT" << std::setw(name_w + 2) << "NAME"
           << std::setw(server_w + 2) << "SERVER" << std::setw(11) << "TRANSPORT"
           << "TOKEN\n";
  for (const auto& c : config->contexts) {
    const std::string transport = !c.ca.empty() ? "tls" : c.insecure ? "plaintext!" : "plaintext";
    *ctx.out << std::left << std::setw(8) << (c.name == config->current_context ? "*" : "")
             << std::setw(name_w + 2) << c.name << std::setw(server_w + 2) << c.server
             << std::setw(11) << transport << TokenText(c) << "\n";
  }
}

void CurrentContext(CliContext& ctx) {
  const std::string path = ConfigPath(ctx.config);
  std::optional<ClientConfig> config = LoadForVerb(ctx, path, /*missing_ok=*/true);
  if (!config) return;
  if (config->current_context.empty()) {
    *ctx.err << "error: " << path
             << ": no current-context (run `ulyssesctl config use-context NAME`)\n";
    ctx.exit_code = contract::kExitFailure;
    return;
  }
  *ctx.out << config->current_context << "\n";
}

void UseContext(CliContext& ctx, const std::string& name) {
  const std::string path = ConfigPath(ctx.config);
  std::optional<ClientConfig> config = LoadForVerb(ctx, path, /*missing_ok=*/false);
  if (!config) return;
  if (config->Find(name) == nullptr) {
    std::vector<std::string> names;
    for (const auto& c : config->contexts) names.push_back(c.name);
    *ctx.err << "error: use-context: \"" << name << "\" is not in " << path
             << " (have: " << (names.empty() ? "none" : absl::StrJoin(names, ", "))
             << "; add it with `ulyssesctl config set-context " << name
             << " --server HOST:PORT`)\n";
    ctx.exit_code = contract::kExitBadInput;
    return;
  }
  config->current_context = name;
  if (!Save(ctx, path, *config)) return;
  *ctx.out << "Switched to context \"" << name << "\" (" << path << ").\n";
}

void SetContext(CliContext& ctx, const ConfigArgs& args, bool server_set, bool ca_set,
                bool token_file_set, bool insecure_set) {
  const std::string path = ConfigPath(ctx.config);
  std::optional<ClientConfig> config = LoadForVerb(ctx, path, /*missing_ok=*/true);
  if (!config) return;
  // Files must be readable now, not at the first call; stored absolute.
  std::string ca, token_file;
  if (ca_set && !args.ca.empty()) {
    ca = fs::absolute(args.ca).lexically_normal().string();
    if (!std::ifstream(ca)) {
      *ctx.err << "error: --ca: cannot read \"" << ca
               << "\" (give the PEM CA of the coordinator's certificate)\n";
      ctx.exit_code = contract::kExitBadInput;
      return;
    }
  }
  if (token_file_set && !args.token_file.empty()) {
    token_file = fs::absolute(args.token_file).lexically_normal().string();
    if (absl::StatusOr<std::string> token = ReadTokenFile(token_file, "--token-file");
        !token.ok()) {
      PrintErrorLines(ctx, "error", token.status().message());
      ctx.exit_code = contract::kExitBadInput;
      return;
    }
  }
  ClientContextConfig* c = config->Find(args.name);
  const bool created = c == nullptr;
  if (created) {
    if (!server_set) {
      *ctx.err << "error: set-context: context \"" << args.name
               << "\" is new: --server is required (give the coordinator's HOST:PORT)\n";
      ctx.exit_code = contract::kExitBadInput;
      return;
    }
    config->contexts.push_back(ClientContextConfig());
    c = &config->contexts.back();
    c->name = args.name;
  }
  if (server_set) c->server = args.server;
  if (ca_set) c->ca = ca;
  if (token_file_set) {
    c->token_file = token_file;
    c->token.clear();
  }
  if (insecure_set) c->insecure = args.insecure;
  if (config->current_context.empty()) config->current_context = args.name;
  if (!Save(ctx, path, *config)) return;
  *ctx.out << "Context \"" << args.name << "\" " << (created ? "created" : "modified") << " in "
           << path << " (current: " << config->current_context << ").\n";
}

}  // namespace

void AddConfigCommand(CLI::App& app, CliContext& ctx) {
  CLI::App* cmd =
      app.add_subcommand("config", "Show or change the client config (contexts, credentials)");
  cmd->require_subcommand(1);
  cmd->footer(
      "The config (--config, else $ULYSSES_CONFIG, else ~/.config/ulysses/config.yaml):\n"
      "  current-context: local\n"
      "  contexts:\n"
      "    - name: local\n"
      "      server: 127.0.0.1:50051\n"
      "      ca: /path/ca.pem               # TLS; absent: plaintext (loopback only)\n"
      "      token_file: /path/admin.token  # or token: ul_...\n"
      "Precedence: --coordinator / $ULYSSES_COORDINATOR override the server,\n"
      "$ULYSSES_TOKEN overrides the token, --context picks a context.\n"
      "A local ulysses-coordinator started without a token file writes\n"
      "<state_dir>/ulyssesctl-config.yaml: export ULYSSES_CONFIG=<that file>.\n"
      "Examples:\n"
      "  ulyssesctl config get-contexts\n"
      "  ulyssesctl config set-context prod --server coord.example:50051 --ca ca.pem "
      "--token-file ~/.ulysses-token\n"
      "  ulyssesctl config use-context prod\n");

  CLI::App* get = cmd->add_subcommand("get-contexts", "List the contexts (* = current)");
  get->callback([&ctx] { GetContexts(ctx); });

  CLI::App* current = cmd->add_subcommand("current-context", "Print the current context");
  current->callback([&ctx] { CurrentContext(ctx); });

  auto use_name = std::make_shared<std::string>();
  CLI::App* use = cmd->add_subcommand("use-context", "Make a context the current one");
  use->add_option("name", *use_name, "Context name")->required();
  use->callback([&ctx, use_name] { UseContext(ctx, *use_name); });

  auto args = std::make_shared<ConfigArgs>();
  CLI::App* set = cmd->add_subcommand("set-context",
                                      "Create or change a context (the first one becomes current)");
  set->add_option("name", args->name, "Context name ([A-Za-z0-9._-], at most 63)")->required();
  CLI::Option* server = set->add_option("--server", args->server, "Coordinator HOST:PORT");
  CLI::Option* ca =
      set->add_option("--ca", args->ca, "PEM CA of the coordinator's certificate (TLS)");
  CLI::Option* token_file =
      set->add_option("--token-file", args->token_file, "File holding the bearer token");
  CLI::Option* insecure = set->add_option("--insecure", args->insecure,
                                          "true: allow plaintext to a non-loopback server");
  set->footer(
      "Paths are stored absolute; the files must be readable. Tokens are never taken on the\n"
      "command line (shell history): put the token in a file (mode 0600).\n"
      "Example: ulyssesctl config set-context local --server 127.0.0.1:50051 "
      "--token-file state/admin.token\n");
  set->callback([&ctx, args, server, ca, token_file, insecure] {
    SetContext(ctx, *args, server->count() > 0, ca->count() > 0, token_file->count() > 0,
               insecure->count() > 0);
  });
}

}  // namespace ulysses::client
