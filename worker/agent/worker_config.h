// ulysses-worker's configuration: one struct with every flag (the list of its settings, flags
// and ranges is worker_config_fields.h; worker/agent/main.cc fills it), validated once with
// messages that name the flag, the value and the fix. The reconnect and deadline timings below
// are not flags.
#ifndef ULYSSES_WORKER_AGENT_WORKER_CONFIG_H_
#define ULYSSES_WORKER_AGENT_WORKER_CONFIG_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/grpc/channel.h"
#include "ulysses/v1/types.pb.h"

namespace ulysses::agent {

struct WorkerConfig {
  std::string coordinator;  // HOST:PORT of the coordinator. Required.
  std::string name;         // Unique worker name. Required.
  // --devices (alias --device): auto | cpu | cuda:0-7 | cuda:0,cuda:2 (worker/agent/devices.h).
  std::string device = "cpu";
  int capacity = 0;  // --capacity: CPU slots with --devices cpu (0 = one per device).
  // One slot per entry, each passed to its rank's ulysses-train --device. Filled by Validate.
  std::vector<std::string> devices;
  std::string work_dir;  // Spec files and job output. Required; created.
  // --checkpoint-root / --data-root: this worker's own roots; the agent refuses an
  // assignment whose paths lie outside them (assignment_check.h). Empty = not checked.
  std::string checkpoint_root;
  std::vector<std::string> data_roots;
  std::string node_label;                    // Node / NVLink domain label ("" = the name).
  std::string engine_bin;                    // ulysses-train path ("" = next to this binary).
  std::string advertise_host = "127.0.0.1";  // Address other ranks reach this worker on.
  double grace_period_s = 30;                // --grace-period-s: SIGTERM -> SIGKILL on preemption.
  std::chrono::milliseconds grace_period{30000};  // grace_period_s, filled by Validate.
  // --collective-timeout-s: passed to each rank (rendezvous and collective timeout; 0 = the
  // engine's default of 60 s). Size it for the slowest checkpoint load of a rank.
  int collective_timeout_s = 0;
  // Credentials (common/grpc/channel.h): TLS with --ca, mutual TLS with --cert/--key
  // (the certificate names this worker), a bearer token on every call.
  std::string ca_file;     // --ca: PEM CA of the coordinator's certificate; "" = plaintext.
  std::string cert_file;   // --cert: PEM client certificate (CN = the worker name).
  std::string key_file;    // --key: its private key.
  std::string token;       // --token / $ULYSSES_TOKEN; filled from token_file by Validate.
  std::string token_file;  // --token-file: a file holding the token.
  bool insecure = false;   // --insecure: allow plaintext to a non-loopback coordinator.
  std::chrono::milliseconds rpc_deadline{5000};    // Deadline of unary RPCs.
  std::chrono::milliseconds session_max{3600000};  // Deadline of one Session stream.
  std::chrono::milliseconds reconnect_min{200};    // Reconnect backoff, doubling...
  std::chrono::milliseconds reconnect_max{5000};   // ... up to this.
  std::chrono::milliseconds report_drain{5000};    // On shutdown: wait for exit acks.
  // --metrics-listen HOST:PORT: serve the rank's metrics (GET /metrics, docs/METRICS.md)
  // there; "" = no metrics server.
  std::string metrics_listen;
  // --peak-flops: the device's dense peak FLOP/s for ulysses_rank_mfu_ratio (989e12 for an
  // H100 in bf16). 0 (not given): on GPUs, Validate takes the GPU model's from
  // common/spec/gpu_peaks.h (PeakFlopsOfModels), else it stays 0 (no MFU series).
  double peak_flops = 0;
  std::string peak_flops_why;  // Filled by Validate: where peak_flops came from.
  // --intra-op-threads: each rank's libtorch intra-op threads (ulysses-train rank
  // --intra-op-threads); 0 = its share of the cores, usable cores / slots
  // (common/process/cpu_share.h).
  int intra_op_threads = 0;
  // --fabric: auto (detect, worker/agent/fabric.h) | sockets | efa | tcpxo | ib. Validate
  // fills `fabric` (and `fabric_why`: what detection found, or "set by --fabric").
  std::string fabric_flag = "auto";
  v1::Fabric fabric = v1::FABRIC_SOCKETS;
  std::string fabric_why;

  // Fills defaults (engine_bin, token from token_file) and checks every field, the
  // credential files included; the message names the flag, the value and the fix.
  absl::Status Validate();
  // The channel to the coordinator these fields describe.
  ChannelOptions Channel() const;
};

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_WORKER_CONFIG_H_
