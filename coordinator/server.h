// CoordinatorServer: the whole ulysses-coordinator daemon as one object, so the
// binary's main() and in-process tests run the same wiring:
//   metrics Registry -> Coordinator (SQLite recovery) -> Authenticator (token file, or a
//   first-start admin token in the state dir) -> gRPC server (TLS with optional client
//   certificates, or plaintext on loopback / --insecure; JobService and WorkerService
//   authenticated, standard health service open: SERVING once recovered) -> MetricsServer.
// Shutdown() runs in reverse order. Not copyable; Shutdown() is idempotent and also
// run by the destructor.
#ifndef ULYSSES_COORDINATOR_SERVER_H_
#define ULYSSES_COORDINATOR_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "coordinator/auth/authenticator.h"
#include "coordinator/config.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"

namespace ulysses::coordinator {

class CoordinatorServer {
 public:
  // `config` must have passed ValidateAndFinalize. Errors: the store cannot be opened
  // (FailedPrecondition), a port cannot be bound (Unavailable).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorConfig& config);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  void Shutdown();
  // Re-publishes coordinator health to the gRPC health service (call periodically).
  void UpdateHealth();
  // Re-reads the token file (SIGHUP). On error the old tokens stay in force; the reason
  // is logged and returned.
  absl::Status ReloadTokens();

  int port() const { return port_; }  // Bound gRPC port.
  int metrics_port() const;           // Bound metrics port (0 = off).
  Coordinator* coordinator() { return coordinator_.get(); }
  metrics::Registry* registry() { return &registry_; }
  auth::Authenticator* authenticator() { return authenticator_.get(); }
  // <state_dir>/ulyssesctl-config.yaml when the admin token was bootstrapped, else "".
  const std::string& client_config_path() const { return client_config_path_; }

 private:
  CoordinatorServer() = default;

  metrics::Registry registry_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<auth::Authenticator> authenticator_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  int port_ = 0;
  std::string client_config_path_;
  bool shut_down_ = false;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_SERVER_H_
