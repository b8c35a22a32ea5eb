// MetricsServer: a small HTTP server (cpp-httplib) on its own host:port serving
//   GET /metrics  the Registry in text format 0.0.4
//                 (Content-Type: text/plain; version=0.0.4; charset=utf-8)
//   GET /readyz   200 "ok\n", or 503 with the message when the readiness check fails
//                 (ready to serve: a Kubernetes readinessProbe).
//   GET /healthz  the same answer as /readyz (kept for existing probes and scripts).
//   GET /livez    200 "ok\n", or 503 with the message when the liveness check fails
//                 (alive: a livenessProbe; a process that recovers by itself must stay live).
//
// The Registry must outlive the server. Start() binds synchronously (so a port
// conflict is reported by Start itself) and then serves on a background thread;
// Stop() (also run by the destructor) shuts the listener down and joins the thread.
// All methods are thread-safe; Start() after Stop() is not supported (make a new
// server). A failed Start() leaves nothing running.
#ifndef ULYSSES_COMMON_METRICS_METRICS_SERVER_H_
#define ULYSSES_COMMON_METRICS_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/metrics/metrics.h"

namespace ulysses {
namespace metrics {

struct MetricsServerConfig {
  // Address to listen on: "0.0.0.0" in a pod, "127.0.0.1" in tests.
  std::string host = "0.0.0.0";
  // TCP port; 0 picks a free port (read it back with MetricsServer::port()).
  int port = 9090;
  // Threads serving requests (scrapes are cheap; two suffice for Prometheus + a human).
  int threads = 2;
};

// InvalidArgument naming the field, value and fix, or OK.
absl::Status ValidateMetricsServerConfig(const MetricsServerConfig& config);

class MetricsServer {
 public:
  // Optional checks; OK means ready (/readyz, /healthz) or live (/livez). Without one the
  // endpoint answers 200 while the server runs. Called on the serving threads: thread-safe.
  using HealthCheck = std::function<absl::Status()>;

  MetricsServer(const Registry* registry, MetricsServerConfig config,
                HealthCheck readiness_check = nullptr, HealthCheck liveness_check = nullptr);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Validates the config, binds host:port and starts serving. Errors:
  // InvalidArgument (bad config), Unavailable ("cannot listen on HOST:PORT ...",
  // e.g. the port is in use), FailedPrecondition (already started or stopped).
  absl::Status Start();
  // Idempotent; safe to call without Start().
  void Stop();

  // The bound port (after a successful Start(); 0 before).
  int port() const;
  // "host:port" with the bound port.
  std::string address() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace metrics
}  // namespace ulysses

#endif  // ULYSSES_COMMON_METRICS_METRICS_SERVER_H_
