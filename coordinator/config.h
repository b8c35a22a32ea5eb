// CoordinatorConfig: every setting of ulysses-coordinator, with defaults, loaded
// from an optional YAML file and overridden by flags, then validated once.
//
// Errors are InvalidArgument with one line per problem: `<field>: <value> <problem>
// (<fix>)`. Nothing here starts anything; the struct is a plain value.
#ifndef ULYSSES_COORDINATOR_CONFIG_H_
#define ULYSSES_COORDINATOR_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/quota.h"

namespace ulysses::coordinator {

struct CoordinatorConfig {
  std::string listen = "127.0.0.1:50051";         // gRPC HOST:PORT (port 0 = pick one).
  std::string state_dir;                          // Required. SQLite lives here.
  std::string metrics_listen = "127.0.0.1:9091";  // Prometheus HOST:PORT ("" = off); loopback.
  // YAML metrics.job_series: all | none | labels (coordinator_metrics.h JobSeries).
  JobSeries metrics_job_series = JobSeries::kAll;
  double heartbeat_timeout_s = 10;  // No message for this long -> worker SUSPECT (no new work).
  // No message for this long -> worker LOST: its attempts end and restart elsewhere. Sized
  // so that a 30 s network blip (plus a heartbeat interval and scheduling slack) leaves the
  // ranks running. A lost-peer exit (69) of a rank of its job makes a SUSPECT (or
  // DISCONNECTED) worker LOST at once. heartbeat_timeout_s <= lost_after_s <= 86400 (equal: no
  // suspicion window).
  double lost_after_s = 45;
  double heartbeat_interval_s = 0;  // Told to workers; <= timeout / 2 (0 = timeout / 4).
  // Heartbeats a second the coordinator asks for at most (Nomad's max_heartbeats_per_second):
  // the interval told to workers grows with the cluster, max(heartbeat_interval_s, workers /
  // this), up to heartbeat_timeout_s / 2 (HeartbeatIntervalFor). 0 = a fixed interval.
  double max_heartbeats_per_s = 5000;
  double reconnect_window_s = 0;        // After a coordinator restart, how long RECOVERING jobs
                                        // wait for their workers (0 = the later of
                                        // 2 * heartbeat_timeout_s and lost_after_s).
  std::string checkpoint_root;          // Per-job checkpoints: <root>/<job id> unless the spec
                                        // sets checkpoint.dir ("" = <state_dir>/checkpoints).
  std::string out_root;                 // Per-job --out: <root>/<job id> ("" = <state_dir>/runs).
  double restart_backoff_base_s = 1;    // First restart delay; doubles per failure...
  double restart_backoff_max_s = 60;    // ...up to this.
  int64_t log_buffer_lines = 10000;     // Ring buffer of log lines kept per job.
  int64_t rendezvous_port_min = 29500;  // c10d TCPStore ports handed to rank-0 workers.
  int64_t rendezvous_port_max = 29999;
  double abort_grace_s = 5;    // SIGTERM -> SIGKILL grace sent with Abort (broken group).
  double cancel_grace_s = 30;  // Grace for CancelJob (lets ranks checkpoint).
  // Grace for a priority preemption's checkpoint (SIGTERM -> SIGKILL); 0 = cancel_grace_s.
  double preemption_grace_s = 0;
  // spec.checkpoint.every_steps: auto (coordinator/checkpoint_interval.h). The failure-rate
  // prior: one failure per this many GPU-hours until failures are observed for a group size;
  // default Llama 3's rate (419 interruptions in 54 days on 16,384 GPUs). (0, 1e9].
  double checkpoint_mtbf_prior_gpu_hours = 54.0 * 24.0 * 16384.0 / 419.0;
  // The blocking cost C of one checkpoint assumed before a job's first one is measured, in
  // seconds; 0 = none: every step until the first checkpoint reports its cost. 0..86400.
  double checkpoint_cost_prior_s = 0;
  // Priority classes that never preempt (Kubernetes' preemptionPolicy: Never): jobs of these
  // spec.scheduling.priority values queue ahead of lower priorities but wait for free workers
  // instead of stopping running jobs. Each within +-1000000, no repeats.
  std::vector<int64_t> non_preempting_priorities;
  int64_t event_history = 200;  // Events kept per job (memory and SQLite), 1..10000.
  // Log buffers (GetJobLogs), bounded in bytes too: per job (oldest lines dropped first)
  // and over all jobs (lines dropped from the largest buffers first).
  int64_t log_buffer_bytes_per_job = 8 << 20;  // 64 KiB .. 1 GiB.
  int64_t log_buffer_bytes_total = 512 << 20;  // >= log_buffer_bytes_per_job, <= 64 GiB.
  // Every job's log lines are also kept in <state_dir>/logs/<job id>/ (job_log_files.h),
  // rotated to stay within this many bytes per job, and read back after a restart.
  // 0 = no log files; else 65536 .. 68719476736.
  int64_t log_file_bytes_per_job = 64 << 20;
  double lost_worker_ttl_s = 3600;  // A worker LOST this long is forgotten (memory and SQLite).
  // An ended job (SUCCEEDED, FAILED, CANCELLED) is deleted this long after it ended, from
  // memory and SQLite (Kubernetes' ttlSecondsAfterFinished; its checkpoints stay on disk).
  // 0 = kept until the tenant's quotas.max_jobs refuses new jobs.
  double ended_job_ttl_s = 7 * 24 * 3600;
  // Open WatchJob / GetJobLogs-follow streams (stream_limits.h): per caller identity, per
  // tenant and in all, 1..100000 each, max_streams_per_identity <= max_streams_per_tenant <=
  // max_streams (0 per tenant = a quarter of max_streams, at least max_streams_per_identity).
  int64_t max_streams_per_identity = 64;
  int64_t max_streams_per_tenant = 0;
  int64_t max_streams = 4096;
  // Bytes a stream's send queue may hold (1 MiB .. 1 GiB): a slower reader is cut with
  // RESOURCE_EXHAUSTED, and a GetJobLogs tail sends at most half of it (the newest lines).
  // Memory for streams is bounded by max_streams * (this + one message of <= 1 MiB).
  int64_t stream_queue_max_bytes = 4 << 20;
  // Seconds one write of a stream may wait for its client (1..3600): a client that grants
  // no HTTP/2 flow credit is cut at the next message after it (RESOURCE_EXHAUSTED).
  double stream_stall_s = 60;
  // Seconds between rank 0's progress lines in a job's log (`ulyssesctl logs -f`: step, loss,
  // tokens/s, MFU, checkpoint age; the stage's last step always), 0..3600, 0 = none.
  double progress_log_interval_s = 10;
  // Completion queues (one thread each) serving worker Sessions, 1..64: sessions are spread
  // over them, and with Debian's libgrpc each message's cost grows with the sessions on
  // its queue (coordinator/async_bidi.h; docs/COORDINATOR.md "Worker sessions").
  int64_t session_queues = 8;
  // Directories a spec's data.train / data.validation / model.init_from may name
  // (path_policy.h). Empty = specs may use synthetic data only. Resolved (absolute,
  // symlinks followed) by ValidateAndFinalize, as is checkpoint_root.
  std::vector<std::string> data_roots;
  QuotaPolicy quotas;                          // Priority cap and per-tenant limits (quota.h).
  int64_t state_max_bytes = int64_t{4} << 30;  // Cap of coordinator.db (0 = the disk's size).

  // Security (docs/SECURITY.md). TLS needs both tls_cert and tls_key (PEM files).
  std::string tls_cert;                // Server certificate chain.
  std::string tls_key;                 // Its private key.
  std::string tls_client_ca;           // CA of worker client certificates (mTLS; needs tls_cert).
  int64_t tls_reload_interval_s = 60;  // The three files are re-read this often (1..86400).
  std::string token_file;  // Bearer tokens (auth/tokens.h). "" = <state_dir>/admin.token
                           // is created and used (one admin token).
  bool insecure = false;   // Allow plaintext on a non-loopback listen address.

  bool tls() const { return !tls_cert.empty(); }
};

// Reads a YAML mapping with the keys above into `config` (keys not present keep their
// current value). Unknown keys are errors.
absl::Status LoadConfigFile(const std::string& path, CoordinatorConfig* config);
absl::Status ApplyConfigYaml(const std::string& yaml_text, CoordinatorConfig* config);

// Checks every field and fills derived defaults (checkpoint_root, out_root,
// reconnect_window_s). Collects all problems.
absl::Status ValidateAndFinalize(CoordinatorConfig* config);

// The heartbeat interval (seconds) to tell workers when `workers` (not LOST) are registered:
// heartbeat_interval_s while the cluster sends at most max_heartbeats_per_s at it, else
// workers / max_heartbeats_per_s, capped at heartbeat_timeout_s / 2 so that a worker still
// sends two heartbeats within its timeout (past that cap the rate grows again).
double HeartbeatIntervalFor(const CoordinatorConfig& config, int64_t workers);

// The silence (ms) after which a worker told to heartbeat every `told_interval_ms` is SUSPECT:
// heartbeat_timeout_s, or three of its intervals when that is longer (a worker on the rate
// cap's longest interval, timeout / 2, may then miss one heartbeat without being suspected).
int64_t SuspectAfterMs(const CoordinatorConfig& config, int64_t told_interval_ms);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_CONFIG_H_
