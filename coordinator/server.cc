#include "coordinator/server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics/build_info.h"
#include "common/metrics/catalog.h"
#include "common/net/host_port.h"
#include "common/status.h"
#include "coordinator/auth/bootstrap.h"

namespace ulysses::coordinator {
namespace {

// /livez fails when no tick completed for this long (ticks run every 100 ms; a tick holding
// the lock through a slow store write takes seconds at worst). The probe's periodSeconds x
// failureThreshold (deploy/k8s) adds a minute before kubelet restarts the process.
constexpr int64_t kLivenessStallMs = 60000;

absl::StatusOr<std::string> ReadPem(const std::string& field, const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  if (in) ss << in.rdbuf();
  if (!in || ss.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": \"", path, "\" is not a readable PEM file (see scripts/dev_certs.sh)"));
  }
  return ss.str();
}

// TLS (with client certificates requested and verified when tls_client_ca is set) or
// plaintext; ValidateAndFinalize already refused plaintext off loopback without
// --insecure.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const CoordinatorConfig& config) {
  if (!config.tls()) {
    if (config.insecure) {
      ULOG(WARNING) << "--insecure: serving PLAINTEXT gRPC on " << config.listen
                    << "; bearer tokens cross the network in the clear (set tls_cert/tls_key)";
    }
    return grpc::InsecureServerCredentials();
  }
  // Read once here so a bad file fails the start with its field named; from then on
  // gRPC's file watcher re-reads the files every tls_reload_interval_s, so a rotated
  // certificate (cert-manager renewing the Secret) is served without a restart. A
  // rotation caught half-written (key and cert not matching) keeps the old pair.
  RETURN_IF_ERROR(ReadPem("tls_key", config.tls_key).status());
  RETURN_IF_ERROR(ReadPem("tls_cert", config.tls_cert).status());
  if (!config.tls_client_ca.empty()) {
    RETURN_IF_ERROR(ReadPem("tls_client_ca", config.tls_client_ca).status());
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      config.tls_key, config.tls_cert, config.tls_client_ca,
      static_cast<unsigned int>(config.tls_reload_interval_s));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (config.tls_client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

// The address a local client dials: the listen host (a wildcard becomes loopback)
// and the bound port.
std::string LocalDialAddress(const CoordinatorConfig& config, int port) {
  absl::StatusOr<net::HostPort> listen = net::ParseHostPort("listen", config.listen, "");
  std::string host = listen.ok() ? listen->host : "";
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  return net::JoinHostPort(host, port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  RETURN_IF_ERROR(metrics::RegisterBuildInfo(&s->registry_));
  absl::StatusOr<metrics::HistogramFamily*> rpc_seconds =
      metrics::RegisterHistogram(&s->registry_, "ulysses_rpc_duration_seconds");
  RETURN_IF_ERROR(rpc_seconds.status());

  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, MakeCredentials(config));
  ASSIGN_OR_RETURN(s->coordinator_, Coordinator::Create(config, &s->registry_));
  std::vector<auth::TokenEntry> fixed;
  if (config.token_file.empty()) {
    ASSIGN_OR_RETURN(auth::TokenEntry admin, auth::EnsureAdminToken(config.state_dir));
    fixed.push_back(std::move(admin));
  }
  ASSIGN_OR_RETURN(s->authenticator_, auth::Authenticator::Create(config.token_file, fixed));
  s->job_service_ = std::make_unique<JobServiceImpl>(
      s->coordinator_.get(), s->authenticator_.get(), *rpc_seconds,
      StreamLimitsConfig{config.max_streams_per_identity, config.max_streams,
                         config.stream_queue_max_bytes, config.max_streams_per_tenant,
                         static_cast<int64_t>(config.stream_stall_s * 1000)});
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(s->coordinator_.get(),
                                                           s->authenticator_.get(), *rpc_seconds);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.listen, credentials, &s->port_);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->worker_service_.get());
  s->worker_service_->AddSessionQueues(&builder, static_cast<int>(config.session_queues));
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
  s->worker_service_->StartSessions();
  s->coordinator_->Start();
  s->UpdateHealth();

  if (!config.metrics_listen.empty()) {
    metrics::MetricsServerConfig mc;
    ASSIGN_OR_RETURN(net::HostPort metrics_at,
                     net::ParseHostPort("metrics_listen", config.metrics_listen, "0.0.0.0:9090"));
    mc.host = metrics_at.host;
    mc.port = metrics_at.port;
    Coordinator* coordinator = s->coordinator_.get();
    // /readyz: the store accepts writes. /livez: the ticker turns (a read-only store does
    // not fail it: the coordinator recovers in place; deploy/k8s/base/coordinator.yaml).
    s->metrics_server_ = std::make_unique<metrics::MetricsServer>(
        &s->registry_, mc,
        [coordinator]() -> absl::Status {
          return coordinator->serving() ? absl::OkStatus()
                                        : absl::UnavailableError(coordinator->health_reason());
        },
        [coordinator]() -> absl::Status {
          return coordinator->LivenessAt(SteadyMs(), kLivenessStallMs);
        },
        [coordinator, registry = &s->registry_, policy = config.metrics_job_series] {
          if (policy == JobSeries::kAll) return registry->Serialize();
          return metrics::WriteTextFormat(
              ApplyJobSeries(registry->Collect(), policy,
                             policy == JobSeries::kLabels ? coordinator->JobTenants()
                                                          : std::map<std::string, std::string>{}));
        });
    RETURN_IF_ERROR(s->metrics_server_->Start());
  }
  ULOG(INFO) << "ulysses-coordinator serving gRPC on port " << s->port_ << " ("
             << (config.tls() ? (config.tls_client_ca.empty() ? "TLS" : "TLS, worker client certs")
                              : "plaintext")
             << "), metrics on "
             << (s->metrics_server_ ? s->metrics_server_->address() : std::string("(off)"));
  if (config.token_file.empty()) {
    ASSIGN_OR_RETURN(s->client_config_path_,
                     auth::WriteClientConfig(config.state_dir, LocalDialAddress(config, s->port_),
                                             config.tls() ? config.tls_client_ca : ""));
    ULOG(INFO) << "no token_file: admin token in " << config.state_dir << "/"
               << auth::kAdminTokenFile << "; ulyssesctl config in " << s->client_config_path_
               << " (export ULYSSES_CONFIG=" << s->client_config_path_ << ")";
  } else {
    ULOG(INFO) << "tokens: " << s->authenticator_->token_count() << " from " << config.token_file
               << " (SIGHUP reloads it)";
  }
  return s;
}

void CoordinatorServer::UpdateHealth() {
  if (server_ == nullptr || server_->GetHealthCheckService() == nullptr) return;
  bool serving = coordinator_ != nullptr && coordinator_->serving();
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

absl::Status CoordinatorServer::ReloadTokens() {
  if (authenticator_ == nullptr) return absl::OkStatus();
  absl::Status s = authenticator_->Reload();
  if (s.ok()) {
    ULOG(INFO) << "tokens reloaded: " << authenticator_->token_count() << " in force";
  } else {
    ULOG(ERROR) << "token reload failed, the previous " << authenticator_->token_count()
                << " tokens stay in force: " << s.message();
  }
  return s;
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
    // Every call is cancelled once Shutdown returns; StopSessions lets the Session
    // reactors finish and be deleted before it shuts their queues down (async_bidi.h).
    worker_service_->StopSessions();
    server_->Wait();
  }
  if (coordinator_) coordinator_->Shutdown();
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

}  // namespace ulysses::coordinator
