#include "client/grpc_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc/channel.h"
#include "common/grpc/grpc_util.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"

namespace ulysses::client {

namespace v1 = ::ulysses::v1;

absl::StatusOr<JobClient> JobClient::Create(Connection connection, absl::Duration rpc_timeout) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(connection.channel);
  if (!channel.ok()) return channel.status();
  auto stub = v1::JobService::NewStub(*channel);
  return JobClient(std::move(connection), rpc_timeout, std::move(stub));
}

JobClient::JobClient(Connection connection, absl::Duration rpc_timeout,
                     std::unique_ptr<v1::JobService::Stub> stub)
    : connection_(std::move(connection)), rpc_timeout_(rpc_timeout), stub_(std::move(stub)) {}

std::string NewRequestId() {
  std::random_device device;
  std::string id = "ulyssesctl-";
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(device(), absl::kZeroPad8));
  return id;
}

absl::StatusOr<v1::SubmitJobResponse> JobClient::Submit(const std::string& spec_yaml,
                                                        const std::vector<std::string>& sets,
                                                        std::string request_id,
                                                        bool allow_duplicate_name) {
  v1::SubmitJobRequest request;
  request.set_spec_yaml(spec_yaml);
  request.set_allow_duplicate_name(allow_duplicate_name);
  for (const auto& s : sets) request.add_overrides(s);
  request.set_request_id(request_id.empty() ? NewRequestId() : std::move(request_id));
  absl::Duration backoff = submit_retry_.initial_backoff;
  absl::Status status;
  for (last_submit_calls_ = 1;; ++last_submit_calls_) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, rpc_timeout_);
    v1::SubmitJobResponse response;
    status = FromGrpcStatus(stub_->SubmitJob(&ctx, request, &response));
    if (status.ok()) return response;
    const bool retryable = status.code() == absl::StatusCode::kUnavailable ||
                           status.code() == absl::StatusCode::kDeadlineExceeded;
    if (!retryable || last_submit_calls_ >= submit_retry_.attempts) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, submit_retry_.max_backoff);
  }
  if (last_submit_calls_ > 1) {
    return absl::Status(status.code(),
                        absl::StrCat(status.message(), " (", last_submit_calls_,
                                     " attempts with request_id ", request.request_id(), ")"));
  }
  return status;
}

absl::StatusOr<v1::Job> JobClient::GetJob(const std::string& id, bool include_events,
                                          bool include_spec) {
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, rpc_timeout_);
  v1::GetJobRequest request;
  request.set_job_id(id);
  request.set_include_events(include_events);
  request.set_include_spec(include_spec);
  v1::GetJobResponse response;
  absl::Status status = FromGrpcStatus(stub_->GetJob(&ctx, request, &response));
  if (!status.ok()) return status;
  return response.job();
}

absl::StatusOr<std::vector<v1::Job>> JobClient::ListJobs(const v1::ListJobsRequest& filter) {
  std::vector<v1::Job> jobs;
  std::string token;
  for (int page = 0; page < 1000; ++page) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, rpc_timeout_);
    v1::ListJobsRequest request = filter;
    request.set_page_size(1000);
    request.set_page_token(token);
    v1::ListJobsResponse response;
    absl::Status status = FromGrpcStatus(stub_->ListJobs(&ctx, request, &response));
    if (!status.ok()) return status;
    for (auto& job : *response.mutable_jobs()) jobs.push_back(std::move(job));
    token = response.next_page_token();
    if (token.empty()) break;
  }
  return jobs;
}

absl::StatusOr<std::string> JobClient::ResolveJob(const std::string& ref) {
  // An id: job- and six or more digits (coordinator/validation.h CheckJobId).
  if (ref.size() > 4 && ref.compare(0, 4, "job-") == 0 &&
      ref.find_first_not_of("0123456789", 4) == std::string::npos) {
    return ref;
  }
  v1::ListJobsRequest filter;
  filter.set_name(ref);
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, ListJobs(filter));  // Newest first.
  if (jobs.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no job has the id or name \"", ref, "\" (ulyssesctl get jobs lists them)"));
  }
  std::vector<std::string> live;
  for (const v1::Job& job : jobs) {
    const bool ended = job.state() == v1::JOB_STATE_SUCCEEDED ||
                       job.state() == v1::JOB_STATE_FAILED ||
                       job.state() == v1::JOB_STATE_CANCELLED;
    if (!ended) live.push_back(job.id());
  }
  if (live.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat("the name \"", ref, "\" is shared by ",
                                                      live.size(), " jobs that have not ended (",
                                                      absl::StrJoin(live, ", "), "): use an id"));
  }
  return live.empty() ? jobs.front().id() : live.front();
}

absl::StatusOr<v1::Job> JobClient::Cancel(const std::string& id, const std::string& reason) {
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, rpc_timeout_);
  v1::CancelJobRequest request;
  request.set_job_id(id);
  request.set_reason(reason);
  v1::CancelJobResponse response;
  absl::Status status = FromGrpcStatus(stub_->CancelJob(&ctx, request, &response));
  if (!status.ok()) return status;
  return response.job();
}

absl::StatusOr<v1::Job> JobClient::Resume(const std::string& id) {
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, rpc_timeout_);
  v1::ResumeJobRequest request;
  request.set_job_id(id);
  v1::ResumeJobResponse response;
  absl::Status status = FromGrpcStatus(stub_->ResumeJob(&ctx, request, &response));
  if (!status.ok()) return status;
  return response.job();
}

absl::StatusOr<std::vector<v1::Worker>> JobClient::ListWorkers() {
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, rpc_timeout_);
  v1::ListWorkersResponse response;
  absl::Status status =
      FromGrpcStatus(stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &response));
  if (!status.ok()) return status;
  return std::vector<v1::Worker>(response.workers().begin(), response.workers().end());
}

absl::StatusOr<v1::BackupStateChunk> JobClient::Backup(const std::string& to,
                                                       absl::Duration timeout) {
  const std::string tmp = to + ".tmp";
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--to: cannot create \"", tmp, "\" (",
                                                   std::strerror(errno), "; check the path)"));
  }
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, timeout);
  std::unique_ptr<grpc::ClientReader<v1::BackupStateChunk>> reader =
      stub_->BackupState(&ctx, v1::BackupStateRequest());
  v1::BackupStateChunk chunk, last;
  int64_t written = 0;
  absl::Status io;
  while (reader->Read(&chunk)) {
    const std::string& data = chunk.data();
    for (size_t off = 0; io.ok() && off < data.size();) {
      const ssize_t n = write(fd, data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        io = absl::InternalError(absl::StrCat("writing \"", tmp, "\": ", std::strerror(errno)));
        break;
      }
      off += static_cast<size_t>(n);
    }
    if (!io.ok()) {
      ctx.TryCancel();
      break;
    }
    written += static_cast<int64_t>(data.size());
    last = std::move(chunk);
    last.clear_data();
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (io.ok() && fsync(fd) != 0) {
    io = absl::InternalError(absl::StrCat("fsync \"", tmp, "\": ", std::strerror(errno)));
  }
  close(fd);
  if (status.ok() && io.ok() && written != last.total_bytes()) {
    io = absl::InternalError(absl::StrCat("the backup stream ended after ", written, " of ",
                                          last.total_bytes(), " bytes; try again"));
  }
  if (status.ok() && io.ok() && std::rename(tmp.c_str(), to.c_str()) != 0) {
    io = absl::InternalError(
        absl::StrCat("cannot rename \"", tmp, "\" to \"", to, "\" (", std::strerror(errno), ")"));
  }
  if (!status.ok() || !io.ok()) {
    unlink(tmp.c_str());
    return status.ok() ? io : status;
  }
  return last;
}

absl::Status JobClient::Watch(const std::string& id, absl::Duration timeout,
                              const std::function<bool(const v1::JobEvent&)>& on_event) {
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, timeout);
  v1::WatchJobRequest request;
  request.set_job_id(id);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&ctx, request);
  v1::JobEvent event;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      ctx.TryCancel();
      while (reader->Read(&event)) {
      }
      reader->Finish();
      return absl::OkStatus();
    }
  }
  return FromGrpcStatus(reader->Finish());
}

absl::Status JobClient::Logs(const std::string& id, int tail, bool follow, absl::Duration timeout,
                             const std::function<void(const v1::LogLine&)>& on_line) {
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, timeout);
  v1::GetJobLogsRequest request;
  request.set_job_id(id);
  request.set_tail_lines(tail);
  request.set_follow(follow);
  std::unique_ptr<grpc::ClientReader<v1::GetJobLogsResponse>> reader =
      stub_->GetJobLogs(&ctx, request);
  v1::GetJobLogsResponse response;
  while (reader->Read(&response)) {
    for (const auto& line : response.lines()) on_line(line);
  }
  return FromGrpcStatus(reader->Finish());
}

std::string FormatRpcError(const absl::Status& status, const std::string& address) {
  const std::string code = absl::StatusCodeToString(status.code());
  if (status.code() == absl::StatusCode::kUnavailable) {
    return absl::StrCat("error: cannot reach the coordinator at ", address, " (", code, ": ",
                        status.message(), ")");
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::StrCat("error: the coordinator at ", address, " did not answer in time (", code,
                        ": ", status.message(), ")");
  }
  return absl::StrCat("error: ", code, ": ", status.message());
}

std::string FormatRpcError(const absl::Status& status, const Connection& connection) {
  std::string line = FormatRpcError(status, connection.channel.server);
  if (const std::string hint = AuthHint(status, connection); !hint.empty()) {
    absl::StrAppend(&line, "\nhint: ", hint);
  }
  return line;
}

}  // namespace ulysses::client
