#include "coordinator/config.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net/host_port.h"
#include "common/spec/job_spec.h"
#include "coordinator/path_policy.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::coordinator {
namespace {

// A nested section's own parse error, reported as it is (not as a type mismatch).
struct SectionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

absl::Status ApplyConfigYaml(const std::string& yaml_text, CoordinatorConfig* c) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: not valid YAML: ", e.what()));
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError("config: top level must be a mapping of settings");
  }
  using Setter = std::function<void(const YAML::Node&)>;
  std::map<std::string, Setter> setters = {
      {"listen", [&](const YAML::Node& n) { c->listen = n.as<std::string>(); }},
      {"state_dir", [&](const YAML::Node& n) { c->state_dir = n.as<std::string>(); }},
      {"metrics_listen", [&](const YAML::Node& n) { c->metrics_listen = n.as<std::string>(); }},
      {"heartbeat_timeout_s",
       [&](const YAML::Node& n) { c->heartbeat_timeout_s = n.as<double>(); }},
      {"heartbeat_interval_s",
       [&](const YAML::Node& n) { c->heartbeat_interval_s = n.as<double>(); }},
      {"lost_after_s", [&](const YAML::Node& n) { c->lost_after_s = n.as<double>(); }},
      {"max_heartbeats_per_s",
       [&](const YAML::Node& n) { c->max_heartbeats_per_s = n.as<double>(); }},
      {"reconnect_window_s", [&](const YAML::Node& n) { c->reconnect_window_s = n.as<double>(); }},
      {"checkpoint_root", [&](const YAML::Node& n) { c->checkpoint_root = n.as<std::string>(); }},
      {"out_root", [&](const YAML::Node& n) { c->out_root = n.as<std::string>(); }},
      {"restart_backoff_base_s",
       [&](const YAML::Node& n) { c->restart_backoff_base_s = n.as<double>(); }},
      {"restart_backoff_max_s",
       [&](const YAML::Node& n) { c->restart_backoff_max_s = n.as<double>(); }},
      {"log_buffer_lines", [&](const YAML::Node& n) { c->log_buffer_lines = n.as<int64_t>(); }},
      {"rendezvous_port_min",
       [&](const YAML::Node& n) { c->rendezvous_port_min = n.as<int64_t>(); }},
      {"rendezvous_port_max",
       [&](const YAML::Node& n) { c->rendezvous_port_max = n.as<int64_t>(); }},
      {"abort_grace_s", [&](const YAML::Node& n) { c->abort_grace_s = n.as<double>(); }},
      {"cancel_grace_s", [&](const YAML::Node& n) { c->cancel_grace_s = n.as<double>(); }},
      {"preemption_grace_s", [&](const YAML::Node& n) { c->preemption_grace_s = n.as<double>(); }},
      {"checkpoint_mtbf_prior_gpu_hours",
       [&](const YAML::Node& n) { c->checkpoint_mtbf_prior_gpu_hours = n.as<double>(); }},
      {"checkpoint_cost_prior_s",
       [&](const YAML::Node& n) { c->checkpoint_cost_prior_s = n.as<double>(); }},
      {"non_preempting_priorities",
       [&](const YAML::Node& n) { c->non_preempting_priorities = n.as<std::vector<int64_t>>(); }},
      {"event_history", [&](const YAML::Node& n) { c->event_history = n.as<int64_t>(); }},
      {"tls_cert", [&](const YAML::Node& n) { c->tls_cert = n.as<std::string>(); }},
      {"tls_key", [&](const YAML::Node& n) { c->tls_key = n.as<std::string>(); }},
      {"tls_client_ca", [&](const YAML::Node& n) { c->tls_client_ca = n.as<std::string>(); }},
      {"token_file", [&](const YAML::Node& n) { c->token_file = n.as<std::string>(); }},
      {"insecure", [&](const YAML::Node& n) { c->insecure = n.as<bool>(); }},
      {"log_buffer_bytes_per_job",
       [&](const YAML::Node& n) { c->log_buffer_bytes_per_job = n.as<int64_t>(); }},
      {"log_buffer_bytes_total",
       [&](const YAML::Node& n) { c->log_buffer_bytes_total = n.as<int64_t>(); }},
      {"lost_worker_ttl_s", [&](const YAML::Node& n) { c->lost_worker_ttl_s = n.as<double>(); }},
      {"ended_job_ttl_s", [&](const YAML::Node& n) { c->ended_job_ttl_s = n.as<double>(); }},
      {"log_file_bytes_per_job",
       [&](const YAML::Node& n) { c->log_file_bytes_per_job = n.as<int64_t>(); }},
      {"max_streams_per_identity",
       [&](const YAML::Node& n) { c->max_streams_per_identity = n.as<int64_t>(); }},
      {"max_streams", [&](const YAML::Node& n) { c->max_streams = n.as<int64_t>(); }},
      {"max_streams_per_tenant",
       [&](const YAML::Node& n) { c->max_streams_per_tenant = n.as<int64_t>(); }},
      {"stream_queue_max_bytes",
       [&](const YAML::Node& n) { c->stream_queue_max_bytes = n.as<int64_t>(); }},
      {"stream_stall_s", [&](const YAML::Node& n) { c->stream_stall_s = n.as<double>(); }},
      {"progress_log_interval_s",
       [&](const YAML::Node& n) { c->progress_log_interval_s = n.as<double>(); }},
      {"session_queues", [&](const YAML::Node& n) { c->session_queues = n.as<int64_t>(); }},
      {"tls_reload_interval_s",
       [&](const YAML::Node& n) { c->tls_reload_interval_s = n.as<int64_t>(); }},
      {"data_roots",
       [&](const YAML::Node& n) { c->data_roots = n.as<std::vector<std::string>>(); }},
      {"state_max_bytes", [&](const YAML::Node& n) { c->state_max_bytes = n.as<int64_t>(); }},
      {"metrics",
       [&](const YAML::Node& n) {
         if (!n.IsMap()) throw SectionError("metrics: must be a mapping (job_series: ...)");
         for (const auto& kv : n) {
           const std::string key = kv.first.as<std::string>();
           if (key != "job_series") {
             throw SectionError(
                 absl::StrCat("metrics.", key, ": unknown setting (known: job_series)"));
           }
           absl::StatusOr<JobSeries> p =
               ParseJobSeries("metrics.job_series", kv.second.as<std::string>());
           if (!p.ok()) throw SectionError(std::string(p.status().message()));
           c->metrics_job_series = *p;
         }
       }},
      {"quotas",
       [&](const YAML::Node& n) {
         absl::Status s = ParseQuotaPolicy(n, &c->quotas);
         if (!s.ok()) throw SectionError(std::string(s.message()));
       }},
  };
  std::vector<std::string> errors;
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    auto it = setters.find(key);
    if (it == setters.end()) {
      std::vector<std::string> known;
      for (const auto& s : setters) known.push_back(s.first);
      errors.push_back(absl::StrCat("config.", key,
                                    ": unknown setting (known: ", absl::StrJoin(known, ", "), ")"));
      continue;
    }
    try {
      it->second(kv.second);
    } catch (const SectionError& e) {  // Already `<field>: <value> <problem> (<fix>)`.
      errors.push_back(absl::StrCat("config.", e.what()));
    } catch (const std::exception& e) {
      errors.push_back(absl::StrCat("config.", key, ": ", YAML::Dump(kv.second),
                                    " has the wrong type (", e.what(), ")"));
    }
  }
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  return absl::OkStatus();
}

absl::Status LoadConfigFile(const std::string& path, CoordinatorConfig* config) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config: cannot read \"", path, "\" (check the path)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  absl::Status s = ApplyConfigYaml(ss.str(), config);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  return absl::OkStatus();
}

namespace {

// A file setting must name a readable file.
void CheckReadable(const std::string& field, const std::string& path, std::vector<std::string>* e) {
  if (path.empty()) return;
  if (access(path.c_str(), R_OK) != 0) {
    e->push_back(absl::StrCat(field, ": \"", path, "\" cannot be read (", std::strerror(errno),
                              "; check the path)"));
  }
}

}  // namespace

double HeartbeatIntervalFor(const CoordinatorConfig& c, int64_t workers) {
  if (c.max_heartbeats_per_s <= 0) return c.heartbeat_interval_s;
  const double spread = static_cast<double>(std::max<int64_t>(0, workers)) / c.max_heartbeats_per_s;
  return std::max(c.heartbeat_interval_s, std::min(spread, c.heartbeat_timeout_s / 2));
}

int64_t SuspectAfterMs(const CoordinatorConfig& c, int64_t told_interval_ms) {
  return std::max(static_cast<int64_t>(c.heartbeat_timeout_s * 1000), 3 * told_interval_ms);
}

namespace {

// Where the coordinator listens and with what: addresses, TLS, tokens, its state dir.
void CheckEndpoints(CoordinatorConfig* c, std::vector<std::string>& e) {
  if (absl::StatusOr<net::HostPort> listen =
          net::ParseHostPort("listen", c->listen, "0.0.0.0:50051");
      !listen.ok()) {
    e.push_back(std::string(listen.status().message()));
  } else if (!c->tls() && !c->insecure && !net::IsLoopbackHost(listen->host)) {
    e.push_back(absl::StrCat("listen: \"", c->listen,
                             "\" is not a loopback address and TLS is off (set tls_cert and "
                             "tls_key, or pass --insecure to accept plaintext; tokens are sent "
                             "in the clear then)"));
  }
  if (c->tls_cert.empty() != c->tls_key.empty()) {
    e.push_back(absl::StrCat("tls_cert/tls_key: \"", c->tls_cert, "\"/\"", c->tls_key,
                             "\" (set both for TLS, or neither)"));
  }
  if (!c->tls_client_ca.empty() && c->tls_cert.empty()) {
    e.push_back(absl::StrCat("tls_client_ca: \"", c->tls_client_ca,
                             "\" needs TLS (set tls_cert and tls_key too)"));
  }
  CheckReadable("tls_cert", c->tls_cert, &e);
  CheckReadable("tls_key", c->tls_key, &e);
  CheckReadable("tls_client_ca", c->tls_client_ca, &e);
  CheckReadable("token_file", c->token_file, &e);
  if (!c->metrics_listen.empty()) {
    if (absl::StatusOr<net::HostPort> at =
            net::ParseHostPort("metrics_listen", c->metrics_listen, "0.0.0.0:9090");
        !at.ok()) {
      e.push_back(std::string(at.status().message()));
    }
  }
  if (c->state_dir.empty()) {
    e.push_back("state_dir: empty (pass --state-dir DIR; SQLite state lives there)");
  }
}

// Liveness and recovery timings, ports, graces, the checkpoint-interval priors and the
// priorities that never preempt. Fills heartbeat_interval_s when 0.
void CheckTimings(CoordinatorConfig* c, std::vector<std::string>& e) {
  if (!(c->heartbeat_timeout_s > 0 && c->heartbeat_timeout_s <= 3600)) {
    e.push_back(absl::StrCat("heartbeat_timeout_s: ", c->heartbeat_timeout_s,
                             " is out of range (use 0 < seconds <= 3600, e.g. 10; a silent "
                             "worker is SUSPECT after it and LOST after lost_after_s)"));
  } else if (!(c->lost_after_s >= c->heartbeat_timeout_s && c->lost_after_s <= 86400)) {
    e.push_back(absl::StrCat("lost_after_s: ", c->lost_after_s,
                             " is out of range (use heartbeat_timeout_s (", c->heartbeat_timeout_s,
                             ") .. 86400 seconds, e.g. 45 to ride out a 30 s network blip; "
                             "equal to heartbeat_timeout_s turns the SUSPECT window off)"));
  }
  if (c->heartbeat_interval_s == 0) c->heartbeat_interval_s = c->heartbeat_timeout_s / 4;
  if (!(c->heartbeat_interval_s > 0 && c->heartbeat_interval_s <= c->heartbeat_timeout_s / 2)) {
    e.push_back(absl::StrCat("heartbeat_interval_s: ", c->heartbeat_interval_s,
                             " must be > 0 and <= heartbeat_timeout_s / 2 (",
                             c->heartbeat_timeout_s / 2, ")"));
  }
  if (!(c->max_heartbeats_per_s == 0 ||
        (c->max_heartbeats_per_s >= 1 && c->max_heartbeats_per_s <= 1e7))) {
    e.push_back(absl::StrCat("max_heartbeats_per_s: ", c->max_heartbeats_per_s,
                             " is out of range (use 1 .. 10000000, e.g. 5000, or 0 for a fixed "
                             "heartbeat_interval_s whatever the cluster's size)"));
  }
  if (!(c->reconnect_window_s >= 0 && c->reconnect_window_s <= 86400)) {
    e.push_back(absl::StrCat("reconnect_window_s: ", c->reconnect_window_s,
                             " is out of range (use 0 .. 86400 seconds; 0 = 2 x "
                             "heartbeat_timeout_s; size it to the time all workers need to "
                             "reconnect after a coordinator restart)"));
  }
  if (!(c->restart_backoff_base_s >= 0 && c->restart_backoff_max_s >= c->restart_backoff_base_s)) {
    e.push_back(
        absl::StrCat("restart_backoff_base_s/restart_backoff_max_s: ", c->restart_backoff_base_s,
                     "/", c->restart_backoff_max_s, " invalid (need 0 <= base <= max)"));
  }
  if (c->log_buffer_lines < 1 || c->log_buffer_lines > 10000000) {
    e.push_back(absl::StrCat("log_buffer_lines: ", c->log_buffer_lines,
                             " is out of range (use 1..10000000)"));
  }
  if (c->rendezvous_port_min < 1 || c->rendezvous_port_max > 65535 ||
      c->rendezvous_port_min > c->rendezvous_port_max) {
    e.push_back(absl::StrCat("rendezvous_port_min/rendezvous_port_max: ", c->rendezvous_port_min,
                             "/", c->rendezvous_port_max,
                             " is not a port range (use 1 <= min <= max <= 65535)"));
  }
  if (c->abort_grace_s < 0 || c->cancel_grace_s < 0) {
    e.push_back("abort_grace_s/cancel_grace_s: negative (use seconds >= 0)");
  }
  if (!(c->preemption_grace_s >= 0 && c->preemption_grace_s <= 86400)) {
    e.push_back(absl::StrCat("preemption_grace_s: ", c->preemption_grace_s,
                             " is out of range (use 0..86400 seconds; 0 = cancel_grace_s)"));
  }
  if (!(c->checkpoint_mtbf_prior_gpu_hours > 0 && c->checkpoint_mtbf_prior_gpu_hours <= 1e9)) {
    e.push_back(
        absl::StrCat("checkpoint_mtbf_prior_gpu_hours: ", c->checkpoint_mtbf_prior_gpu_hours,
                     " is out of range (use GPU-hours per failure in (0, 1e9], e.g. "
                     "50677, Llama 3's observed rate)"));
  }
  if (!(c->checkpoint_cost_prior_s >= 0 && c->checkpoint_cost_prior_s <= 86400)) {
    e.push_back(absl::StrCat("checkpoint_cost_prior_s: ", c->checkpoint_cost_prior_s,
                             " is out of range (use the seconds one checkpoint blocks training, "
                             "0..86400; 0 = measure it at the first step)"));
  }
  std::set<int64_t> seen_priorities;
  for (int64_t p : c->non_preempting_priorities) {
    if (p < -spec::kMaxPriority || p > spec::kMaxPriority) {
      e.push_back(absl::StrCat("non_preempting_priorities: ", p, " is out of range (use -",
                               spec::kMaxPriority, "..", spec::kMaxPriority,
                               ", the range of spec.scheduling.priority)"));
    } else if (!seen_priorities.insert(p).second) {
      e.push_back(absl::StrCat("non_preempting_priorities: ", p,
                               " is listed twice (list each priority once)"));
    }
  }
}

// What the coordinator keeps and serves: state and log sizes, quotas, retention, streams.
// Fills max_streams_per_tenant when 0.
void CheckLimits(CoordinatorConfig* c, std::vector<std::string>& e) {
  if (c->state_max_bytes != 0 && c->state_max_bytes < (1 << 20)) {
    e.push_back(absl::StrCat("state_max_bytes: ", c->state_max_bytes,
                             " is too small (use 0 for no cap, or at least 1048576)"));
  }
  if (absl::Status s = ValidateQuotaPolicy(c->quotas); !s.ok()) {
    e.push_back(std::string(s.message()));
  }
  if (c->event_history < 1 || c->event_history > 10000) {
    e.push_back(absl::StrCat("event_history: ", c->event_history,
                             " is out of range (use 1..10000 events kept per job)"));
  }
  constexpr int64_t kKiB = 1024, kGiB = 1024 * 1024 * 1024;
  if (c->log_buffer_bytes_per_job < 64 * kKiB || c->log_buffer_bytes_per_job > kGiB) {
    e.push_back(absl::StrCat("log_buffer_bytes_per_job: ", c->log_buffer_bytes_per_job,
                             " is out of range (use 65536..1073741824 bytes)"));
  } else if (c->log_buffer_bytes_total < c->log_buffer_bytes_per_job ||
             c->log_buffer_bytes_total > 64 * kGiB) {
    e.push_back(absl::StrCat("log_buffer_bytes_total: ", c->log_buffer_bytes_total,
                             " is out of range (use log_buffer_bytes_per_job (",
                             c->log_buffer_bytes_per_job, ") .. 68719476736 bytes)"));
  }
  if (!(c->ended_job_ttl_s >= 0 && c->ended_job_ttl_s <= 10 * 365 * 24 * 3600.0)) {
    e.push_back(absl::StrCat("ended_job_ttl_s: ", c->ended_job_ttl_s,
                             " is out of range (use 0 to keep ended jobs, or up to 315360000 "
                             "seconds, e.g. 604800 for a week)"));
  }
  if (c->log_file_bytes_per_job != 0 &&
      (c->log_file_bytes_per_job < 64 * kKiB || c->log_file_bytes_per_job > 64 * kGiB)) {
    e.push_back(absl::StrCat("log_file_bytes_per_job: ", c->log_file_bytes_per_job,
                             " is out of range (use 0 for no log files, or 65536.."
                             "68719476736 bytes, e.g. 67108864)"));
  }
  if (!(c->lost_worker_ttl_s > 0 && c->lost_worker_ttl_s <= 30 * 24 * 3600)) {
    e.push_back(absl::StrCat("lost_worker_ttl_s: ", c->lost_worker_ttl_s,
                             " is out of range (use 0 < seconds <= 2592000, e.g. 3600)"));
  }
  if (c->tls_reload_interval_s < 1 || c->tls_reload_interval_s > 86400) {
    e.push_back(absl::StrCat("tls_reload_interval_s: ", c->tls_reload_interval_s,
                             " is out of range (use 1..86400 seconds, e.g. 60)"));
  }
  if (c->stream_queue_max_bytes < (1 << 20) || c->stream_queue_max_bytes > (int64_t{1} << 30)) {
    e.push_back(absl::StrCat("stream_queue_max_bytes: ", c->stream_queue_max_bytes,
                             " is out of range (use 1048576 .. 1073741824, e.g. 4194304)"));
  }
  if (!(c->progress_log_interval_s >= 0 && c->progress_log_interval_s <= 3600)) {
    e.push_back(absl::StrCat("progress_log_interval_s: ", c->progress_log_interval_s,
                             " is out of range (use 0 .. 3600 seconds, 0 = no progress lines)"));
  }
  if (!(c->stream_stall_s >= 0.1 && c->stream_stall_s <= 3600)) {
    e.push_back(absl::StrCat("stream_stall_s: ", c->stream_stall_s,
                             " is out of range (use 0.1 .. 3600 seconds, e.g. 60)"));
  }
  if (c->session_queues < 1 || c->session_queues > 64) {
    e.push_back(absl::StrCat("session_queues: ", c->session_queues,
                             " is out of range (use 1..64 completion queues, e.g. 8)"));
  }
  if (c->max_streams_per_identity < 1 || c->max_streams_per_identity > 100000) {
    e.push_back(absl::StrCat("max_streams_per_identity: ", c->max_streams_per_identity,
                             " is out of range (use 1..100000 open streams, e.g. 64)"));
  } else if (c->max_streams < c->max_streams_per_identity || c->max_streams > 100000) {
    e.push_back(absl::StrCat("max_streams: ", c->max_streams,
                             " is out of range (use max_streams_per_identity (",
                             c->max_streams_per_identity, ") .. 100000, e.g. 4096)"));
  } else if (c->max_streams_per_tenant == 0) {
    c->max_streams_per_tenant = std::max(c->max_streams_per_identity, c->max_streams / 4);
  } else if (c->max_streams_per_tenant < c->max_streams_per_identity ||
             c->max_streams_per_tenant > c->max_streams) {
    e.push_back(absl::StrCat("max_streams_per_tenant: ", c->max_streams_per_tenant,
                             " is out of range (use max_streams_per_identity (",
                             c->max_streams_per_identity, ") .. max_streams (", c->max_streams,
                             "), or 0 for a quarter of max_streams)"));
  }
}

// The defaults that follow from other fields, and the roots resolved as spec paths are.
void FinalizeRoots(CoordinatorConfig* c, std::vector<std::string>& e) {
  // Jobs wait for their workers as long as the workers themselves may take to come back
  // before they are LOST: at 25,000 agents the reconnect storm after a restart takes
  // ~30 s (docs/BENCHMARKS.md), past two heartbeat timeouts (20 s by default).
  if (c->reconnect_window_s == 0) {
    c->reconnect_window_s = std::max(2 * c->heartbeat_timeout_s, c->lost_after_s);
  }
  if (c->checkpoint_root.empty()) c->checkpoint_root = c->state_dir + "/checkpoints";
  if (c->out_root.empty()) c->out_root = c->state_dir + "/runs";
  // Roots are compared with resolved spec paths (path_policy.h): resolve them the same
  // way. The operator's own paths may be relative to the working directory.
  auto resolve_root = [&](const std::string& field, std::string* root) {
    if (root->empty()) {
      e.push_back(absl::StrCat(field, ": empty (give a directory, or remove the entry)"));
      return;
    }
    std::error_code ec;
    std::string absolute = std::filesystem::absolute(*root, ec).lexically_normal().string();
    if (absolute.size() > 1 && absolute.back() == '/') absolute.pop_back();
    absl::StatusOr<std::string> resolved = ResolvePath(field, absolute);
    if (!resolved.ok()) {
      e.push_back(std::string(resolved.status().message()));
      return;
    }
    *root = *resolved;
  };
  resolve_root("checkpoint_root", &c->checkpoint_root);
  // A data root need not exist here: the coordinator may not mount the data volume
  // (then spec paths are confined lexically; mount it read-only to resolve links).
  for (size_t i = 0; i < c->data_roots.size(); ++i) {
    resolve_root(absl::StrCat("data_roots[", i, "]"), &c->data_roots[i]);
  }
}

}  // namespace

absl::Status ValidateAndFinalize(CoordinatorConfig* c) {
  std::vector<std::string> e;
  CheckEndpoints(c, e);
  CheckTimings(c, e);
  CheckLimits(c, e);
  if (!e.empty()) return absl::InvalidArgumentError(absl::StrJoin(e, "\n"));
  FinalizeRoots(c, e);
  if (!e.empty()) return absl::InvalidArgumentError(absl::StrJoin(e, "\n"));
  return absl::OkStatus();
}

}  // namespace ulysses::coordinator
