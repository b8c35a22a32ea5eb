// ulysses-coordinator: the control-plane daemon. See docs/COORDINATOR.md and
// docs/SECURITY.md.
//   ulysses-coordinator --listen HOST:PORT --state-dir DIR --metrics-listen HOST:PORT
//                       [--config FILE] [--tls-cert F --tls-key F [--tls-client-ca F]]
//                       [--token-file F] [--insecure] [--<any setting, dashed> VALUE]
//   ulysses-coordinator token create --user U --tenant T --role R [--token-file F]
// Flags override the config file. SIGHUP reloads the token file. Exit codes
// (common/contract/exit.h): 0 after SIGTERM/SIGINT, 2 on bad flags/config, 1 when the
// daemon cannot start.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config/settings_cli.h"
#include "common/contract/cli11.h"
#include "common/contract/exit.h"
#include "common/grpc/library_logs.h"
#include "common/log_format.h"
#include "common/logging.h"
#include "common/process/process_init.h"
#include "common/status.h"
#include "common/stop.h"
#include "coordinator/auth/tokens.h"
#include "coordinator/backup.h"
#include "coordinator/config.h"
#include "coordinator/config_fields.h"
#include "coordinator/server.h"

namespace {

using ulysses::coordinator::CoordinatorConfig;
namespace contract = ulysses::contract;

std::atomic<bool> g_reload{false};  // Lock-free: safe to set from a signal handler.
void OnSighup(int) { g_reload.store(true); }

// The daemon's flags: one per CoordinatorConfig setting (coordinator/config_fields.h), each
// overriding the config file's value when given, and two of the daemon's own.
struct DaemonFlags {
  ulysses::config::FlagOverrides<CoordinatorConfig> settings;
  std::string config_file;
  std::string log_format = "text";
};

void AddDaemonFlags(CLI::App& app, DaemonFlags& f) {
  app.add_option("--config", f.config_file, "YAML config file (flags override it)");
  f.settings.AddTo(app, ulysses::coordinator::CoordinatorSettings{});
  app.add_option("--log-format", f.log_format,
                 "text (default) or json: one JSON object per stderr line for log collectors");
}

// `token create`.
struct TokenFlags {
  CLI::App* create = nullptr;
  std::string user, tenant, role, file;
};

void AddTokenCommand(CLI::App& app, TokenFlags& t) {
  CLI::App* token_cmd = app.add_subcommand("token", "Manage bearer tokens");
  t.create = token_cmd->add_subcommand("create",
                                       "Print a new token once and add its sha256 to --token-file");
  t.create->add_option("--user", t.user, "User (or worker name for role worker)")->required();
  t.create->add_option("--tenant", t.tenant, "Tenant whose jobs the token sees")->required();
  t.create->add_option("--role", t.role, "admin | user | viewer | worker")->required();
  t.create->add_option("--token-file", t.file,
                       "Token file to append the hash to (omitted: the entry is printed to "
                       "stderr for you to add)");
  token_cmd->require_subcommand(1);
}

int RunTokenCreate(const TokenFlags& t) {
  auto made = ulysses::coordinator::auth::CreateToken(t.user, t.tenant, t.role, t.file);
  if (!made.ok()) {
    std::cerr << "ulysses-coordinator token create: " << made.status().message() << "\n";
    return contract::kExitBadInput;
  }
  std::cout << made->first << std::endl;
  if (t.file.empty()) {
    std::cerr << "add to your token file (only this hash is stored; the token above is shown "
                 "once):\n"
              << ulysses::coordinator::auth::FormatTokenFile({made->second});
  } else {
    std::cerr << "added " << t.user << " (tenant " << t.tenant << ", role " << t.role << ") to "
              << t.file << "; send SIGHUP to the coordinator to load it\n";
  }
  return contract::kExitOk;
}

// Backup and restore of the SQLite store (coordinator/backup.h, docs/OPERATIONS.md).
struct BackupFlags {
  CLI::App* backup = nullptr;
  CLI::App* restore = nullptr;
  std::string b_state_dir, b_to;
  std::string r_from, r_state_dir;
  bool r_force = false, r_rollback = false;
};

void AddBackupCommands(CLI::App& app, BackupFlags& b) {
  b.backup = app.add_subcommand(
      "backup", "Copy the store of --state-dir to --to (safe while the coordinator runs)");
  b.backup->add_option("--state-dir", b.b_state_dir, "The coordinator's state dir")->required();
  b.backup->add_option("--to", b.b_to, "Backup file to write (replaced atomically)")->required();
  b.restore =
      app.add_subcommand("restore",
                         "Verify a backup and install it as the store of --state-dir (coordinator "
                         "stopped)");
  CLI::Option* from_opt = b.restore->add_option("--from", b.r_from, "Backup file");
  b.restore->add_option("--state-dir", b.r_state_dir, "State dir to restore into")->required();
  b.restore->add_flag("--force", b.r_force,
                      "Replace a store already in --state-dir (kept aside, not deleted)");
  CLI::Option* rollback_opt = b.restore->add_flag(
      "--rollback-to-backup", b.r_rollback,
      "Undo a schema upgrade: restore the newest coordinator.db.schema-v<N>.bak of --state-dir "
      "(implies --force); then run the previous ulysses-coordinator");
  from_opt->excludes(rollback_opt);
}

int RunBackupOrRestore(BackupFlags b) {
  const bool is_backup = b.backup->parsed();
  if (!is_backup && b.r_from.empty() && !b.r_rollback) {
    std::cerr << "ulysses-coordinator restore: --from: missing (give the backup file, or "
                 "--rollback-to-backup to undo a schema upgrade)\n";
    return contract::kExitBadInput;
  }
  if (b.r_rollback) {
    absl::StatusOr<std::string> newest = ulysses::coordinator::NewestMigrationBackup(b.r_state_dir);
    if (!newest.ok()) {
      std::cerr << "ulysses-coordinator restore: " << newest.status().message() << "\n";
      return contract::kExitBadInput;
    }
    b.r_from = *newest;
    b.r_force = true;
  }
  absl::StatusOr<ulysses::coordinator::BackupInfo> done =
      is_backup ? ulysses::coordinator::BackupStore(b.b_state_dir, b.b_to)
                : ulysses::coordinator::RestoreStore(b.r_from, b.r_state_dir, b.r_force);
  const char* verb = is_backup ? "backup" : "restore";
  if (!done.ok()) {
    std::cerr << "ulysses-coordinator " << verb << ": " << done.status().message() << "\n";
    return absl::IsFailedPrecondition(done.status()) || absl::IsInvalidArgument(done.status())
               ? contract::kExitBadInput
               : contract::kExitFailure;
  }
  std::cout << "ulysses-coordinator " << verb << ": " << done->path << " (" << done->bytes
            << " bytes, schema version " << done->schema_version << ", " << done->jobs << " jobs, "
            << absl::StrFormat("%.3f", done->seconds) << " s)" << std::endl;
  return contract::kExitOk;
}

// The config file, then the flags given over it, validated once.
absl::StatusOr<CoordinatorConfig> ConfigOf(const DaemonFlags& f) {
  CoordinatorConfig config;
  if (!f.config_file.empty()) {
    RETURN_IF_ERROR(ulysses::coordinator::LoadConfigFile(f.config_file, &config));
  }
  f.settings.ApplyTo(&config);
  if (absl::Status s = ulysses::coordinator::ValidateAndFinalize(&config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid configuration:\n", s.message()));
  }
  return config;
}

int RunDaemon(const CoordinatorConfig& config) {
  ulysses::InstallStopSignalHandlers();
  std::signal(SIGHUP, OnSighup);
  auto server = ulysses::coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) {
    std::cerr << "ulysses-coordinator: " << server.status().message() << "\n";
    return contract::kExitFailure;
  }
  // Ready line for scripts and tests: the bound ports.
  std::cout << "ulysses-coordinator listening grpc=" << (*server)->port()
            << " metrics=" << (*server)->metrics_port() << std::endl;
  while (!ulysses::WaitForStop(std::chrono::milliseconds(200))) {
    (*server)->UpdateHealth();
    if (g_reload.exchange(false)) (void)(*server)->ReloadTokens();  // Logs the outcome.
  }
  ULOG(INFO) << "stop requested (signal " << ulysses::StopSignal() << "); shutting down";
  (*server)->Shutdown();
  return contract::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  ulysses::InitProcess(argv[0]);  // Crash traces; Abseil's deadlock detector off.
  CLI::App app{"ulysses-coordinator: schedules Ulysses training jobs onto workers"};
  DaemonFlags flags;
  TokenFlags token;
  BackupFlags backup;
  AddDaemonFlags(app, flags);
  AddTokenCommand(app, token);
  AddBackupCommands(app, backup);
  if (std::optional<int> exit_code = contract::ParseCommandLine(app, argc, argv)) {
    return *exit_code;
  }
  ulysses::RouteLibraryLogs();  // libprotobuf and gRPC lines in the chosen format too.
  if (absl::Status s = ulysses::SetLogFormatFromFlag("--log-format", flags.log_format); !s.ok()) {
    std::cerr << "ulysses-coordinator: " << s.message() << "\n";
    return contract::kExitBadInput;
  }
  if (token.create->parsed()) return RunTokenCreate(token);
  if (backup.backup->parsed() || backup.restore->parsed()) return RunBackupOrRestore(backup);
  absl::StatusOr<CoordinatorConfig> config = ConfigOf(flags);
  if (!config.ok()) {
    std::cerr << "ulysses-coordinator: " << config.status().message() << "\n";
    return contract::kExitBadInput;
  }
  return RunDaemon(*config);
}
