// ulysses-coordinator: the control-plane daemon. See docs/COORDINATOR.md and
// docs/SECURITY.md.
//   ulysses-coordinator --listen HOST:PORT --state-dir DIR --metrics-listen HOST:PORT
//                       [--config FILE] [--tls-cert F --tls-key F [--tls-client-ca F]]
//                       [--token-file F] [--insecure]
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
#include "absl/strings/str_format.h"
#include "common/contract/cli11.h"
#include "common/contract/exit.h"
#include "common/grpc/library_logs.h"
#include "common/log_format.h"
#include "common/logging.h"
#include "common/process/process_init.h"
#include "common/stop.h"
#include "coordinator/auth/tokens.h"
#include "coordinator/backup.h"
#include "coordinator/config.h"
#include "coordinator/server.h"

namespace {

std::atomic<bool> g_reload{false};  // Lock-free: safe to set from a signal handler.
void OnSighup(int) { g_reload.store(true); }

}  // namespace

int main(int argc, char** argv) {
  ulysses::InitProcess(argv[0]);  // Crash traces; Abseil's deadlock detector off.
  using ulysses::coordinator::CoordinatorConfig;
  CLI::App app{"ulysses-coordinator: schedules Ulysses training jobs onto workers"};
  std::string listen, state_dir, metrics_listen, config_file, checkpoint_root;
  std::string tls_cert, tls_key, tls_client_ca, token_file;
  bool insecure = false;
  std::string log_format = "text";
  double heartbeat_timeout_s = -1;
  double lost_after_s = -1;
  double reconnect_window_s = -1;
  app.add_option("--listen", listen, "gRPC HOST:PORT (default 127.0.0.1:50051)");
  app.add_option("--state-dir", state_dir, "Directory for the SQLite state (required)");
  app.add_option("--metrics-listen", metrics_listen,
                 "Prometheus /metrics and probes HOST:PORT (default 127.0.0.1:9091: loopback; the "
                 "pod IP in a deploy)");
  app.add_option("--config", config_file, "YAML config file (flags override it)");
  app.add_option("--checkpoint-root", checkpoint_root,
                 "Shared checkpoint root (default <state-dir>/checkpoints)");
  std::vector<std::string> data_roots;
  app.add_option("--data-root", data_roots,
                 "Directory specs may read data/init_from from (repeatable; default: none, "
                 "synthetic data only)");
  app.add_option("--heartbeat-timeout-s", heartbeat_timeout_s,
                 "Seconds without a worker message before it is SUSPECT (no new work; "
                 "default 10)");
  app.add_option("--lost-after-s", lost_after_s,
                 "Seconds without a worker message before it is LOST and its jobs restart "
                 "(>= --heartbeat-timeout-s; default 45)");
  app.add_option("--reconnect-window-s", reconnect_window_s,
                 "After a restart, seconds no known worker is declared LOST and RECOVERING jobs "
                 "wait for their workers (default 2 x --heartbeat-timeout-s)");
  app.add_option("--tls-cert", tls_cert, "Server certificate (PEM); with --tls-key enables TLS");
  app.add_option("--tls-key", tls_key, "Server private key (PEM)");
  app.add_option("--tls-client-ca", tls_client_ca,
                 "CA of worker client certificates (mutual TLS for workers)");
  app.add_option("--token-file", token_file,
                 "YAML bearer-token file (default: create <state-dir>/admin.token); SIGHUP "
                 "reloads it");
  app.add_flag("--insecure", insecure,
               "Allow plaintext gRPC on a non-loopback address (tokens travel in the clear)");
  app.add_option("--log-format", log_format,
                 "text (default) or json: one JSON object per stderr line for log collectors");

  CLI::App* token_cmd = app.add_subcommand("token", "Manage bearer tokens");
  CLI::App* create = token_cmd->add_subcommand(
      "create", "Print a new token once and add its sha256 to --token-file");
  std::string t_user, t_tenant, t_role, t_file;
  create->add_option("--user", t_user, "User (or worker name for role worker)")->required();
  create->add_option("--tenant", t_tenant, "Tenant whose jobs the token sees")->required();
  create->add_option("--role", t_role, "admin | user | viewer | worker")->required();
  create->add_option("--token-file", t_file,
                     "Token file to append the hash to (omitted: the entry is printed to "
                     "stderr for you to add)");
  token_cmd->require_subcommand(1);

  // Backup and restore of the SQLite store (coordinator/backup.h, docs/OPERATIONS.md).
  CLI::App* backup_cmd = app.add_subcommand(
      "backup", "Copy the store of --state-dir to --to (safe while the coordinator runs)");
  std::string b_state_dir, b_to;
  backup_cmd->add_option("--state-dir", b_state_dir, "The coordinator's state dir")->required();
  backup_cmd->add_option("--to", b_to, "Backup file to write (replaced atomically)")->required();
  CLI::App* restore_cmd =
      app.add_subcommand("restore",
                         "Verify a backup and install it as the store of --state-dir (coordinator "
                         "stopped)");
  std::string r_from, r_state_dir;
  bool r_force = false, r_rollback = false;
  CLI::Option* from_opt = restore_cmd->add_option("--from", r_from, "Backup file");
  restore_cmd->add_option("--state-dir", r_state_dir, "State dir to restore into")->required();
  restore_cmd->add_flag("--force", r_force,
                        "Replace a store already in --state-dir (kept aside, not deleted)");
  CLI::Option* rollback_opt = restore_cmd->add_flag(
      "--rollback-to-backup", r_rollback,
      "Undo a schema upgrade: restore the newest coordinator.db.schema-v<N>.bak of --state-dir "
      "(implies --force); then run the previous ulysses-coordinator");
  from_opt->excludes(rollback_opt);
  if (std::optional<int> exit_code = ulysses::contract::ParseCommandLine(app, argc, argv)) {
    return *exit_code;
  }

  ulysses::RouteLibraryLogs();  // libprotobuf and gRPC lines in the chosen format too.
  if (absl::Status s = ulysses::SetLogFormatFromFlag("--log-format", log_format); !s.ok()) {
    std::cerr << "ulysses-coordinator: " << s.message() << "\n";
    return ulysses::contract::kExitBadInput;
  }
  if (create->parsed()) {
    auto made = ulysses::coordinator::auth::CreateToken(t_user, t_tenant, t_role, t_file);
    if (!made.ok()) {
      std::cerr << "ulysses-coordinator token create: " << made.status().message() << "\n";
      return ulysses::contract::kExitBadInput;
    }
    std::cout << made->first << std::endl;
    if (t_file.empty()) {
      std::cerr << "add to your token file (only this hash is stored; the token above is shown "
                   "once):\n"
                << ulysses::coordinator::auth::FormatTokenFile({made->second});
    } else {
      std::cerr << "added " << t_user << " (tenant " << t_tenant << ", role " << t_role << ") to "
                << t_file << "; send SIGHUP to the coordinator to load it\n";
    }
    return ulysses::contract::kExitOk;
  }

  if (backup_cmd->parsed() || restore_cmd->parsed()) {
    const bool is_backup = backup_cmd->parsed();
    if (restore_cmd->parsed() && r_from.empty() && !r_rollback) {
      std::cerr << "ulysses-coordinator restore: --from: missing (give the backup file, or "
                   "--rollback-to-backup to undo a schema upgrade)\n";
      return ulysses::contract::kExitBadInput;
    }
    if (r_rollback) {
      absl::StatusOr<std::string> newest = ulysses::coordinator::NewestMigrationBackup(r_state_dir);
      if (!newest.ok()) {
        std::cerr << "ulysses-coordinator restore: " << newest.status().message() << "\n";
        return ulysses::contract::kExitBadInput;
      }
      r_from = *newest;
      r_force = true;
    }
    absl::StatusOr<ulysses::coordinator::BackupInfo> done =
        is_backup ? ulysses::coordinator::BackupStore(b_state_dir, b_to)
                  : ulysses::coordinator::RestoreStore(r_from, r_state_dir, r_force);
    const char* verb = is_backup ? "backup" : "restore";
    if (!done.ok()) {
      std::cerr << "ulysses-coordinator " << verb << ": " << done.status().message() << "\n";
      return absl::IsFailedPrecondition(done.status()) || absl::IsInvalidArgument(done.status())
                 ? ulysses::contract::kExitBadInput
                 : ulysses::contract::kExitFailure;
    }
    std::cout << "ulysses-coordinator " << verb << ": " << done->path << " (" << done->bytes
              << " bytes, schema version " << done->schema_version << ", " << done->jobs
              << " jobs, " << absl::StrFormat("%.3f", done->seconds) << " s)" << std::endl;
    return ulysses::contract::kExitOk;
  }

  CoordinatorConfig config;
  if (!config_file.empty()) {
    absl::Status s = ulysses::coordinator::LoadConfigFile(config_file, &config);
    if (!s.ok()) {
      std::cerr << "ulysses-coordinator: " << s.message() << "\n";
      return ulysses::contract::kExitBadInput;
    }
  }
  if (!listen.empty()) config.listen = listen;
  if (!state_dir.empty()) config.state_dir = state_dir;
  if (!metrics_listen.empty()) config.metrics_listen = metrics_listen;
  if (!checkpoint_root.empty()) config.checkpoint_root = checkpoint_root;
  if (heartbeat_timeout_s >= 0) config.heartbeat_timeout_s = heartbeat_timeout_s;
  if (lost_after_s >= 0) config.lost_after_s = lost_after_s;
  if (reconnect_window_s >= 0) config.reconnect_window_s = reconnect_window_s;
  if (!tls_cert.empty()) config.tls_cert = tls_cert;
  if (!tls_key.empty()) config.tls_key = tls_key;
  if (!tls_client_ca.empty()) config.tls_client_ca = tls_client_ca;
  if (!token_file.empty()) config.token_file = token_file;
  if (insecure) config.insecure = true;
  if (!data_roots.empty()) config.data_roots = data_roots;
  if (absl::Status s = ulysses::coordinator::ValidateAndFinalize(&config); !s.ok()) {
    std::cerr << "ulysses-coordinator: invalid configuration:\n" << s.message() << "\n";
    return ulysses::contract::kExitBadInput;
  }

  ulysses::InstallStopSignalHandlers();
  std::signal(SIGHUP, OnSighup);
  auto server = ulysses::coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) {
    std::cerr << "ulysses-coordinator: " << server.status().message() << "\n";
    return ulysses::contract::kExitFailure;
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
  return ulysses::contract::kExitOk;
}
