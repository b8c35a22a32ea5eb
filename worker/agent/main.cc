// ulysses-worker: flags -> WorkerConfig -> WorkerAgent::Run until SIGTERM.
// Exit codes (common/contract/exit.h): 0 after a clean drain, 2 on bad flags, 1 when
// the agent fails.
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/contract/cli11.h"
#include "common/contract/exit.h"
#include "common/grpc/library_logs.h"
#include "common/log_format.h"
#include "common/logging.h"
#include "common/process/process_init.h"
#include "common/stop.h"
#include "worker/agent/worker_agent.h"

int main(int argc, char** argv) {
  ulysses::InitProcess(argv[0]);  // Crash traces; Abseil's deadlock detector off.
  ulysses::agent::WorkerConfig config;
  double grace_s = 30.0;
  CLI::App app{"ulysses-worker: runs ranks of Ulysses training jobs for a coordinator"};
  app.add_option("--coordinator", config.coordinator, "Coordinator HOST:PORT")->required();
  app.add_option("--name", config.name, "Unique worker name (e.g. node3-gpu5)")->required();
  app.add_option("--devices,--device", config.device,
                 "Devices to run ranks on, one slot each: auto (every visible GPU, else cpu), "
                 "cpu, cuda:0-7 or cuda:0,cuda:1")
      ->capture_default_str();
  app.add_option("--capacity", config.capacity,
                 "With --devices cpu: the number of CPU ranks it runs at once (0 = 1)")
      ->capture_default_str();
  app.add_option("--work-dir", config.work_dir, "Directory for spec files and job output")
      ->required();
  app.add_option("--checkpoint-root", config.checkpoint_root,
                 "Refuse assignments whose checkpoint.dir is not below this directory (as seen "
                 "on this host; the coordinator's --checkpoint-root)");
  app.add_option("--data-root", config.data_roots,
                 "Refuse assignments whose data or init_from files are not below one of these "
                 "(repeatable; the coordinator's --data-root)");
  app.add_option("--node", config.node_label, "Node / NVLink domain label (default: the name)");
  app.add_option("--engine-bin", config.engine_bin,
                 "ulysses-train binary (default: next to this binary)");
  app.add_option("--grace-period-s", grace_s,
                 "On SIGTERM: seconds the rank gets to checkpoint before SIGKILL")
      ->capture_default_str();
  app.add_option("--collective-timeout-s", config.collective_timeout_s,
                 "Rendezvous and collective timeout of each rank, in seconds (0 = the engine's "
                 "60; raise it when ranks load large checkpoints)")
      ->capture_default_str();
  app.add_option("--advertise-host", config.advertise_host,
                 "Address other ranks reach this worker on")
      ->capture_default_str();
  app.add_option("--ca", config.ca_file,
                 "PEM CA of the coordinator's certificate: TLS (plaintext without it, loopback "
                 "only)");
  app.add_option("--cert", config.cert_file,
                 "PEM client certificate for mutual TLS (its CN/SAN is the worker name)");
  app.add_option("--key", config.key_file, "Private key of --cert");
  app.add_option("--token", config.token,
                 "Bearer token (default: $ULYSSES_TOKEN; prefer --token-file: argv is visible)");
  app.add_option("--token-file", config.token_file, "File holding the bearer token");
  app.add_option(
      "--metrics-listen", config.metrics_listen,
      "Serve the rank's metrics on HOST:PORT (GET /metrics; e.g. 127.0.0.1:9091, or the pod IP)");
  app.add_option("--peak-flops", config.peak_flops,
                 "Dense peak FLOP/s of the device for MFU (e.g. 989e12; 0 = the GPU model's "
                 "bf16 peak from the built-in table, none on CPU)")
      ->capture_default_str();
  app.add_option("--fabric", config.fabric_flag,
                 "Transport to other nodes' GPUs: auto (detect from the RDMA devices, the NCCL "
                 "net plugin and the environment), sockets, efa, tcpxo or ib")
      ->capture_default_str();
  app.add_option("--intra-op-threads", config.intra_op_threads,
                 "libtorch intra-op threads of each rank (0 = usable cores / slots)")
      ->capture_default_str();
  app.add_flag("--insecure", config.insecure,
               "Allow plaintext to a non-loopback coordinator (the token travels in clear)");
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
  if (const char* env = std::getenv("ULYSSES_TOKEN");
      config.token.empty() && config.token_file.empty() && env != nullptr) {
    config.token = env;
  }
  config.grace_period = std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
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
