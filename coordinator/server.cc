#include "coordinator/server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics/build_info.h"
#include "common/status.h"

namespace ulysses::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  RETURN_IF_ERROR(metrics::RegisterBuildInfo(&s->registry_));
  absl::StatusOr<metrics::HistogramFamily*> rpc_seconds = s->registry_.AddHistogram(
      "ulysses_rpc_duration_seconds", "Server-side handling time of coordinator RPCs.", {"method"},
      metrics::ExponentialBuckets(0.0005, 2, 14));
  RETURN_IF_ERROR(rpc_seconds.status());

  ASSIGN_OR_RETURN(s->coordinator_, Coordinator::Create(config, &s->registry_));
  s->job_service_ = std::make_unique<JobServiceImpl>(s->coordinator_.get(), *rpc_seconds);
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(s->coordinator_.get(), *rpc_seconds);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->worker_service_.get());
  // Workers hold one long-lived stream each; keep idle ones alive through NATs.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    s->server_.reset();
    return absl::UnavailableError(absl::StrCat("listen: cannot serve gRPC on \"", config.listen,
                                               "\" (port in use or bad address?)"));
  }
  s->coordinator_->Start();
  s->UpdateHealth();

  if (!config.metrics_listen.empty()) {
    metrics::MetricsServerConfig mc;
    RETURN_IF_ERROR(ParseHostPort("metrics_listen", config.metrics_listen, &mc.host, &mc.port));
    Coordinator* coordinator = s->coordinator_.get();
    s->metrics_server_ = std::make_unique<metrics::MetricsServer>(
        &s->registry_, mc, [coordinator]() -> absl::Status {
          return coordinator->serving() ? absl::OkStatus()
                                        : absl::UnavailableError(coordinator->health_reason());
        });
    RETURN_IF_ERROR(s->metrics_server_->Start());
  }
  ULOG(INFO) << "ulysses-coordinator serving gRPC on port " << s->port_ << ", metrics on "
             << (s->metrics_server_ ? s->metrics_server_->address() : std::string("(off)"));
  return s;
}

void CoordinatorServer::UpdateHealth() {
  if (server_ == nullptr || server_->GetHealthCheckService() == nullptr) return;
  bool serving = coordinator_ != nullptr && coordinator_->serving();
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

int CoordinatorServer::metrics_port() const {
  return metrics_server_ ? metrics_server_->port() : 0;
}

void CoordinatorServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (metrics_server_) metrics_server_->Stop();
  if (server_) {
    if (server_->GetHealthCheckService() != nullptr) {
      server_->GetHealthCheckService()->SetServingStatus(false);
    }
    // Close worker sessions and watch streams first so Shutdown need not wait them out.
    if (coordinator_) coordinator_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
  if (coordinator_) coordinator_->Shutdown();
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

}  // namespace ulysses::coordinator
