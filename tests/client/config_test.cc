// The ulyssesctl client config (client/config.h): parsing and validation, saving,
// the precedence of flags, environment and context, and ulyssesctl itself (in-process
// RunCli) sending the context's credentials to a real gRPC server over TLS.
#include "client/config.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "client/cli.h"
#include "client/grpc_client.h"
#include "common/metrics/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"
#include "tests/testing/recording_server.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::client {
namespace {

using ::testing::HasSubstr;

// Sets (or, for nullopt, unsets) environment variables for one test and restores them.
using EnvVars = std::map<std::string, std::optional<std::string>>;

class ScopedEnv {
 public:
  explicit ScopedEnv(const EnvVars& vars) {
    for (const auto& [key, value] : vars) {
      const char* old = std::getenv(key.c_str());
      saved_[key] = old == nullptr ? std::nullopt : std::optional<std::string>(old);
      Set(key, value);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const auto& [key, value] : saved_) Set(key, value);
  }

 private:
  static void Set(const std::string& key, const std::optional<std::string>& value) {
    if (value) {
      setenv(key.c_str(), value->c_str(), 1);
    } else {
      unsetenv(key.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

// No ambient configuration leaks into a test.
ScopedEnv Clean(const std::string& home) {
  return ScopedEnv(EnvVars{{"ULYSSES_CONFIG", std::nullopt},
                           {"ULYSSES_TOKEN", std::nullopt},
                           {"ULYSSES_COORDINATOR", std::nullopt},
                           {"XDG_CONFIG_HOME", std::nullopt},
                           {"HOME", home}});
}

std::string Write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.Sub(name)) << text;
  return dir.Sub(name);
}

TEST(ClientConfigTest, ParsesContextsAndResolvesPathsAgainstTheFile) {
  absl::StatusOr<ClientConfig> config = ParseClientConfig(
      "current-context: prod\n"
      "contexts:\n"
      "  - name: local\n"
      "    server: 127.0.0.1:50051\n"
      "    token_file: state/admin.token\n"
      "  - name: prod\n"
      "    server: coord.example:50051\n"
      "    ca: /etc/ulysses/ca.pem\n"
      "    token: ul_abc\n"
      "  - name: lab\n"
      "    server: 10.0.0.5:50051\n"
      "    insecure: true\n",
      "cfg.yaml", "/home/u/.config/ulysses");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->contexts.size(), 3u);
  EXPECT_EQ(config->current_context, "prod");
  EXPECT_EQ(config->contexts[0].token_file, "/home/u/.config/ulysses/state/admin.token");
  EXPECT_EQ(config->contexts[1].ca, "/etc/ulysses/ca.pem");
  EXPECT_EQ(config->contexts[1].token, "ul_abc");
  EXPECT_TRUE(config->contexts[2].insecure);
  EXPECT_FALSE(config->contexts[0].insecure);
  ASSERT_TRUE(ParseClientConfig("", "empty.yaml", "/").ok());
}

TEST(ClientConfigTest, ReportsEveryProblemWithTheFieldAndTheFix) {
  absl::StatusOr<ClientConfig> config = ParseClientConfig(
      "current-context: nope\n"
      "colour: blue\n"
      "contexts:\n"
      "  - name: a\n"
      "    server: h:1\n"
      "    token: t\n"
      "    token_file: f\n"
      "  - name: a\n"
      "  - name: 'bad name'\n"
      "    server: h:2\n"
      "    insecure: maybe\n"
      "    srever: h:3\n",
      "cfg.yaml", "/");
  ASSERT_FALSE(config.ok());
  const std::string message(config.status().message());
  for (const char* expected :
       {"cfg.yaml: \"colour\": unknown field", "cfg.yaml: contexts[2].insecure: \"maybe\" is not",
        "cfg.yaml: contexts[2].srever: unknown field (a context has name, server"}) {
    EXPECT_THAT(message, HasSubstr(expected));
  }
  // Structural problems first; the rest once the fields parse.
  absl::StatusOr<ClientConfig> semantic = ParseClientConfig(
      "current-context: nope\n"
      "contexts:\n"
      "  - {name: a, server: 'h:1', token: t, token_file: f}\n"
      "  - {name: a}\n"
      "  - {name: 'bad name', server: 'h:2', ca: /ca.pem, insecure: true}\n",
      "cfg.yaml", "/");
  ASSERT_FALSE(semantic.ok());
  const std::string text(semantic.status().message());
  for (const char* expected :
       {"cfg.yaml: contexts[0].token: both token and token_file are set (keep one)",
        "cfg.yaml: contexts[1].name: \"a\" is used twice",
        "cfg.yaml: contexts[1].server: is missing (give the coordinator's HOST:PORT)",
        "cfg.yaml: contexts[2].name: \"bad name\" is not a context name",
        "cfg.yaml: contexts[2].insecure: true with ca",
        "cfg.yaml: current-context: \"nope\" names no context (have: a, a, bad name; run "
        "`ulyssesctl config use-context NAME`)"}) {
    EXPECT_THAT(text, HasSubstr(expected));
  }
  absl::StatusOr<ClientConfig> not_yaml = ParseClientConfig("contexts: [", "cfg.yaml", "/");
  EXPECT_THAT(not_yaml.status().message(), HasSubstr("cfg.yaml: line 1: not YAML"));
  absl::StatusOr<ClientConfig> list = ParseClientConfig("- a\n", "cfg.yaml", "/");
  EXPECT_THAT(list.status().message(), HasSubstr("is not a mapping"));
}

TEST(ClientConfigTest, SaveWritesMode0600AndRoundTrips) {
  testing::TempDir dir;
  ClientConfig config;
  config.current_context = "b";
  config.contexts.push_back({"a", "127.0.0.1:1", "", "", "/t/a.token", false});
  config.contexts.push_back({"b", "coord:2", "/ca.pem", "ul_x", "", false});
  const std::string path = dir.Sub("sub/dir/config.yaml");
  ASSERT_TRUE(SaveClientConfig(path, config).ok());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  absl::StatusOr<ClientConfig> loaded = LoadClientConfig(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(ClientConfigToYaml(*loaded), ClientConfigToYaml(config));
  // An invalid config is refused and the file keeps its old content.
  ClientConfig bad = config;
  bad.current_context = "missing";
  EXPECT_FALSE(SaveClientConfig(path, bad).ok());
  EXPECT_EQ(LoadClientConfig(path)->current_context, "b");
  EXPECT_EQ(LoadClientConfig(dir.Sub("absent.yaml")).status().code(), absl::StatusCode::kNotFound);
}

TEST(ResolveConnectionTest, FlagsThenEnvironmentThenContextThenDefaults) {
  testing::TempDir dir;
  ScopedEnv clean = Clean(dir.path());
  // No config at all: the defaults, no token.
  absl::StatusOr<Connection> none = ResolveConnection({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->channel.server, "127.0.0.1:50051");
  EXPECT_EQ(none->channel.token, "");
  EXPECT_EQ(none->config_path, "");

  Write(dir, "admin.token", "ul_from_file\n");
  const std::string config = Write(dir, "cfg.yaml",
                                   "current-context: local\n"
                                   "contexts:\n"
                                   "  - name: local\n"
                                   "    server: 127.0.0.1:7001\n"
                                   "    token_file: admin.token\n"
                                   "  - name: prod\n"
                                   "    server: coord:7002\n"
                                   "    ca: ca.pem\n"
                                   "    token: ul_inline\n");
  absl::StatusOr<Connection> current = ResolveConnection({config, "", ""});
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_EQ(current->context, "local");
  EXPECT_EQ(current->channel.server, "127.0.0.1:7001");
  EXPECT_EQ(current->channel.token, "ul_from_file");
  EXPECT_THAT(current->token_source, HasSubstr("token_file " + dir.Sub("admin.token")));

  absl::StatusOr<Connection> prod = ResolveConnection({config, "prod", ""});
  ASSERT_TRUE(prod.ok()) << prod.status();
  EXPECT_EQ(prod->channel.server, "coord:7002");
  EXPECT_EQ(prod->channel.ca_file, dir.Sub("ca.pem"));
  EXPECT_EQ(prod->channel.token, "ul_inline");

  {
    ScopedEnv env(EnvVars{{"ULYSSES_CONFIG", config},
                          {"ULYSSES_COORDINATOR", "127.0.0.1:7003"},
                          {"ULYSSES_TOKEN", "ul_env"}});
    absl::StatusOr<Connection> from_env = ResolveConnection({});
    ASSERT_TRUE(from_env.ok()) << from_env.status();
    EXPECT_EQ(from_env->config_path, config);
    EXPECT_EQ(from_env->channel.server, "127.0.0.1:7003");
    EXPECT_EQ(from_env->channel.token, "ul_env");
    EXPECT_EQ(from_env->token_source, "$ULYSSES_TOKEN");
    absl::StatusOr<Connection> flag = ResolveConnection({"", "", "127.0.0.1:7004"});
    EXPECT_EQ(flag->channel.server, "127.0.0.1:7004");
  }
  // The default path: $HOME/.config/ulysses/config.yaml.
  std::filesystem::create_directories(dir.Sub(".config/ulysses"));
  Write(dir, ".config/ulysses/config.yaml",
        "current-context: x\ncontexts: [{name: x, server: '127.0.0.1:7005'}]\n");
  EXPECT_EQ(ResolveConnection({})->channel.server, "127.0.0.1:7005");
}

TEST(ResolveConnectionTest, ErrorsSayWhatToDo) {
  testing::TempDir dir;
  ScopedEnv clean = Clean(dir.path());
  absl::StatusOr<Connection> missing = ResolveConnection({dir.Sub("nope.yaml"), "", ""});
  EXPECT_THAT(missing.status().message(), HasSubstr("the config named by --config must exist"));
  EXPECT_THAT(missing.status().message(), HasSubstr("ulyssesctl config set-context"));
  {
    ScopedEnv env(EnvVars{{"ULYSSES_CONFIG", dir.Sub("nope.yaml")}});
    EXPECT_THAT(ResolveConnection({}).status().message(), HasSubstr("named by $ULYSSES_CONFIG"));
  }
  const std::string config = Write(dir, "cfg.yaml",
                                   "current-context: a\n"
                                   "contexts: [{name: a, server: 'h:1', token_file: gone}]\n");
  absl::StatusOr<Connection> context = ResolveConnection({config, "b", ""});
  EXPECT_THAT(context.status().message(),
              HasSubstr("--context: \"b\" is not in " + config + " (have: a;"));
  absl::StatusOr<Connection> token = ResolveConnection({config, "", ""});
  EXPECT_THAT(token.status().message(),
              HasSubstr(config + ": contexts[0].token_file: cannot read \"" + dir.Sub("gone")));
  {
    ScopedEnv env(EnvVars{{"ULYSSES_TOKEN", "has space"}});
    EXPECT_THAT(ResolveConnection({}).status().message(), HasSubstr("$ULYSSES_TOKEN"));
  }
}

TEST(AuthHintTest, SaysHowToGetATokenOrThatItWasRefused) {
  Connection none;
  EXPECT_EQ(AuthHint(absl::NotFoundError("x"), none), "");
  EXPECT_THAT(AuthHint(absl::UnauthenticatedError("no token"), none),
              HasSubstr("no token was sent: set ULYSSES_TOKEN, or run `ulyssesctl config "
                        "set-context"));
  Connection with;
  with.channel.token = "ul_x";
  with.token_source = "$ULYSSES_TOKEN";
  EXPECT_THAT(AuthHint(absl::UnauthenticatedError("unknown token"), with),
              HasSubstr("the token from $ULYSSES_TOKEN was refused"));
}

// ulyssesctl (in-process RunCli) with a TLS context: the server sees TLS and the token.
class CliCredentialsTest : public ::testing::Test {
 protected:
  using Result = testing::Result;  // What a subprocess run gives, from RunCli in-process.
  Result Cli(std::vector<std::string> args) {
    args.insert(args.begin(), "ulyssesctl");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    Result r;
    r.exit_code = RunCli(static_cast<int>(argv.size()), argv.data(), out, err);
    r.out = out.str();
    r.err = err.str();
    return r;
  }
  testing::TempDir dir_;
};

TEST_F(CliCredentialsTest, SendsTheContextTokenOverTls) {
  ScopedEnv clean = Clean(dir_.path());
  const testing::DevCerts& certs = testing::TestCerts({"w1", "w2"});
  testing::RecordingServer server(/*tls=*/true);
  ASSERT_GT(server.port(), 0);
  Write(dir_, "tok", "ul_ctx_token\n");
  const std::string config = dir_.Sub("cfg.yaml");
  Result set =
      Cli({"--config", config, "config", "set-context", "tls", "--server",
           server.address("localhost"), "--ca", certs.ca, "--token-file", dir_.Sub("tok")});
  ASSERT_EQ(set.exit_code, 0) << set.err;
  EXPECT_THAT(set.out, HasSubstr("Context \"tls\" created"));

  Result get = Cli({"--config", config, "get", "workers", "-o", "json"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("w-recorded"));
  testing::RecordingServer::Seen seen = server.seen();
  EXPECT_EQ(seen.transport, "ssl");
  EXPECT_EQ(seen.authorization, "Bearer ul_ctx_token");
  // Every call carries ulyssesctl's release for the coordinator's version policy.
  EXPECT_EQ(seen.version, metrics::BuildVersion());
  EXPECT_FALSE(seen.version.empty());

  {
    ScopedEnv env(EnvVars{{"ULYSSES_TOKEN", "ul_env_token"}});
    ASSERT_EQ(Cli({"--config", config, "get", "workers"}).exit_code, 0);
    EXPECT_EQ(server.seen().authorization, "Bearer ul_env_token");
  }
  // A context without a CA to a non-loopback server is refused before any call.
  ASSERT_EQ(
      Cli({"--config", config, "config", "set-context", "remote", "--server", "10.9.8.7:50051"})
          .exit_code,
      0);
  Result remote = Cli({"--config", config, "--context", "remote", "get", "workers"});
  EXPECT_EQ(remote.exit_code, 2);
  EXPECT_THAT(remote.err, HasSubstr("error: server: \"10.9.8.7:50051\" is not a loopback"));
  EXPECT_EQ(server.seen().calls, 2);
}

TEST_F(CliCredentialsTest, ConfigVerbsEditTheFile) {
  ScopedEnv clean = Clean(dir_.path());
  const std::string config = dir_.Sub("cfg.yaml");
  Write(dir_, "tok", "ul_t\n");
  Result empty = Cli({"--config", config, "config", "get-contexts"});
  EXPECT_EQ(empty.exit_code, 0);
  EXPECT_THAT(empty.out, HasSubstr("No contexts in " + config));

  Result no_server = Cli({"--config", config, "config", "set-context", "a"});
  EXPECT_EQ(no_server.exit_code, 2);
  EXPECT_THAT(no_server.err, HasSubstr("--server is required"));
  Result bad_token = Cli({"--config", config, "config", "set-context", "a", "--server", "h:1",
                          "--token-file", dir_.Sub("none")});
  EXPECT_EQ(bad_token.exit_code, 2);
  EXPECT_THAT(bad_token.err, HasSubstr("--token-file: cannot read"));

  ASSERT_EQ(Cli({"--config", config, "config", "set-context", "a", "--server", "h:1",
                 "--token-file", dir_.Sub("tok")})
                .exit_code,
            0);
  ASSERT_EQ(Cli({"--config", config, "config", "set-context", "b", "--server", "h:2"}).exit_code,
            0);
  EXPECT_EQ(Cli({"--config", config, "config", "current-context"}).out, "a\n");
  Result use_missing = Cli({"--config", config, "config", "use-context", "c"});
  EXPECT_EQ(use_missing.exit_code, 2);
  EXPECT_THAT(use_missing.err, HasSubstr("\"c\" is not in " + config + " (have: a, b;"));
  ASSERT_EQ(Cli({"--config", config, "config", "use-context", "b"}).exit_code, 0);
  Result list = Cli({"--config", config, "config", "get-contexts"});
  EXPECT_THAT(list.out, HasSubstr("*       b "));
  EXPECT_THAT(list.out, HasSubstr("file:" + dir_.Sub("tok")));
  // Changing one field keeps the others.
  ASSERT_EQ(Cli({"--config", config, "config", "set-context", "a", "--server", "h:9"}).exit_code,
            0);
  absl::StatusOr<ClientConfig> loaded = LoadClientConfig(config);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->current_context, "b");
  EXPECT_EQ(loaded->Find("a")->server, "h:9");
  EXPECT_EQ(loaded->Find("a")->token_file, dir_.Sub("tok"));
}

TEST_F(CliCredentialsTest, UnauthenticatedAnswersCarryAHint) {
  // ulyssesctl prints the hint under the error line; FormatRpcError makes both.
  Connection none;
  none.channel.server = "h:1";
  EXPECT_EQ(
      FormatRpcError(absl::UnauthenticatedError("no token"), none),
      "error: UNAUTHENTICATED: no token\nhint: " + AuthHint(absl::UnauthenticatedError(""), none));
}

}  // namespace
}  // namespace ulysses::client
