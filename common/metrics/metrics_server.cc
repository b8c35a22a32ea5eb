#include "common/metrics/metrics_server.h"

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "httplib.h"

namespace ulysses {
namespace metrics {

absl::Status ValidateMetricsServerConfig(const MetricsServerConfig& config) {
  if (config.host.empty()) {
    return absl::InvalidArgumentError(
        "metrics.host is empty; set an address such as 0.0.0.0 or 127.0.0.1");
  }
  if (config.port < 0 || config.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics.port = ", config.port, " is out of range; use 1..65535, or 0 for any free port"));
  }
  if (config.threads < 1 || config.threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.threads = ", config.threads, " is out of range; use 1..64"));
  }
  return absl::OkStatus();
}

class MetricsServer::Impl {
 public:
  Impl(const Registry* registry, MetricsServerConfig config, HealthCheck readiness_check,
       HealthCheck liveness_check)
      : registry_(registry),
        config_(std::move(config)),
        readiness_check_(std::move(readiness_check)),
        liveness_check_(std::move(liveness_check)) {}

  ~Impl() { Stop(); }

  absl::Status Start() {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kNew) {
      return absl::FailedPreconditionError("metrics server: Start() called twice");
    }
    if (absl::Status status = ValidateMetricsServerConfig(config_); !status.ok()) {
      return status;
    }
    InstallRoutes();
    const int threads = config_.threads;
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    // httplib's default sets SO_REUSEPORT, which would let a second server bind a
    // busy port silently; SO_REUSEADDR alone keeps "address in use" an error.
    server_.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    int bound = -1;
    if (config_.port == 0) {
      bound = server_.bind_to_any_port(config_.host);
    } else if (server_.bind_to_port(config_.host, config_.port)) {
      bound = config_.port;
    }
    if (bound <= 0) {
      return absl::UnavailableError(absl::StrCat(
          "metrics server: cannot listen on ", config_.host, ":", config_.port,
          " (address in use or not available on this host); free the port or choose another "
          "metrics port"));
    }
    listen_returned_.store(false);
    thread_ = std::thread([this] {
      server_.listen_after_bind();
      listen_returned_.store(true);
    });
    // stop() is a no-op until the accept loop runs, so wait until it does (or until
    // listen_after_bind() gave up); either happens right after the thread starts.
    while (!server_.is_running() && !listen_returned_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!server_.is_running()) {
      thread_.join();
      state_ = State::kStopped;
      return absl::UnavailableError(absl::StrCat("metrics server: the accept loop on ",
                                                 config_.host, ":", bound, " failed to start"));
    }
    port_.store(bound);
    state_ = State::kRunning;
    ULOG(INFO) << "metrics server listening on " << config_.host << ":" << bound;
    return absl::OkStatus();
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kRunning) {
      server_.stop();
      if (thread_.joinable()) {
        thread_.join();
      }
    }
    state_ = State::kStopped;
  }

  int port() const { return port_.load(); }
  std::string address() const { return absl::StrCat(config_.host, ":", port_.load()); }

 private:
  enum class State { kNew, kRunning, kStopped };

  void InstallRoutes() {
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(registry_->Serialize(), kTextContentType);
    });
    auto ready = [this](const httplib::Request&, httplib::Response& res) {
      Answer(readiness_check_, res);
    };
    server_.Get("/readyz", ready);
    server_.Get("/healthz", ready);
    server_.Get("/livez", [this](const httplib::Request&, httplib::Response& res) {
      Answer(liveness_check_, res);
    });
  }

  static void Answer(const HealthCheck& check, httplib::Response& res) {
    absl::Status status = check ? check() : absl::OkStatus();
    if (status.ok()) {
      res.set_content("ok\n", "text/plain; charset=utf-8");
    } else {
      res.status = 503;
      res.set_content(absl::StrCat(status.ToString(), "\n"), "text/plain; charset=utf-8");
    }
  }

  const Registry* const registry_;
  const MetricsServerConfig config_;
  const HealthCheck readiness_check_;
  const HealthCheck liveness_check_;
  absl::Mutex mu_;  // Serialises Start/Stop.
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  httplib::Server server_;
  std::thread thread_;
  std::atomic<int> port_{0};
  std::atomic<bool> listen_returned_{false};
};

MetricsServer::MetricsServer(const Registry* registry, MetricsServerConfig config,
                             HealthCheck readiness_check, HealthCheck liveness_check)
    : impl_(std::make_unique<Impl>(registry, std::move(config), std::move(readiness_check),
                                   std::move(liveness_check))) {}

MetricsServer::~MetricsServer() = default;

absl::Status MetricsServer::Start() { return impl_->Start(); }
void MetricsServer::Stop() { impl_->Stop(); }
int MetricsServer::port() const { return impl_->port(); }
std::string MetricsServer::address() const { return impl_->address(); }

}  // namespace metrics
}  // namespace ulysses
