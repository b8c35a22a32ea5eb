// The CoordinatorConfig settings list (common/config/settings.h), in the order of
// docs/COORDINATOR.md's "Configuration" table: the YAML reader (ApplyConfigYaml), the flags
// (every setting is also `--key-with-dashes`, coordinator/main.cc), the per-field ranges and
// the table's defaults column (tests/coordinator/config_fields_test.cc) derive from it.
// The sections `metrics:` and `quotas:` have readers of their own (config.cc, quota.h); rules
// across fields (lost_after_s >= heartbeat_timeout_s, ...) are ValidateAndFinalize's.
#ifndef ULYSSES_COORDINATOR_CONFIG_FIELDS_H_
#define ULYSSES_COORDINATOR_CONFIG_FIELDS_H_

#include "common/config/settings.h"
#include "coordinator/config.h"

namespace ulysses::coordinator {

struct CoordinatorSettings {
  template <class V>
  void operator()(V& v) const {
    using config::Setting;
    using C = CoordinatorConfig;
    constexpr double kDay = 86400;
    constexpr double kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
    v.Field(Setting("listen").Help("gRPC HOST:PORT (port 0 picks one; off loopback needs TLS)"),
            &C::listen);
    v.Field(Setting("state_dir")
                .Help("Directory of the SQLite state")
                .Required("pass --state-dir DIR; SQLite state lives there"),
            &C::state_dir);
    v.Field(Setting("metrics_listen")
                .Help("Prometheus /metrics and probes HOST:PORT (\"\" = off; the pod IP in a "
                      "deploy)"),
            &C::metrics_listen);
    v.Field(Setting("heartbeat_timeout_s")
                .Help("Seconds without a worker message before it is SUSPECT (no new work)")
                .Above(0, 3600)
                .Fix("0 < seconds <= 3600, e.g. 10; a silent worker is SUSPECT after it and LOST "
                     "after lost_after_s"),
            &C::heartbeat_timeout_s);
    v.Field(Setting("lost_after_s")
                .Help("Seconds without a worker message before it is LOST and its jobs restart "
                      "(>= heartbeat_timeout_s)"),
            &C::lost_after_s);
    v.Field(Setting("heartbeat_interval_s")
                .Help("Heartbeat interval told to workers (<= heartbeat_timeout_s / 2)")
                .Shown("timeout / 4"),
            &C::heartbeat_interval_s);
    v.Field(Setting("max_heartbeats_per_s")
                .Help("Heartbeats a second asked of the whole cluster at most (0 = fixed "
                      "interval)")
                .In(1, 1e7)
                .OrZero()
                .Fix("1 .. 10000000, e.g. 5000, or 0 for a fixed heartbeat_interval_s whatever "
                     "the cluster's size"),
            &C::max_heartbeats_per_s);
    v.Field(Setting("reconnect_window_s")
                .Help("After a restart, seconds RECOVERING jobs wait for their workers")
                .In(0, kDay)
                .Fix("0 .. 86400 seconds; 0 = 2 x heartbeat_timeout_s; size it to the time all "
                     "workers need to reconnect after a coordinator restart")
                .Shown("the later of 2 x timeout and `lost_after_s` (45 s)"),
            &C::reconnect_window_s);
    v.Field(Setting("checkpoint_root")
                .Help("Shared root of per-job checkpoint directories")
                .Shown("`<state_dir>/checkpoints`"),
            &C::checkpoint_root);
    v.Field(
        Setting("out_root").Help("Root of per-job --out directories").Shown("`<state_dir>/runs`"),
        &C::out_root);
    v.Field(Setting("restart_backoff_base_s").Help("First restart delay, doubled per failure"),
            &C::restart_backoff_base_s);
    v.Field(Setting("restart_backoff_max_s").Help("Longest restart delay"),
            &C::restart_backoff_max_s);
    v.Field(Setting("log_buffer_lines")
                .Help("Per-job log ring buffer, in lines")
                .In(1, 1e7)
                .Fix("1..10000000"),
            &C::log_buffer_lines);
    v.Field(Setting("log_buffer_bytes_per_job")
                .Help("Per-job log ring buffer, in bytes")
                .In(64 * kKiB, kGiB)
                .Fix("65536..1073741824 bytes")
                .Bytes(),
            &C::log_buffer_bytes_per_job);
    v.Field(
        Setting("log_buffer_bytes_total").Help("All jobs' log buffers together, in bytes").Bytes(),
        &C::log_buffer_bytes_total);
    v.Field(Setting("log_file_bytes_per_job")
                .Help("Bytes of each job's log files under <state_dir>/logs (0 = no files)")
                .In(64 * kKiB, 64 * kGiB)
                .OrZero()
                .Fix("0 for no log files, or 65536..68719476736 bytes, e.g. 67108864")
                .Bytes(),
            &C::log_file_bytes_per_job);
    v.Field(Setting("rendezvous_port_min").Help("Lowest c10d TCPStore port for rank 0"),
            &C::rendezvous_port_min);
    v.Field(Setting("rendezvous_port_max").Help("Highest c10d TCPStore port for rank 0"),
            &C::rendezvous_port_max);
    v.Field(Setting("abort_grace_s")
                .Help("SIGTERM -> SIGKILL grace of aborts of broken groups")
                .In(0, std::numeric_limits<double>::infinity())
                .Fix("seconds >= 0"),
            &C::abort_grace_s);
    v.Field(Setting("cancel_grace_s")
                .Help("SIGTERM -> SIGKILL grace of CancelJob (the ranks checkpoint in it)")
                .In(0, std::numeric_limits<double>::infinity())
                .Fix("seconds >= 0"),
            &C::cancel_grace_s);
    v.Field(Setting("preemption_grace_s")
                .Help("Grace of a priority preemption's checkpoint (0 = cancel_grace_s)")
                .In(0, kDay)
                .Fix("0..86400 seconds; 0 = cancel_grace_s")
                .Shown("0 (= `cancel_grace_s`)"),
            &C::preemption_grace_s);
    v.Field(Setting("checkpoint_mtbf_prior_gpu_hours")
                .Help("every_steps: auto's prior: GPU-hours per failure")
                .Above(0, 1e9)
                .Fix("GPU-hours per failure in (0, 1e9], e.g. 50677, Llama 3's observed rate")
                .Shown("50677 (Llama 3: 419 interruptions in 54 days on 16,384 GPUs)"),
            &C::checkpoint_mtbf_prior_gpu_hours);
    v.Field(Setting("checkpoint_cost_prior_s")
                .Help("every_steps: auto's prior: seconds one checkpoint blocks training")
                .In(0, kDay)
                .Fix("the seconds one checkpoint blocks training, 0..86400; 0 = measure it at "
                     "the first step"),
            &C::checkpoint_cost_prior_s);
    v.Field(Setting("non_preempting_priorities")
                .Help("Priorities whose jobs never preempt (repeatable)")
                .Flag("--non-preempting-priority"),
            &C::non_preempting_priorities);
    v.Field(Setting("event_history")
                .Help("Events kept per job")
                .In(1, 10000)
                .Fix("1..10000 events kept per job"),
            &C::event_history);
    v.Field(Setting("lost_worker_ttl_s")
                .Help("Seconds a LOST worker is kept before it is forgotten")
                .Above(0, 30 * kDay)
                .Fix("0 < seconds <= 2592000, e.g. 3600"),
            &C::lost_worker_ttl_s);
    v.Field(Setting("ended_job_ttl_s")
                .Help("Seconds an ended job is kept (0 = until quotas refuse new jobs)")
                .In(0, 3650 * kDay)
                .Fix("0 to keep ended jobs, or up to 315360000 seconds, e.g. 604800 for a week")
                .Shown("604800 (a week)"),
            &C::ended_job_ttl_s);
    v.Field(Setting("max_streams_per_identity")
                .Help("Open WatchJob/GetJobLogs streams per caller")
                .In(1, 100000)
                .Fix("1..100000 open streams, e.g. 64"),
            &C::max_streams_per_identity);
    v.Field(Setting("max_streams_per_tenant")
                .Help("Open streams per tenant (0 = a quarter of max_streams)")
                .Shown("a quarter of `max_streams` (1024)"),
            &C::max_streams_per_tenant);
    v.Field(Setting("max_streams").Help("Open streams over all callers"), &C::max_streams);
    v.Field(Setting("stream_queue_max_bytes")
                .Help("Bytes one stream's send queue may hold")
                .In(kMiB, kGiB)
                .Fix("1048576 .. 1073741824, e.g. 4194304")
                .Bytes(),
            &C::stream_queue_max_bytes);
    v.Field(Setting("stream_stall_s")
                .Help("Seconds one stream write may wait for its client")
                .In(0.1, 3600)
                .Fix("0.1 .. 3600 seconds, e.g. 60"),
            &C::stream_stall_s);
    v.Field(Setting("progress_log_interval_s")
                .Help("Seconds between rank 0's progress lines in a job's log (0 = none)")
                .In(0, 3600)
                .Fix("0 .. 3600 seconds, 0 = no progress lines"),
            &C::progress_log_interval_s);
    v.Field(Setting("session_queues")
                .Help("Completion queues (a thread each) serving worker sessions")
                .In(1, 64)
                .Fix("1..64 completion queues, e.g. 8"),
            &C::session_queues);
    v.Field(Setting("tls_cert").Help("Server certificate (PEM); with --tls-key enables TLS"),
            &C::tls_cert);
    v.Field(Setting("tls_key").Help("Server private key (PEM)"), &C::tls_key);
    v.Field(Setting("tls_client_ca").Help("CA of worker client certificates (mutual TLS)"),
            &C::tls_client_ca);
    v.Field(Setting("tls_reload_interval_s")
                .Help("Seconds between re-reads of the TLS files")
                .In(1, kDay)
                .Fix("1..86400 seconds, e.g. 60"),
            &C::tls_reload_interval_s);
    v.Field(Setting("token_file")
                .Help("YAML bearer-token file (none = create <state-dir>/admin.token); SIGHUP "
                      "reloads it"),
            &C::token_file);
    v.Field(Setting("insecure").Help("Allow plaintext gRPC on a non-loopback address"),
            &C::insecure);
    v.Field(Setting("state_max_bytes")
                .Help("Cap of everything the coordinator stores (0 = the disk's size)")
                .In(kMiB, std::numeric_limits<double>::infinity())
                .OrZero()
                .Fix("0 for no cap, or at least 1048576 bytes")
                .Bytes(),
            &C::state_max_bytes);
    v.Field(Setting("data_roots")
                .Help("Directory specs may read data and init_from from (repeatable)")
                .Flag("--data-root"),
            &C::data_roots);
  }
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_CONFIG_FIELDS_H_
