// gRPC callback-API services of ulysses-coordinator: JobService (users) and
// WorkerService (workers), thin translations onto Coordinator. Every handler first
// authenticates and authorizes its caller (auth::Authenticator::Authorize: token or
// worker certificate, then the role -> RPC table) and passes the Principal on, so the
// Coordinator scopes jobs to the caller's tenant and worker names to their identity.
// This is an explicit call at the top of each handler rather than a server interceptor:
// the handlers need the Principal itself, which an interceptor could not hand them
// without a side channel, and a missing check shows in review (tests/security calls
// every RPC without a token). Every JobService request and Session hello is then
// checked against its bounds (validation.h). Streams
// are small reactor classes that also act as the Coordinator's sinks (see coordinator.h).
//
// The services hold a non-owning Coordinator pointer: the gRPC server must be shut
// down (all reactors done) before the Coordinator is destroyed.
#ifndef ULYSSES_COORDINATOR_SERVICE_H_
#define ULYSSES_COORDINATOR_SERVICE_H_

#include <grpcpp/server_builder.h>

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "coordinator/async_bidi.h"
#include "coordinator/auth/authenticator.h"
#include "coordinator/coordinator.h"
#include "coordinator/stream_limits.h"
#include "ulysses/v1/job_service.grpc.pb.h"
#include "ulysses/v1/worker_service.grpc.pb.h"

namespace ulysses::coordinator {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // `rpc_seconds` (ulysses_rpc_duration_seconds{method}) may be null. Open WatchJob and
  // GetJobLogs-follow streams are capped by `stream_limits` (per identity, total).
  JobServiceImpl(Coordinator* coordinator, const auth::Authenticator* auth,
                 metrics::HistogramFamily* rpc_seconds, const StreamLimitsConfig& stream_limits)
      : coordinator_(coordinator),
        auth_(auth),
        rpc_seconds_(rpc_seconds),
        streams_(stream_limits.per_identity, stream_limits.total, stream_limits.queue_bytes,
                 stream_limits.per_tenant, stream_limits.stall_ms) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* context,
                                      const v1::ResumeJobRequest* request,
                                      v1::ResumeJobResponse* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<v1::GetJobLogsResponse>* GetJobLogs(
      grpc::CallbackServerContext* context, const v1::GetJobLogsRequest* request) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  // backup_service.h.
  grpc::ServerWriteReactor<v1::BackupStateChunk>* BackupState(
      grpc::CallbackServerContext* context, const v1::BackupStateRequest* request) override;

 private:
  Coordinator* coordinator_;
  const auth::Authenticator* auth_;
  metrics::HistogramFamily* rpc_seconds_;
  StreamLimits streams_;
};

// Register is served by the callback API; Session, one long-lived stream per worker, by the
// async API on completion queues of its own (async_bidi.h says why).
class WorkerServiceImpl final
    : public v1::WorkerService::WithCallbackMethod_Register<
          v1::WorkerService::WithAsyncMethod_Session<v1::WorkerService::Service>> {
 public:
  WorkerServiceImpl(Coordinator* coordinator, const auth::Authenticator* auth,
                    metrics::HistogramFamily* rpc_seconds)
      : coordinator_(coordinator),
        auth_(auth),
        rpc_seconds_(rpc_seconds),
        session_seconds_(rpc_seconds == nullptr
                             ? nullptr
                             : rpc_seconds->WithLabels({auth::RpcName(auth::Rpc::kSession)})) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;

  // Sessions' completion queues: added to `builder` before BuildAndStart (`queues` >= 1),
  // started once the server is, stopped after grpc::Server::Shutdown returned.
  void AddSessionQueues(grpc::ServerBuilder* builder, int queues);
  void StartSessions();
  void StopSessions();

 private:
  // Waits for the next Session call on `cq` (and, once it arrives, for the one after).
  void AcceptSession(grpc::ServerCompletionQueue* cq);

  Coordinator* coordinator_;
  const auth::Authenticator* auth_;
  metrics::HistogramFamily* rpc_seconds_;
  // Its Session child, resolved once: observed per worker message.
  const std::shared_ptr<metrics::Histogram> session_seconds_;
  std::unique_ptr<CompletionQueues> session_queues_;
  // Held while a call is requested, so StopSessions never shuts a queue down under a
  // request being posted to it (gRPC asserts on that).
  absl::Mutex accept_mu_;
  bool accepting_ ABSL_GUARDED_BY(accept_mu_) = false;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_SERVICE_H_
