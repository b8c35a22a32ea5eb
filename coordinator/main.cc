// ulysses-coordinator: the control-plane daemon. See docs/COORDINATOR.md.
//   ulysses-coordinator --listen HOST:PORT --state-dir DIR --metrics-listen HOST:PORT
//                       [--config FILE]
// Flags override the config file. Exit codes (common/contract/exit.h): 0 after
// SIGTERM/SIGINT, 2 on bad flags/config, 1 when the daemon cannot start.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/contract/cli11.h"
#include "common/contract/exit.h"
#include "common/logging.h"
#include "common/stop.h"
#include "coordinator/config.h"
#include "coordinator/server.h"

int main(int argc, char** argv) {
  using ulysses::coordinator::CoordinatorConfig;
  CLI::App app{"ulysses-coordinator: schedules Ulysses training jobs onto workers"};
  std::string listen, state_dir, metrics_listen, config_file, checkpoint_root;
  double heartbeat_timeout_s = -1;
  app.add_option("--listen", listen, "gRPC HOST:PORT (default 0.0.0.0:50051)");
  app.add_option("--state-dir", state_dir, "Directory for the SQLite state (required)");
  app.add_option("--metrics-listen", metrics_listen,
                 "Prometheus /metrics HOST:PORT (default 0.0.0.0:9091)");
  app.add_option("--config", config_file, "YAML config file (flags override it)");
  app.add_option("--checkpoint-root", checkpoint_root,
                 "Shared checkpoint root (default <state-dir>/checkpoints)");
  std::vector<std::string> data_roots;
  app.add_option("--data-root", data_roots,
                 "Directory specs may read data/init_from from (repeatable; default: none, "
                 "synthetic data only)");
  app.add_option("--heartbeat-timeout-s", heartbeat_timeout_s,
                 "Seconds without a worker message before it is LOST (<= 10)");
  if (std::optional<int> exit_code = ulysses::contract::ParseCommandLine(app, argc, argv)) {
    return *exit_code;
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
  if (!data_roots.empty()) config.data_roots = data_roots;
  if (absl::Status s = ulysses::coordinator::ValidateAndFinalize(&config); !s.ok()) {
    std::cerr << "ulysses-coordinator: invalid configuration:\n" << s.message() << "\n";
    return ulysses::contract::kExitBadInput;
  }

  ulysses::InstallStopSignalHandlers();
  auto server = ulysses::coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) {
    std::cerr << "ulysses-coordinator: " << server.status().message() << "\n";
    return ulysses::contract::kExitFailure;
  }
  // Ready line for scripts and tests: the bound ports.
  std::cout << "ulysses-coordinator listening grpc=" << (*server)->port()
            << " metrics=" << (*server)->metrics_port() << std::endl;
  while (!ulysses::WaitForStop(std::chrono::seconds(1))) (*server)->UpdateHealth();
  ULOG(INFO) << "stop requested (signal " << ulysses::StopSignal() << "); shutting down";
  (*server)->Shutdown();
  return ulysses::contract::kExitOk;
}
