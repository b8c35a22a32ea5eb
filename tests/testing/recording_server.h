// RecordingServer: a real in-process gRPC server on 127.0.0.1 whose JobService answers
// ListWorkers (one worker, "w-recorded") and records what it saw of each caller: the
// `authorization` and `ulysses-version` metadata, the transport (insecure | ssl) and the client
// certificate's common name. For client-side credential tests (channel, ulyssesctl); the
// coordinator's own enforcement is tested against the real coordinator.
#ifndef ULYSSES_TESTS_TESTING_RECORDING_SERVER_H_
#define ULYSSES_TESTS_TESTING_RECORDING_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "tests/testing/certs.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::testing {

class RecordingServer final : public ulysses::v1::JobService::Service {
 public:
  struct Seen {
    int calls = 0;
    std::string authorization;  // Of the last call; "" when absent.
    std::string version;        // The last call's `ulysses-version` metadata; "" when absent.
    std::string transport;      // "insecure" | "ssl".
    std::string client_cn;      // x509 common name of the client certificate; "" if none.
  };

  // Starts on 127.0.0.1:0: plaintext, or TLS with TestCerts' server certificate
  // (client certificates signed by its CA requested and verified when presented).
  // port() is 0 when it could not start.
  explicit RecordingServer(bool tls) {
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (tls) {
      const DevCerts& certs = TestCerts({"w1", "w2"});
      grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
      ssl.pem_root_certs = ReadFile(certs.ca);
      ssl.pem_key_cert_pairs.push_back({ReadFile(certs.server_key), ReadFile(certs.server_cert)});
      creds = grpc::SslServerCredentials(ssl);
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", creds, &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) port_ = 0;
  }
  ~RecordingServer() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  int port() const { return port_; }
  std::string address(const std::string& host = "127.0.0.1") const {
    return host + ":" + std::to_string(port_);
  }
  Seen seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

  grpc::Status ListWorkers(grpc::ServerContext* ctx, const ulysses::v1::ListWorkersRequest*,
                           ulysses::v1::ListWorkersResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++seen_.calls;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    seen_.authorization = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    it = md.find("ulysses-version");
    seen_.version = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    auto auth = ctx->auth_context();
    seen_.transport.clear();
    seen_.client_cn.clear();
    for (const auto& v : auth->FindPropertyValues("transport_security_type")) {
      seen_.transport = std::string(v.data(), v.size());
    }
    for (const auto& v : auth->FindPropertyValues("x509_common_name")) {
      seen_.client_cn = std::string(v.data(), v.size());
    }
    response->add_workers()->set_id("w-recorded");
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  Seen seen_;
};

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_RECORDING_SERVER_H_
