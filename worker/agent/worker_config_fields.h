// The WorkerConfig settings list (common/config/settings.h), in the order of
// docs/OPERATIONS.md's "Workers" table: the flags (worker/agent/main.cc), the per-field ranges
// (WorkerConfig::Validate; messages name the flag) and the table's defaults column
// (tests/worker/agent/worker_config_fields_test.cc) derive from it. ulysses-worker has no
// config file: a flag is its only source. Rules across fields and checks of the environment
// (devices, files, the channel) stay in Validate.
#ifndef ULYSSES_WORKER_AGENT_WORKER_CONFIG_FIELDS_H_
#define ULYSSES_WORKER_AGENT_WORKER_CONFIG_FIELDS_H_

#include <limits>

#include "common/config/settings.h"
#include "common/process/cpu_share.h"
#include "worker/agent/worker_config.h"

namespace ulysses::agent {

struct WorkerSettings {
  template <class V>
  void operator()(V& v) const {
    using config::Setting;
    using W = WorkerConfig;
    constexpr double kInf = std::numeric_limits<double>::infinity();
    v.Field(Setting("coordinator").Help("Coordinator HOST:PORT").Shown("(required)"),
            &W::coordinator);
    v.Field(Setting("name")
                .Help("Unique worker name (e.g. node3-gpu5)")
                .Required("give each worker a unique name, e.g. node3-gpu5"),
            &W::name);
    v.Field(Setting("device")
                .Flag("--devices,--device")
                .Help("Devices to run ranks on, one slot each: auto (every visible GPU, else "
                      "cpu), cpu, cuda:0-7 or cuda:0,cuda:1"),
            &W::device);
    v.Field(Setting("capacity")
                .Help("With --devices cpu: the number of CPU ranks it runs at once (0 = 1; "
                      "checked with --devices)"),
            &W::capacity);
    v.Field(Setting("work_dir")
                .Help("Directory for spec files and job output")
                .Required("a writable directory for spec files and job output"),
            &W::work_dir);
    v.Field(Setting("checkpoint_root")
                .Help("Refuse assignments whose checkpoint.dir is not below this directory (as "
                      "seen on this host; the coordinator's --checkpoint-root)"),
            &W::checkpoint_root);
    v.Field(Setting("data_roots")
                .Flag("--data-root")
                .Help("Refuse assignments whose data or init_from files are not below one of "
                      "these (repeatable; the coordinator's --data-root)"),
            &W::data_roots);
    v.Field(
        Setting("node_label").Flag("--node").Help("Node / NVLink domain label").Shown("the name"),
        &W::node_label);
    v.Field(Setting("engine_bin").Help("ulysses-train binary").Shown("next to `ulysses-worker`"),
            &W::engine_bin);
    v.Field(Setting("grace_period_s")
                .Help("On SIGTERM: seconds the rank gets to checkpoint before SIGKILL")
                .In(0, kInf)
                .Fix("seconds >= 0; Kubernetes gives 30 by default"),
            &W::grace_period_s);
    v.Field(Setting("collective_timeout_s")
                .Help("Rendezvous and collective timeout of each rank, in seconds (0 = the "
                      "engine's 60; raise it when ranks load large checkpoints)")
                .In(0, 86400)
                .Fix("0..86400; 0 = the engine's 60 s; use e.g. 600 when ranks load large "
                     "checkpoints"),
            &W::collective_timeout_s);
    v.Field(Setting("advertise_host")
                .Help("Address other ranks reach this worker on")
                .Required("the address other ranks reach this worker on"),
            &W::advertise_host);
    v.Field(Setting("metrics_listen")
                .Help("Serve the rank's metrics on HOST:PORT (GET /metrics; e.g. "
                      "127.0.0.1:9091, or the pod IP)"),
            &W::metrics_listen);
    v.Field(Setting("peak_flops")
                .Help("Dense peak FLOP/s of the device for MFU (e.g. 989e12; 0 = the GPU "
                      "model's bf16 peak from the built-in table, none on CPU)")
                .In(0, kInf)
                .Fix("a finite number >= 0: the device's dense peak FLOP/s, e.g. 989e12 for an "
                     "H100 in bf16; 0 = unknown"),
            &W::peak_flops);
    v.Field(Setting("intra_op_threads")
                .Help("libtorch intra-op threads of each rank (0 = usable cores / slots)")
                .In(0, process::kMaxIntraOpThreads)
                .Fix(absl::StrCat("0..", process::kMaxIntraOpThreads,
                                  "; each rank's libtorch threads; 0 = usable cores / slots")),
            &W::intra_op_threads);
    v.Field(Setting("fabric_flag")
                .Flag("--fabric")
                .Help("Transport to other nodes' GPUs: auto (detect from the RDMA devices, the "
                      "NCCL net plugin and the environment), sockets, efa, tcpxo or ib"),
            &W::fabric_flag);
    v.Field(Setting("ca_file").Flag("--ca").Help(
                "PEM CA of the coordinator's certificate: TLS (plaintext without it, "
                "loopback only)"),
            &W::ca_file);
    v.Field(Setting("cert_file")
                .Flag("--cert")
                .Help("PEM client certificate for mutual TLS (its CN/SAN is the worker name)"),
            &W::cert_file);
    v.Field(Setting("key_file").Flag("--key").Help("Private key of --cert"), &W::key_file);
    v.Field(
        Setting("token").Help("Bearer token (default: $ULYSSES_TOKEN; prefer --token-file: argv is "
                              "visible)"),
        &W::token);
    v.Field(Setting("token_file").Help("File holding the bearer token"), &W::token_file);
    v.Field(Setting("insecure")
                .Help("Allow plaintext to a non-loopback coordinator (the token "
                      "travels in clear)"),
            &W::insecure);
  }
};

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_WORKER_CONFIG_FIELDS_H_
