// JobClient: ulyssesctl's connection to the coordinator's JobService.
//
// Every call has a deadline (unary: `rpc_timeout`; streams: the caller's timeout).
// Errors come back as absl::Status with the gRPC code and message; FormatRpcError
// turns them into the one line ulyssesctl prints. The channel connects lazily; an
// unreachable coordinator fails fast with UNAVAILABLE (no wait-for-ready).
// Thread-compatible: one JobClient per thread.
#ifndef ULYSSES_CLIENT_GRPC_CLIENT_H_
#define ULYSSES_CLIENT_GRPC_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/config.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::client {

class JobClient {
 public:
  // Opens the channel of `connection` (TLS, token; common/grpc/channel.h).
  static absl::StatusOr<JobClient> Create(Connection connection,
                                          absl::Duration rpc_timeout = absl::Seconds(10));

  const std::string& address() const { return connection_.channel.server; }
  const Connection& connection() const { return connection_; }

  // SubmitJob with `request_id` (NewRequestId() when empty): an UNAVAILABLE or
  // DEADLINE_EXCEEDED answer is retried with the same id, up to `submit_attempts` calls
  // in all with doubling backoff. Safe because the coordinator answers a repeated id with
  // the job it already created (SubmitJobRequest.request_id) instead of a second one.
  // `allow_duplicate_name`: queue it even when another job of the tenant that has not ended
  // has its metadata.name (SubmitJobRequest.allow_duplicate_name).
  absl::StatusOr<ulysses::v1::SubmitJobResponse> Submit(const std::string& spec_yaml,
                                                        const std::vector<std::string>& sets,
                                                        std::string request_id = "",
                                                        bool allow_duplicate_name = false);
  // Retry policy of Submit (tests shorten the backoff).
  struct SubmitRetry {
    int attempts = 4;
    absl::Duration initial_backoff = absl::Milliseconds(500);
    absl::Duration max_backoff = absl::Seconds(4);
  };
  void set_submit_retry(const SubmitRetry& retry) { submit_retry_ = retry; }
  // Calls the last Submit made (1 when the first one answered).
  int last_submit_calls() const { return last_submit_calls_; }
  absl::StatusOr<ulysses::v1::Job> GetJob(const std::string& id, bool include_events,
                                          bool include_spec);
  // Every job (all pages) matching `filter`'s fields (ListJobsRequest: states, name,
  // labels, tenant; page fields ignored), newest first.
  absl::StatusOr<std::vector<ulysses::v1::Job>> ListJobs(
      const ulysses::v1::ListJobsRequest& filter = {});
  // The id of the job `ref` names: `ref` itself when it is an id (job-NNNNNN); else the
  // caller's job of that metadata.name that has not ended, or the newest one of that name
  // when all ended. NotFound / FailedPrecondition (two live jobs of that name: lists them).
  absl::StatusOr<std::string> ResolveJob(const std::string& ref);
  absl::StatusOr<ulysses::v1::Job> Cancel(const std::string& id, const std::string& reason);
  absl::StatusOr<ulysses::v1::Job> Resume(const std::string& id);
  absl::StatusOr<std::vector<ulysses::v1::Worker>> ListWorkers();
  // BackupState (admin): the coordinator's store, written to `to` (through <to>.tmp, mode
  // 0600, renamed when every byte came). Returns the last chunk's figures (no data).
  absl::StatusOr<ulysses::v1::BackupStateChunk> Backup(const std::string& to,
                                                       absl::Duration timeout);

  // Streams WatchJob events to `on_event` until the server ends the stream (the job
  // ended), `on_event` returns false, or `timeout` passes.
  absl::Status Watch(const std::string& id, absl::Duration timeout,
                     const std::function<bool(const ulysses::v1::JobEvent&)>& on_event);
  // Streams log lines (the last `tail` lines, then new ones when `follow`).
  absl::Status Logs(const std::string& id, int tail, bool follow, absl::Duration timeout,
                    const std::function<void(const ulysses::v1::LogLine&)>& on_line);

 private:
  JobClient(Connection connection, absl::Duration rpc_timeout,
            std::unique_ptr<ulysses::v1::JobService::Stub> stub);

  Connection connection_;
  absl::Duration rpc_timeout_;
  SubmitRetry submit_retry_;
  int last_submit_calls_ = 0;
  std::unique_ptr<ulysses::v1::JobService::Stub> stub_;
};

// A fresh idempotency key for SubmitJob: "ulyssesctl-" + 32 random hex digits.
std::string NewRequestId();

// "error: NOT_FOUND: job job-000009 not found", or for UNAVAILABLE:
// "error: cannot reach the coordinator at HOST:PORT (UNAVAILABLE: ...)"; for
// UNAUTHENTICATED a second line says what to do (AuthHint).
std::string FormatRpcError(const absl::Status& status, const std::string& address);
std::string FormatRpcError(const absl::Status& status, const Connection& connection);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_GRPC_CLIENT_H_
