// MetricsServer: a small HTTP/1.1 server on its own host:port serving
//   GET /metrics  the Registry in text format 0.0.4
//                 (Content-Type: text/plain; version=0.0.4; charset=utf-8)
//   GET /readyz   200 "ok\n", or 503 with the message when the readiness check fails
//                 (ready to serve: a Kubernetes readinessProbe).
//   GET /healthz  the same answer as /readyz (kept for existing probes and scripts).
//   GET /livez    200 "ok\n", or 503 with the message when the liveness check fails
//                 (alive: a livenessProbe; a process that recovers by itself must stay live).
// HEAD is answered like GET without the body; every answer closes its connection.
//
// The listener is not a door (SECURITY.md "Metrics listener"): it binds loopback unless told
// otherwise (the deploy passes the pod IP), and one event loop serves every connection, so a
// slow client holds a buffer, never a thread. Each connection has deadlines (the request's
// line and headers within read_deadline_ms, the answer within write_deadline_ms) and is cut
// when it misses one; a request that declares a body is refused (413) without reading it; the
// number of open connections is bounded overall and per peer address, so clients that dribble
// bytes cannot delay a probe beyond the time it takes to answer the ones ahead of it.
//
// The Registry must outlive the server. Start() binds synchronously (so a port conflict is
// reported by Start itself) and then serves on a background thread; Stop() (also run by the
// destructor) closes the listener and every connection and joins the thread. All methods are
// thread-safe; Start() after Stop() is not supported (make a new server). A failed Start()
// leaves nothing running.
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
  // Address to listen on: loopback by default; the pod IP (or 0.0.0.0) where Prometheus and
  // the kubelet must reach it.
  std::string host = "127.0.0.1";
  // TCP port; 0 picks a free port (read it back with MetricsServer::port()).
  int port = 9090;
  // Open connections at once, and from one peer address; beyond them a new connection is
  // closed at once (Prometheus and the kubelet each hold one or two).
  int max_connections = 128;
  int max_connections_per_peer = 8;
  // A connection must deliver its request line and headers within read_deadline_ms of
  // being accepted, and take the whole answer within write_deadline_ms of its request.
  int read_deadline_ms = 2000;
  int write_deadline_ms = 10000;
};

// InvalidArgument naming the field, value and fix, or OK.
absl::Status ValidateMetricsServerConfig(const MetricsServerConfig& config);

class MetricsServer {
 public:
  // Optional checks; OK means ready (/readyz, /healthz) or live (/livez). Without one the
  // endpoint answers 200 while the server runs. Called on the serving thread; they must not
  // block for long (every other connection waits meanwhile).
  using HealthCheck = std::function<absl::Status()>;
  // The body of /metrics; without one, registry->Serialize(). The coordinator's filters the
  // per-job series (metrics.job_series). Called on the serving thread.
  using Exposition = std::function<std::string()>;

  MetricsServer(const Registry* registry, MetricsServerConfig config,
                HealthCheck readiness_check = nullptr, HealthCheck liveness_check = nullptr,
                Exposition exposition = nullptr);
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
