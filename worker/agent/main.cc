// ulysses-worker: flags -> WorkerConfig -> WorkerAgent::Run until SIGTERM.
// Exit codes (common/contract/exit.h): 0 after a clean drain, 2 on bad flags, 1 when
// the agent fails.
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/config/settings_cli.h"
#include "common/contract/cli11.h"
#include "common/contract/exit.h"
#include "common/grpc/library_logs.h"
#include "common/log_format.h"
#include "common/logging.h"
#include "common/process/process_init.h"
#include "common/stop.h"
#include "worker/agent/worker_agent.h"
#include "worker/agent/worker_config_fields.h"

int main(int argc, char** argv) {
  ulysses::InitProcess(argv[0]);  // Crash traces; Abseil's deadlock detector off.
  ulysses::agent::WorkerConfig config;
  CLI::App app{"ulysses-worker: runs ranks of Ulysses training jobs for a coordinator"};
  // One flag per setting (worker/agent/worker_config_fields.h), each set only when given.
  ulysses::config::FlagOverrides<ulysses::agent::WorkerConfig> flags;
  flags.AddTo(app, ulysses::agent::WorkerSettings{});
  std::string log_format = "text";
  app.add_option("--log-format", log_format,
                 "text (default) or json: one JSON object per stderr line for log collectors");
  if (std::optional<int> exit_code = ulysses::contract::ParseCommandLine(app, argc, argv)) {
    return *exit_code;
  }
  ulysses::RouteLibraryLogs();  // libprotobuf and gRPC lines in the chosen format too.
  if (absl::Status s = ulysses::SetLogFormatFromFlag("--log-format", log_format); !s.ok()) {
    std::cerr << "ulysses-worker: " << s.message() << "\n";
    return ulysses::contract::kExitBadInput;
  }
  flags.ApplyTo(&config);
  if (const char* env = std::getenv("ULYSSES_TOKEN");
      config.token.empty() && config.token_file.empty() && env != nullptr) {
    config.token = env;
  }
  if (absl::Status status = config.Validate(); !status.ok()) {
    std::cerr << "ulysses-worker: " << status.message() << "\n";
    return ulysses::contract::kExitBadInput;
  }
  if (!ulysses::InstallStopSignalHandlers()) {
    std::cerr << "ulysses-worker: cannot install signal handlers\n";
    return ulysses::contract::kExitFailure;
  }
  ulysses::agent::WorkerAgent agent(config);
  // Joined (not detached): a thread still waiting in WaitForStop() when main returns would
  // block exit in the destructor of the condition variable it waits on.
  std::atomic<bool> finished{false};
  std::thread signals([&agent, &finished] {
    ulysses::WaitForStop();
    if (finished.load()) return;
    ULOG(INFO) << "received signal " << ulysses::StopSignal() << ": draining";
    agent.RequestShutdown();
  });
  absl::Status status = agent.Run();
  finished.store(true);
  ulysses::RequestStop();
  signals.join();
  if (!status.ok()) {
    std::cerr << "ulysses-worker: " << status << "\n";
    return ulysses::contract::kExitFailure;
  }
  return ulysses::contract::kExitOk;
}
