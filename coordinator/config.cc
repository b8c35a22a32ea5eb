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
#include "common/config/settings_yaml.h"
#include "common/net/host_port.h"
#include "common/spec/job_spec.h"
#include "coordinator/config_fields.h"
#include "coordinator/path_policy.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::coordinator {
namespace {

// `metrics:` (job_series only).
std::vector<std::string> ReadMetricsSection(const YAML::Node& n, CoordinatorConfig* c) {
  if (!n.IsMap()) return {"metrics: must be a mapping (job_series: ...)"};
  std::vector<std::string> errors;
  for (const auto& kv : n) {
    const std::string key = kv.first.as<std::string>();
    if (key != "job_series") {
      errors.push_back(absl::StrCat("metrics.", key, ": unknown setting (known: job_series)"));
      continue;
    }
    absl::StatusOr<JobSeries> p = ParseJobSeries("metrics.job_series", kv.second.as<std::string>());
    if (p.ok()) {
      c->metrics_job_series = *p;
    } else {
      errors.emplace_back(p.status().message());
    }
  }
  return errors;
}

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
  // The two sections' readers may throw on a value of the wrong type (YAML::Node::as).
  auto guarded = [](const char* key, auto read) {
    return [key, read](const YAML::Node& n) -> std::vector<std::string> {
      try {
        return read(n);
      } catch (const std::exception& e) {
        return {absl::StrCat(key, ": ", YAML::Dump(n), " has the wrong type (", e.what(), ")")};
      }
    };
  };
  const std::map<std::string, config::SectionReader> sections = {
      {"metrics",
       guarded("metrics", [c](const YAML::Node& n) { return ReadMetricsSection(n, c); })},
      {"quotas", guarded("quotas",
                         [c](const YAML::Node& n) -> std::vector<std::string> {
                           absl::Status s = ParseQuotaPolicy(n, &c->quotas);
                           if (s.ok()) return {};
                           return {std::string(s.message())};
                         })},
  };
  std::vector<std::string> errors;
  config::ReadSettingsYaml(root, CoordinatorSettings{}, sections, "config.", c, &errors);
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
}

// The rules across fields (each field's own range is CoordinatorSettings'): liveness timings,
// the restart backoff, the port range, the priorities that never preempt. Fills
// heartbeat_interval_s when 0.
void CheckTimings(CoordinatorConfig* c, std::vector<std::string>& e) {
  if (!(c->lost_after_s >= c->heartbeat_timeout_s && c->lost_after_s <= 86400)) {
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
  if (!(c->restart_backoff_base_s >= 0 && c->restart_backoff_max_s >= c->restart_backoff_base_s)) {
    e.push_back(
        absl::StrCat("restart_backoff_base_s/restart_backoff_max_s: ", c->restart_backoff_base_s,
                     "/", c->restart_backoff_max_s, " invalid (need 0 <= base <= max)"));
  }
  if (c->rendezvous_port_min < 1 || c->rendezvous_port_max > 65535 ||
      c->rendezvous_port_min > c->rendezvous_port_max) {
    e.push_back(absl::StrCat("rendezvous_port_min/rendezvous_port_max: ", c->rendezvous_port_min,
                             "/", c->rendezvous_port_max,
                             " is not a port range (use 1 <= min <= max <= 65535)"));
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

// The limits bounded by other fields: quotas, the log buffers' total, the stream caps.
// Fills max_streams_per_tenant when 0.
void CheckLimits(CoordinatorConfig* c, std::vector<std::string>& e) {
  if (absl::Status s = ValidateQuotaPolicy(c->quotas); !s.ok()) {
    e.push_back(std::string(s.message()));
  }
  constexpr int64_t kGiB = 1024 * 1024 * 1024;
  if (c->log_buffer_bytes_total < c->log_buffer_bytes_per_job ||
      c->log_buffer_bytes_total > 64 * kGiB) {
    e.push_back(absl::StrCat("log_buffer_bytes_total: ", c->log_buffer_bytes_total,
                             " is out of range (use log_buffer_bytes_per_job (",
                             c->log_buffer_bytes_per_job, ") .. 68719476736 bytes)"));
  }
  if (c->max_streams < c->max_streams_per_identity || c->max_streams > 100000) {
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
  config::CheckSettings(*c, CoordinatorSettings{}, &e);  // Each field's own range.
  CheckEndpoints(c, e);
  CheckTimings(c, e);
  CheckLimits(c, e);
  if (!e.empty()) return absl::InvalidArgumentError(absl::StrJoin(e, "\n"));
  FinalizeRoots(c, e);
  if (!e.empty()) return absl::InvalidArgumentError(absl::StrJoin(e, "\n"));
  return absl::OkStatus();
}

}  // namespace ulysses::coordinator
