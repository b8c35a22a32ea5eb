#include "worker/agent/coordinator_session.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/metrics/build_info.h"
#include "worker/agent/agent_messages.h"

namespace ulysses::agent {
namespace {

namespace v1 = ::ulysses::v1;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxOutbox = 20000;
constexpr size_t kMaxPendingLogs = 5000;
constexpr size_t kMaxLinesPerBatch = 500;
constexpr milliseconds kLogFlushInterval{200};
// The heartbeat intervals a coordinator may ask for (RegisterResponse, Ack); others are
// ignored with a warning.
constexpr milliseconds kMinHeartbeatInterval{100};
constexpr milliseconds kMaxHeartbeatInterval{3600 * 1000};

}  // namespace

CoordinatorSession::CoordinatorSession(const WorkerConfig& config, SlotTable* slots,
                                       Dispatch dispatch)
    : config_(config), dispatch_(std::move(dispatch)), slots_(slots) {}

CoordinatorSession::~CoordinatorSession() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    StopLocked();
  }
  thread_.join();
}

void CoordinatorSession::Start(std::shared_ptr<grpc::Channel> channel) {
  stub_ = v1::WorkerService::NewStub(std::move(channel));
  thread_ = std::thread([this] { SessionLoop(); });
}

void CoordinatorSession::StopLocked() {
  stopping_ = true;
  if (session_ctx_ != nullptr) session_ctx_->TryCancel();
}

void CoordinatorSession::Join() {
  if (thread_.joinable()) thread_.join();
}

void CoordinatorSession::SessionLoop() {
  milliseconds backoff = config_.reconnect_min;
  std::mt19937 rng(std::random_device{}());
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    const auto started = Clock::now();
    absl::Status status = Register();
    if (status.ok()) status = RunSession();
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (Clock::now() - started > std::chrono::seconds(10)) backoff = config_.reconnect_min;
    const milliseconds wait(
        std::uniform_int_distribution<int64_t>(backoff.count() / 2, backoff.count())(rng));
    ULOG(WARNING) << "coordinator session ended (" << status << "); reconnecting in "
                  << wait.count() << " ms"
                  << (slots_->AnyRunning() ? " (the ranks keep running)" : "");
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(wait));
    backoff = std::min(backoff * 2, config_.reconnect_max);
  }
}

absl::Status CoordinatorSession::Register() {
  v1::RegisterRequest request;
  request.set_name(config_.name);
  request.set_node_label(config_.node_label);
  request.set_device(config_.devices.front());
  for (const std::string& device : config_.devices) request.add_devices(device);
  request.set_host(config_.advertise_host);
  request.set_capacity(static_cast<int32_t>(config_.devices.size()));
  request.set_agent_version(metrics::BuildVersion());  // Checked by the coordinator.
  request.set_fabric(config_.fabric);
  size_t reported = 0;
  {
    absl::MutexLock lock(&mu_);
    // Ranks that ended while disconnected are still claimed until their exit reports are
    // acked, or the coordinator would count them as vanished.
    const std::vector<v1::RunningWork> claimed = slots_->ClaimedRanks();
    for (const v1::RunningWork& r : claimed) *request.add_running_ranks() = r;
    if (!claimed.empty()) *request.mutable_running() = claimed.front();
    reported = claimed.size();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + config_.rpc_deadline);
  v1::RegisterResponse response;
  const grpc::Status status = stub_->Register(&ctx, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("Register: ", status.error_message()));
  }
  absl::MutexLock lock(&mu_);
  OnRegisteredLocked(response, reported);
  return absl::OkStatus();
}

void CoordinatorSession::OnRegisteredLocked(const v1::RegisterResponse& response, size_t reported) {
  worker_id_ = response.worker_id();
  coordinator_timeout_ = milliseconds(
      std::clamp<int64_t>(response.heartbeat_timeout_ms(), 0, kMaxHeartbeatInterval.count() * 2));
  SetHeartbeatIntervalLocked(response.heartbeat_interval_ms());
  ULOG(INFO) << "registered as " << worker_id_ << " (heartbeat every "
             << heartbeat_interval_.count() << " ms)"
             << (reported == 0 ? ""
                               : absl::StrCat("; reported ", reported, " running rank(s)",
                                              response.keep_running() ? ": keep" : ": abort"));
  if (reported == 0 || response.keep_running()) return;
  // (When some are kept, the coordinator sends an Abort for each one it does not want.)
  for (Slot* slot : slots_->Running()) {
    NoteLocked(*slot->ref, "coordinator no longer wants this attempt after reconnect: aborting");
    slot->child->Stop(contract::StopRequest::kAbort, kReconnectAbortGrace);
  }
}

absl::Status CoordinatorSession::RunSession() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + config_.session_max);
  std::unique_ptr<Stream> stream = stub_->Session(&ctx);
  v1::WorkerMessage hello;
  {
    absl::MutexLock lock(&mu_);
    seq_ = 1;
    hello.set_seq(seq_);
    hello.mutable_hello()->set_worker_id(worker_id_);
    session_ctx_ = &ctx;
    session_broken_ = false;
    last_received_ = Clock::now();
    if (stopping_) ctx.TryCancel();
  }
  std::thread writer;
  if (stream->Write(hello)) {
    writer = std::thread([&] { WriterLoop(stream.get(), &ctx); });
    v1::CoordinatorMessage msg;
    while (stream->Read(&msg)) {
      {
        absl::MutexLock lock(&mu_);
        last_received_ = Clock::now();
      }
      if (msg.kind_case() == v1::CoordinatorMessage::kAck) {
        HandleAck(msg.ack());
      } else {
        dispatch_(msg);
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    session_broken_ = true;
  }
  if (writer.joinable()) writer.join();
  ctx.TryCancel();  // Finish() must not wait for a server that stopped answering.
  const grpc::Status status = stream->Finish();
  absl::MutexLock lock(&mu_);
  session_ctx_ = nullptr;
  // Unacknowledged reports go out again on the next session, in their original order.
  for (auto it = inflight_.rbegin(); it != inflight_.rend(); ++it) outbox_.push_front(it->second);
  inflight_.clear();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("Session: ", status.error_message()));
}

void CoordinatorSession::WriterLoop(Stream* stream, grpc::ClientContext* ctx) {
  auto next_heartbeat = Clock::now();
  while (true) {
    std::vector<v1::WorkerMessage> batch;
    {
      absl::MutexLock lock(&mu_);
      if (!NextBatchLocked(ctx, &next_heartbeat, &batch)) return;
    }
    for (const auto& msg : batch) {
      if (!stream->Write(msg)) {
        ctx->TryCancel();  // Wakes the reader; the session is re-established.
        absl::MutexLock lock(&mu_);
        session_broken_ = true;
        return;
      }
    }
  }
}

bool CoordinatorSession::NextBatchLocked(grpc::ClientContext* ctx,
                                         Clock::time_point* next_heartbeat,
                                         std::vector<v1::WorkerMessage>* batch) {
  const auto wake = std::min(*next_heartbeat, Clock::now() + kLogFlushInterval);
  mu_.AwaitWithTimeout(absl::Condition(this, &CoordinatorSession::WriterHasWorkLocked),
                       absl::FromChrono(wake - Clock::now()));
  if (session_broken_) return false;
  if (Clock::now() - last_received_ > liveness_timeout_) {
    ULOG(WARNING) << "no message from the coordinator for " << liveness_timeout_.count()
                  << " ms: reconnecting";
    ctx->TryCancel();
    session_broken_ = true;
    return false;
  }
  FlushLogsLocked();
  if (Clock::now() >= *next_heartbeat) {
    outbox_.push_back(HeartbeatLocked());
    *next_heartbeat = Clock::now() + heartbeat_interval_;
  }
  while (!outbox_.empty()) {
    v1::WorkerMessage msg = std::move(outbox_.front());
    outbox_.pop_front();
    msg.set_seq(++seq_);
    if (NeedsAck(msg)) inflight_[msg.seq()] = msg;
    batch->push_back(std::move(msg));
  }
  return true;
}

v1::WorkerMessage CoordinatorSession::HeartbeatLocked() const {
  v1::WorkerMessage hb;
  SetNow(hb.mutable_heartbeat()->mutable_sent_at());
  hb.mutable_heartbeat()->set_request_ack(true);
  for (v1::RunningWork& r : slots_->RunningRanks()) {
    *hb.mutable_heartbeat()->add_running_ranks() = std::move(r);
  }
  if (hb.heartbeat().running_ranks_size() > 0) {
    *hb.mutable_heartbeat()->mutable_running() = hb.heartbeat().running_ranks(0);
  }
  return hb;
}

void CoordinatorSession::HandleAck(const v1::Ack& ack) {
  absl::MutexLock lock(&mu_);
  if (ack.result() != v1::ACK_CODE_OK) {
    ULOG(WARNING) << "coordinator rejected report " << ack.seq() << ": "
                  << v1::AckCode_Name(ack.result()) << " " << ack.message();
  }
  // Non-zero when the coordinator's rate cap moved with the cluster (max_heartbeats_per_s).
  if (ack.heartbeat_interval_ms() != 0) SetHeartbeatIntervalLocked(ack.heartbeat_interval_ms());
  auto it = inflight_.find(ack.seq());
  if (it == inflight_.end()) return;
  if (it->second.has_exited()) slots_->ExitAcked(it->second.exited().ref());
  inflight_.erase(it);
}

void CoordinatorSession::SetHeartbeatIntervalLocked(int64_t ms) {
  if (ms == 0) {
    // Not given (a coordinator from before the field): keep the interval.
  } else if (ms < kMinHeartbeatInterval.count() || ms > kMaxHeartbeatInterval.count()) {
    ULOG(WARNING) << "coordinator asked for a heartbeat every " << ms << " ms; ignored (outside "
                  << kMinHeartbeatInterval.count() << " .. " << kMaxHeartbeatInterval.count()
                  << " ms), keeping " << heartbeat_interval_.count() << " ms";
  } else if (milliseconds(ms) != heartbeat_interval_) {
    heartbeat_interval_ = milliseconds(ms);
    ULOG(INFO) << "heartbeat every " << ms << " ms (asked by the coordinator)";
  }
  liveness_timeout_ = std::max({coordinator_timeout_, heartbeat_interval_ * 5, milliseconds(3000)});
}

bool CoordinatorSession::DrainLocked(absl::Duration timeout) {
  FlushLogsLocked();
  return mu_.AwaitWithTimeout(absl::Condition(this, &CoordinatorSession::DrainedLocked), timeout);
}

void CoordinatorSession::EnqueueLocked(v1::WorkerMessage msg) {
  FlushLogsLocked();  // Keep log lines ahead of the event that followed them.
  outbox_.push_back(std::move(msg));
  if (outbox_.size() > kMaxOutbox) {  // Disconnected for long: drop the oldest droppable.
    for (auto it = outbox_.begin(); it != outbox_.end(); ++it) {
      if (!NeedsAck(*it)) {
        outbox_.erase(it);
        break;
      }
    }
  }
}

void CoordinatorSession::AddLogLocked(const v1::WorkRef& ref, v1::LogStream stream,
                                      std::string text) {
  PendingLog log;
  log.ref = ref;
  SetNow(log.line.mutable_time());
  log.line.set_rank(ref.rank());
  log.line.set_generation(ref.generation());
  log.line.set_stream(stream);
  log.line.set_text(std::move(text));
  logs_.push_back(std::move(log));
  if (logs_.size() > kMaxPendingLogs) logs_.pop_front();
}

void CoordinatorSession::NoteLocked(const v1::WorkRef& ref, const std::string& text) {
  AddLogLocked(ref, v1::LOG_STREAM_AGENT, text);
}

void CoordinatorSession::FlushLogsLocked() {
  while (!logs_.empty()) {
    v1::WorkerMessage msg;
    auto* batch = msg.mutable_logs();
    *batch->mutable_ref() = logs_.front().ref;
    while (!logs_.empty() && SameWork(logs_.front().ref, batch->ref()) &&
           logs_.front().ref.rank() == batch->ref().rank() &&
           static_cast<size_t>(batch->lines_size()) < kMaxLinesPerBatch) {
      *batch->add_lines() = std::move(logs_.front().line);
      logs_.pop_front();
    }
    outbox_.push_back(std::move(msg));
  }
}

}  // namespace ulysses::agent
