#include "worker/agent/worker_agent.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/metrics/build_info.h"
#include "common/metrics/metrics_server.h"
#include "common/net/host_port.h"
#include "common/process/cpu_share.h"
#include "common/spec/path_confine.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "ulysses/v1/worker_service.grpc.pb.h"
#include "worker/agent/agent_messages.h"
#include "worker/agent/assignment_check.h"
#include "worker/agent/child_supervisor.h"
#include "worker/agent/devices.h"
#include "worker/agent/fabric.h"
#include "worker/agent/worker_metrics.h"

namespace ulysses::agent {
namespace {

namespace v1 = ::ulysses::v1;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxOutbox = 20000;
constexpr size_t kMaxPendingLogs = 5000;
constexpr size_t kMaxLinesPerBatch = 500;
constexpr milliseconds kLogFlushInterval{200};
constexpr milliseconds kReconnectAbortGrace{2000};
// The heartbeat intervals a coordinator may ask for (RegisterResponse, Ack); others are
// ignored with a warning.
constexpr milliseconds kMinHeartbeatInterval{100};
constexpr milliseconds kMaxHeartbeatInterval{3600 * 1000};

}  // namespace

class WorkerAgent::Impl {
 public:
  explicit Impl(WorkerConfig config) : config_(std::move(config)) {}

  absl::Status Run();
  void RequestShutdown() {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }

 private:
  using Stream = grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>;

  void SessionLoop();
  absl::Status Register();
  absl::Status RunSession();
  void WriterLoop(Stream* stream, grpc::ClientContext* ctx);
  void Handle(const v1::CoordinatorMessage& msg);
  // Heartbeats every `ms` from now on (a coordinator's value, checked), and the session's
  // liveness timeout with it: heartbeats ask for an ack, so a silent coordinator means a dead
  // session.
  void SetHeartbeatIntervalLocked(int64_t ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleAssignment(const v1::Assignment& assignment);
  // HandleAssignment's phases. Admit: false when refused (reported) or a duplicate; else the
  // slot's previous child in `replaced` (stopped if it still ran), `launch` filled but for its
  // files, and assigning_ counted up. Prepare: checks the paths and the interval, writes the
  // spec; the interval's control line if the assignment has one. Bad input is
  // InvalidArgument (exit 2 in the report), a write failure Internal (exit 1).
  bool AdmitAssignmentLocked(const v1::Assignment& a, std::unique_ptr<ChildSupervisor>* replaced,
                             RankLaunch* launch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<std::string>> PrepareRankFiles(const v1::Assignment& a,
                                                              RankLaunch* launch) const;

  void EnqueueLocked(v1::WorkerMessage msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLogsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddLogLocked(const v1::WorkRef& ref, v1::LogStream stream, std::string text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteLocked(const v1::WorkRef& ref, const std::string& text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `slot`: the slot the rank ran on (claimed until the report is acked).
  void ReportExitLocked(const v1::WorkRef& ref, int slot, int exit_code, int signal, bool preempted,
                        bool aborted, const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Await conditions (absl::Mutex re-evaluates them whenever mu_ is released).
  // Shutdown drain: every report written and acked, no log line left.
  bool DrainedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !session_broken_ && outbox_.empty() && inflight_.empty() && logs_.empty();
  }
  // The session writer has something to do before its next heartbeat.
  bool WriterHasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return session_broken_ || !outbox_.empty();
  }

  // Child callbacks (supervisor thread).
  void OnEvent(const v1::WorkRef& ref, const contract::RankEvent& event);
  void OnBadEvent(const v1::WorkRef& ref, const std::string& line, const absl::Status& error);
  void OnExit(const v1::WorkRef& ref, int slot, const ChildResult& result);

  absl::Status StartMetrics();

  WorkerConfig config_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  metrics::Registry registry_;
  std::unique_ptr<WorkerMetrics> metrics_;  // Null without --metrics-listen.
  std::unique_ptr<metrics::MetricsServer> metrics_server_;

  absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;  // Graceful shutdown requested.
  // Assignments admitted but not yet published (HandleAssignment forks outside mu_).
  int assigning_ ABSL_GUARDED_BY(mu_) = 0;
  // Run()'s shutdown starts once no assignment is between admit and publish.
  bool ShutdownSettledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ && assigning_ == 0;
  }
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Session loop must end.
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  milliseconds heartbeat_interval_ ABSL_GUARDED_BY(mu_){1000};
  milliseconds coordinator_timeout_ ABSL_GUARDED_BY(mu_){0};  // RegisterResponse's.
  // No message from the coordinator this long: reconnect.
  milliseconds liveness_timeout_ ABSL_GUARDED_BY(mu_){15000};
  Clock::time_point last_received_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::WorkerMessage> outbox_ ABSL_GUARDED_BY(mu_);  // Not yet written (no seq).
  // Written, awaiting ack (this session).
  std::map<uint64_t, v1::WorkerMessage> inflight_ ABSL_GUARDED_BY(mu_);
  struct PendingLog {
    v1::WorkRef ref;
    v1::LogLine line;
  };
  std::deque<PendingLog> logs_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool session_broken_ ABSL_GUARDED_BY(mu_) = true;
  grpc::ClientContext* session_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  // One per device (config_.devices): the rank it runs. A finished child is kept until the
  // slot's next assignment or shutdown (destroying it joins its supervisor thread).
  struct Slot {
    std::string device;
    std::optional<v1::WorkRef> ref;  // Its rank while the child runs.
    int64_t pid = 0;
    std::unique_ptr<ChildSupervisor> child;
  };
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  // Exit reports not yet acked, with their slot: still claimed on re-registration, or the
  // coordinator would count those ranks as vanished.
  std::vector<std::pair<v1::WorkRef, int>> unacked_exits_ ABSL_GUARDED_BY(mu_);

  bool AnyRunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::any_of(slots_.begin(), slots_.end(),
                       [](const Slot& s) { return s.ref.has_value(); });
  }
  // Every rank it runs or whose exit is unacked, for Register and heartbeats.
  std::vector<v1::RunningWork> RunningRanksLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

std::vector<v1::RunningWork> WorkerAgent::Impl::RunningRanksLocked() const {
  std::vector<v1::RunningWork> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].ref) continue;
    v1::RunningWork r;
    *r.mutable_ref() = *slots_[i].ref;
    r.set_pid(slots_[i].pid);
    r.set_slot(static_cast<int>(i));
    out.push_back(std::move(r));
  }
  for (const auto& [ref, exit_slot] : unacked_exits_) {
    const int slot = exit_slot;  // A lambda cannot capture a structured binding in C++17.
    const bool running = std::any_of(out.begin(), out.end(),
                                     [&](const v1::RunningWork& r) { return r.slot() == slot; });
    if (running) continue;  // The slot runs a newer rank already.
    v1::RunningWork r;
    *r.mutable_ref() = ref;
    r.set_slot(slot);
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status WorkerAgent::Impl::StartMetrics() {
  if (config_.metrics_listen.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(metrics_, WorkerMetrics::Register(&registry_, config_.peak_flops));
  metrics_->SetFabric(FabricName(config_.fabric));
  RETURN_IF_ERROR(metrics_->ServeAgentState([this] {
    absl::MutexLock lock(&mu_);
    AgentState s;
    for (const Slot& slot : slots_) ++(slot.ref ? s.busy_slots : s.free_slots);
    // Before Run() fills slots_ (the scrape raced the start): every device is free.
    if (slots_.empty()) s.free_slots = static_cast<int64_t>(config_.devices.size());
    s.connected = !session_broken_;
    return s;
  }));
  ASSIGN_OR_RETURN(net::HostPort at,
                   net::ParseHostPort("--metrics-listen", config_.metrics_listen, "0.0.0.0:9091"));
  metrics::MetricsServerConfig mc;
  mc.host = at.host;
  mc.port = at.port;
  metrics_server_ = std::make_unique<metrics::MetricsServer>(&registry_, mc);
  RETURN_IF_ERROR(metrics_server_->Start());
  ULOG(INFO) << "metrics on http://" << metrics_server_->address() << "/metrics";
  return absl::OkStatus();
}

absl::Status WorkerAgent::Impl::Run() {
  RETURN_IF_ERROR(StartMetrics());
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(config_.Channel(), args);
  if (!channel.ok()) return channel.status();
  stub_ = v1::WorkerService::NewStub(*channel);
  ULOG(INFO) << "ulysses-worker " << config_.name << " (" << config_.devices.size()
             << " slot(s): " << absl::StrJoin(config_.devices, ",") << ", engine "
             << config_.engine_bin << ") -> coordinator " << config_.coordinator << " ("
             << (config_.ca_file.empty()     ? "plaintext"
                 : config_.cert_file.empty() ? "TLS"
                                             : "mutual TLS")
             << (config_.token.empty() ? ", no token" : ", token") << ")";
  ULOG(INFO) << "peak FLOP/s for MFU: "
             << (config_.peak_flops > 0 ? absl::StrCat(config_.peak_flops) : std::string("none"))
             << " (" << config_.peak_flops_why << ")";
  ULOG(INFO) << "fabric between nodes: " << FabricName(config_.fabric) << " (" << config_.fabric_why
             << ")";
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& device : config_.devices) slots_.push_back(Slot{device});
  }
  std::thread session_thread([this] { SessionLoop(); });

  mu_.Lock();
  mu_.Await(absl::Condition(this, &Impl::ShutdownSettledLocked));
  std::vector<ChildSupervisor*> stopping;
  for (Slot& slot : slots_) {
    if (!slot.ref || slot.child == nullptr) continue;
    ULOG(INFO) << "shutting down: preempting " << RefString(*slot.ref) << " (grace "
               << config_.grace_period.count() / 1000.0 << " s)";
    NoteLocked(*slot.ref, absl::StrCat("worker ", config_.name,
                                       " is shutting down: SIGTERM to the rank, grace ",
                                       config_.grace_period.count() / 1000.0, " s"));
    v1::WorkerMessage notice;
    *notice.mutable_preempting()->mutable_ref() = *slot.ref;
    EnqueueLocked(std::move(notice));
    slot.child->Stop(contract::StopRequest::kPreempt, config_.grace_period);
    stopping.push_back(slot.child.get());
  }
  if (!stopping.empty()) {
    mu_.Unlock();
    // Bounded: the SIGKILL tier fires after the grace. The children stay owned by their
    // slots (assignments that arrive now are refused: shutdown_ is set).
    for (ChildSupervisor* child : stopping) child->Wait();
    mu_.Lock();
  }
  // Deliver the exit report (and the last logs) before leaving.
  FlushLogsLocked();
  const bool drained = mu_.AwaitWithTimeout(absl::Condition(this, &Impl::DrainedLocked),
                                            absl::FromChrono(config_.report_drain));
  if (!drained) ULOG(WARNING) << "shutting down with unacknowledged reports";
  stopping_ = true;
  if (session_ctx_ != nullptr) session_ctx_->TryCancel();
  std::vector<Slot> slots;
  slots.swap(slots_);
  mu_.Unlock();
  session_thread.join();
  slots.clear();  // Joins the supervisor threads (their callbacks lock mu_).
  if (metrics_server_) metrics_server_->Stop();
  ULOG(INFO) << "ulysses-worker " << config_.name << " stopped";
  return absl::OkStatus();
}

void WorkerAgent::Impl::SessionLoop() {
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
                  << (AnyRunningLocked() ? " (the ranks keep running)" : "");
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(wait));
    backoff = std::min(backoff * 2, config_.reconnect_max);
  }
}

absl::Status WorkerAgent::Impl::Register() {
  v1::RegisterRequest request;
  request.set_name(config_.name);
  request.set_node_label(config_.node_label);
  request.set_device(config_.devices.front());
  for (const std::string& device : config_.devices) request.add_devices(device);
  request.set_host(config_.advertise_host);
  request.set_capacity(static_cast<int32_t>(config_.devices.size()));
  request.set_agent_version(metrics::BuildVersion());  // Checked by the coordinator.
  request.set_fabric(config_.fabric);
  std::vector<v1::RunningWork> reported;
  {
    absl::MutexLock lock(&mu_);
    // Ranks that ended while disconnected are still claimed until their exit reports are
    // acked, or the coordinator would count them as vanished.
    reported = RunningRanksLocked();
    for (const v1::RunningWork& r : reported) *request.add_running_ranks() = r;
    if (!reported.empty()) *request.mutable_running() = reported.front();
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
  worker_id_ = response.worker_id();
  coordinator_timeout_ = milliseconds(
      std::clamp<int64_t>(response.heartbeat_timeout_ms(), 0, kMaxHeartbeatInterval.count() * 2));
  SetHeartbeatIntervalLocked(response.heartbeat_interval_ms());
  ULOG(INFO) << "registered as " << worker_id_ << " (heartbeat every "
             << heartbeat_interval_.count() << " ms)"
             << (reported.empty() ? ""
                                  : absl::StrCat("; reported ", reported.size(), " running rank(s)",
                                                 response.keep_running() ? ": keep" : ": abort"));
  if (!reported.empty() && !response.keep_running()) {
    // (When some are kept, the coordinator sends an Abort for each one it does not want.)
    for (Slot& slot : slots_) {
      if (!slot.ref || slot.child == nullptr) continue;
      NoteLocked(*slot.ref, "coordinator no longer wants this attempt after reconnect: aborting");
      slot.child->Stop(contract::StopRequest::kAbort, kReconnectAbortGrace);
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerAgent::Impl::RunSession() {
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
      Handle(msg);
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

void WorkerAgent::Impl::WriterLoop(Stream* stream, grpc::ClientContext* ctx) {
  auto next_heartbeat = Clock::now();
  while (true) {
    std::vector<v1::WorkerMessage> batch;
    {
      absl::MutexLock lock(&mu_);
      const auto wake = std::min(next_heartbeat, Clock::now() + kLogFlushInterval);
      mu_.AwaitWithTimeout(absl::Condition(this, &Impl::WriterHasWorkLocked),
                           absl::FromChrono(wake - Clock::now()));
      if (session_broken_) return;
      if (Clock::now() - last_received_ > liveness_timeout_) {
        ULOG(WARNING) << "no message from the coordinator for " << liveness_timeout_.count()
                      << " ms: reconnecting";
        ctx->TryCancel();
        session_broken_ = true;
        return;
      }
      FlushLogsLocked();
      if (Clock::now() >= next_heartbeat) {
        v1::WorkerMessage hb;
        SetNow(hb.mutable_heartbeat()->mutable_sent_at());
        hb.mutable_heartbeat()->set_request_ack(true);
        for (Slot& slot : slots_) {
          if (!slot.ref) continue;
          v1::RunningWork* r = hb.mutable_heartbeat()->add_running_ranks();
          *r->mutable_ref() = *slot.ref;
          r->set_pid(slot.pid);
          r->set_slot(static_cast<int32_t>(&slot - slots_.data()));
        }
        if (hb.heartbeat().running_ranks_size() > 0) {
          *hb.mutable_heartbeat()->mutable_running() = hb.heartbeat().running_ranks(0);
        }
        outbox_.push_back(std::move(hb));
        next_heartbeat = Clock::now() + heartbeat_interval_;
      }
      while (!outbox_.empty()) {
        v1::WorkerMessage msg = std::move(outbox_.front());
        outbox_.pop_front();
        msg.set_seq(++seq_);
        if (NeedsAck(msg)) inflight_[msg.seq()] = msg;
        batch.push_back(std::move(msg));
      }
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

void WorkerAgent::Impl::SetHeartbeatIntervalLocked(int64_t ms) {
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

void WorkerAgent::Impl::Handle(const v1::CoordinatorMessage& msg) {
  switch (msg.kind_case()) {
    case v1::CoordinatorMessage::kAssignment:
      HandleAssignment(msg.assignment());
      return;
    case v1::CoordinatorMessage::kAbort: {
      const v1::Abort& abort = msg.abort();
      absl::MutexLock lock(&mu_);
      // preempt: the coordinator makes room for a higher-priority job. SIGTERM, the rank
      // checkpoints and exits 75 (reported as preempted); this worker keeps taking work.
      const bool preempt = abort.preempt();
      int stopped = 0;
      for (Slot& slot : slots_) {  // Every rank of that generation on this worker.
        if (!slot.ref || !SameWork(*slot.ref, abort.ref()) || slot.child == nullptr) continue;
        ULOG(INFO) << (preempt ? "preempt " : "abort ") << RefString(*slot.ref) << ": "
                   << abort.reason();
        NoteLocked(*slot.ref, absl::StrCat(preempt ? "preemption" : "abort",
                                           " from coordinator: ", abort.reason(), " (grace ",
                                           abort.grace_period_ms(), " ms)"));
        slot.child->Stop(preempt ? contract::StopRequest::kPreempt : contract::StopRequest::kAbort,
                         milliseconds(std::max<int64_t>(0, abort.grace_period_ms())));
        ++stopped;
      }
      if (stopped == 0) {
        ULOG(INFO) << "ignoring abort for " << abort.ref().job_id() << " gen "
                   << abort.ref().generation() << ": not running it";
      }
      return;
    }
    case v1::CoordinatorMessage::kAck: {
      absl::MutexLock lock(&mu_);
      if (msg.ack().result() != v1::ACK_CODE_OK) {
        ULOG(WARNING) << "coordinator rejected report " << msg.ack().seq() << ": "
                      << v1::AckCode_Name(msg.ack().result()) << " " << msg.ack().message();
      }
      // Non-zero when the coordinator's rate cap moved with the cluster (max_heartbeats_per_s).
      if (msg.ack().heartbeat_interval_ms() != 0) {
        SetHeartbeatIntervalLocked(msg.ack().heartbeat_interval_ms());
      }
      auto it = inflight_.find(msg.ack().seq());
      if (it != inflight_.end()) {
        if (it->second.has_exited()) {
          const v1::WorkRef& acked = it->second.exited().ref();
          unacked_exits_.erase(std::remove_if(unacked_exits_.begin(), unacked_exits_.end(),
                                              [&](const auto& e) {
                                                return SameWork(e.first, acked) &&
                                                       e.first.rank() == acked.rank();
                                              }),
                               unacked_exits_.end());
        }
        inflight_.erase(it);
      }
      return;
    }
    case v1::CoordinatorMessage::kCheckpointInterval: {
      // every_steps: auto: a new interval for the ranks of a running generation, written to
      // each one's --control stdin; they apply it at a step boundary once all hold it.
      const v1::CheckpointIntervalUpdate& u = msg.checkpoint_interval();
      absl::StatusOr<std::string> line = IntervalControlLine(u.interval());
      absl::MutexLock lock(&mu_);
      int sent = 0;
      for (Slot& slot : slots_) {
        if (!slot.ref || !SameWork(*slot.ref, u.ref()) || slot.child == nullptr) continue;
        ++sent;
        if (!line.ok()) {
          NoteLocked(*slot.ref, absl::StrCat("refused a checkpoint interval from the coordinator: ",
                                             line.status().message()));
        } else if (!slot.child->SendLine(*line)) {
          NoteLocked(*slot.ref, "could not pass the new checkpoint interval to the rank");
        }
      }
      if (sent == 0) {
        ULOG(INFO) << "ignoring a checkpoint interval for " << u.ref().job_id() << " gen "
                   << u.ref().generation() << ": not running it";
      }
      return;
    }
    case v1::CoordinatorMessage::kStop:
      ULOG(INFO) << "coordinator asked this worker to stop: " << msg.stop().reason();
      RequestShutdown();
      return;
    default:
      ULOG(WARNING) << "ignoring an unknown coordinator message";
  }
}

// Three phases, so that no directory is written and no process forked while mu_ is held:
// admit (under mu_: refuse or claim the slot, take out its previous child), launch (outside
// mu_: join the previous child, check paths, write the spec, fork), publish (under mu_: the
// child becomes the slot's). Run()'s shutdown waits for every admitted assignment to be
// published (assigning_), so a shutdown racing an assignment still gracefully stops the
// rank it started; the child's callbacks wait for the publish, so its events never precede
// its `started` report and its exit always finds its slot.
void WorkerAgent::Impl::HandleAssignment(const v1::Assignment& a) {
  const v1::WorkRef& ref = a.ref();
  const int slot_index = a.slot();
  std::unique_ptr<ChildSupervisor> replaced;
  RankLaunch launch;
  {
    absl::MutexLock lock(&mu_);
    if (!AdmitAssignmentLocked(a, &replaced, &launch)) return;
  }
  replaced.reset();  // Joins its supervisor thread (its exit report is queued); takes mu_.
  absl::StatusOr<std::optional<std::string>> interval_line = PrepareRankFiles(a, &launch);
  {
    absl::MutexLock lock(&mu_);
    if (!interval_line.ok() || shutdown_) {
      --assigning_;
      const bool refused = !interval_line.ok();
      // A refused assignment: bad input (paths, interval) or the spec not written.
      ReportExitLocked(
          ref, slot_index,
          refused ? contract::ExitCodeFor(interval_line.status()) : contract::kExitPreempted, 0,
          /*preempted=*/!refused, /*aborted=*/false,
          refused ? std::string(interval_line.status().message()) : "worker is shutting down");
      return;
    }
  }
  // Rank 0 hosts the group's rendezvous store on master_port: a port another process holds on
  // this host (e.g. a job of another coordinator with an overlapping range) fails the attempt
  // here, before any rank starts, with the port and the fix as the job's reason; the retry
  // gets another port.
  if (launch.rank == 0 && launch.world_size > 1 && launch.master_port > 0 &&
      !net::TcpPortFree(launch.master_port)) {
    absl::MutexLock lock(&mu_);
    --assigning_;
    ReportExitLocked(
        ref, slot_index, contract::RankExitCodeFor(absl::UnavailableError("")), 0, false, false,
        absl::StrCat("rank 0 cannot host the rendezvous: port ", launch.master_port, " on ",
                     config_.name,
                     " is in use by another process (e.g. a job of another "
                     "coordinator whose rendezvous port range overlaps: give each coordinator on "
                     "a host its own rendezvous_port_min..rendezvous_port_max); the attempt is "
                     "retried on another port"));
    return;
  }
  launch.control_stdin = interval_line->has_value();  // interval updates (kCheckpointInterval)
  auto published = std::make_shared<bool>(false);     // Guarded by mu_.
  // Blocks a callback of the child until the child is its slot's (bounded: publish follows).
  auto await_published = [this, published] {
    mu_.LockWhen(absl::Condition(published.get()));
    mu_.Unlock();
  };
  ChildCallbacks callbacks;
  callbacks.on_event = [this, ref, await_published](const contract::RankEvent& event) {
    await_published();
    OnEvent(ref, event);
  };
  callbacks.on_bad_event = [this, ref, await_published](const std::string& line,
                                                        const absl::Status& error) {
    await_published();
    OnBadEvent(ref, line, error);
  };
  callbacks.on_log = [this, ref, published](const std::string& stream, const std::string& line) {
    ULOG(DEBUG) << "[" << ref.job_id() << " r" << ref.rank() << " " << stream << "] " << line;
    mu_.LockWhen(absl::Condition(published.get()));
    AddLogLocked(ref, stream == "stderr" ? v1::LOG_STREAM_STDERR : v1::LOG_STREAM_STDOUT, line);
    mu_.Unlock();
  };
  callbacks.on_exit = [this, ref, slot_index, await_published](const ChildResult& result) {
    await_published();
    OnExit(ref, slot_index, result);
  };
  auto child = ChildSupervisor::Start(BuildRankArgv(launch), "", std::move(callbacks),
                                      RankEnvironment(launch));

  absl::MutexLock lock(&mu_);
  --assigning_;
  if (!child.ok()) {
    ReportExitLocked(ref, slot_index, contract::kExitFailure, 0, false, false,
                     absl::StrCat("worker ", config_.name,
                                  " cannot start ulysses-train: ", child.status().message()));
    return;
  }
  // Published even when shutdown_ was set meanwhile: Run() waits for assigning_ to reach 0
  // and then stops this child with the grace like every other.
  *published = true;
  Slot& slot = slots_[slot_index];
  slot.child = std::move(*child);
  slot.ref = ref;
  slot.pid = slot.child->pid();
  // The pipe holds the line until the rank's control reader takes it.
  if (interval_line->has_value() && !slot.child->SendLine(**interval_line)) {
    NoteLocked(ref, "could not pass the checkpoint interval to the rank (its stdin is closed)");
  }
  ULOG(INFO) << "started " << RefString(ref) << " on slot " << slot_index << " (" << slot.device
             << "; world " << launch.world_size << ", seq_len " << a.seq_len() << ", master "
             << launch.master_addr << ":" << launch.master_port << ") as pid " << slot.pid;
  v1::WorkerMessage started;
  *started.mutable_started()->mutable_ref() = ref;
  started.mutable_started()->set_pid(slot.pid);
  EnqueueLocked(std::move(started));
  NoteLocked(ref, absl::StrCat("worker ", config_.name, " started rank ", ref.rank(), "/",
                               launch.world_size, " of stage ", ref.stage(), " on ", slot.device,
                               " (slot ", slot_index, ", pid ", slot.pid, ")"));
}

bool WorkerAgent::Impl::AdmitAssignmentLocked(const v1::Assignment& a,
                                              std::unique_ptr<ChildSupervisor>* replaced,
                                              RankLaunch* launch) {
  const v1::WorkRef& ref = a.ref();
  if (shutdown_) {
    ReportExitLocked(ref, a.slot(), contract::kExitPreempted, 0, /*preempted=*/true,
                     /*aborted=*/false, "worker is shutting down");
    return false;
  }
  for (const Slot& slot : slots_) {
    if (slot.ref && SameWork(*slot.ref, ref) && slot.ref->rank() == ref.rank()) {
      ULOG(INFO) << "duplicate assignment for " << RefString(ref) << ": already running";
      return false;
    }
  }
  const int slot_index = a.slot();
  if (slot_index < 0 || slot_index >= static_cast<int>(slots_.size())) {
    ReportExitLocked(
        ref, slot_index, contract::kExitFailure, 0, false, false,
        absl::StrCat("worker ", config_.name, " was assigned slot ", slot_index, " but has ",
                     slots_.size(), " (devices ", absl::StrJoin(config_.devices, ","), ")"));
    return false;
  }
  Slot& slot = slots_[slot_index];
  if (slot.child != nullptr) {
    // A finished child is destroyed by the caller; a stale one (the coordinator moved on) is
    // stopped here first.
    *replaced = std::move(slot.child);
    if (slot.ref) {
      ULOG(WARNING) << "new assignment " << RefString(ref) << " replaces running "
                    << RefString(*slot.ref) << " on slot " << slot_index;
      NoteLocked(*slot.ref, "replaced by a newer assignment: aborting");
      (*replaced)->Stop(contract::StopRequest::kAbort, kReconnectAbortGrace);
    }
  }
  launch->engine_bin = config_.engine_bin;
  launch->job_id = ref.job_id();
  launch->tenant = a.tenant();
  launch->generation = ref.generation();
  launch->rendezvous_secret = a.rendezvous_secret();
  launch->stage = ref.stage();
  launch->rank = ref.rank();
  launch->world_size = std::max(1, a.world_size());
  launch->master_addr = a.master_addr().empty() ? config_.advertise_host : a.master_addr();
  launch->master_port = a.master_port();
  launch->device = slot.device;
  launch->collective_timeout_s = config_.collective_timeout_s;
  launch->peak_flops = config_.peak_flops;
  // The rank leaves within the grace even mid-step (worker/engine/train/preemption.h).
  launch->stop_grace_s = config_.grace_period.count() / 1000.0;
  launch->intra_op_threads =
      config_.intra_op_threads > 0
          ? config_.intra_op_threads
          : process::IntraOpThreadShare(process::UsableCores(), static_cast<int>(slots_.size()));
  launch->overrides.assign(a.overrides().begin(), a.overrides().end());
  ++assigning_;
  return true;
}

absl::StatusOr<std::optional<std::string>> WorkerAgent::Impl::PrepareRankFiles(
    const v1::Assignment& a, RankLaunch* launch) const {
  const v1::WorkRef& ref = a.ref();
  if (absl::Status paths =
          CheckAssignmentPaths(a, WorkerRoots{config_.checkpoint_root, config_.data_roots});
      !paths.ok()) {
    ULOG(WARNING) << "refusing " << RefString(ref) << ": " << paths.message();
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", config_.name, " refused the assignment: ", paths.message()));
  }
  // every_steps: auto: the coordinator's interval, checked before the rank starts.
  std::optional<std::string> interval_line;
  if (a.has_checkpoint_interval()) {
    absl::StatusOr<std::string> line = IntervalControlLine(a.checkpoint_interval());
    if (!line.ok()) {
      ULOG(WARNING) << "refusing " << RefString(ref) << ": " << line.status().message();
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", config_.name,
                       " refused the assignment's checkpoint interval: ", line.status().message()));
    }
    interval_line = *std::move(line);
  }
  const fs::path job_dir = fs::path(config_.work_dir) / "jobs" / ref.job_id();
  const fs::path attempt_dir =
      job_dir / absl::StrCat("g", ref.generation(), "-s", ref.stage(), "-r", ref.rank());
  std::error_code ec;
  fs::create_directories(attempt_dir, ec);
  const fs::path spec_path = attempt_dir / "job.yaml";
  {
    std::ofstream out(spec_path, std::ios::trunc);
    out << a.spec_yaml();
    if (!out.good()) ec = std::make_error_code(std::errc::io_error);
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("worker ", config_.name, " cannot write ",
                                            spec_path.string(), ": ", ec.message()));
  }
  launch->spec_path = spec_path.string();
  launch->out_dir = a.out_dir().empty() ? (job_dir / "out").string() : a.out_dir();
  return interval_line;
}

void WorkerAgent::Impl::OnEvent(const v1::WorkRef& ref, const contract::RankEvent& event) {
  const auto* step = std::get_if<contract::StepEvent>(&event);
  if (step != nullptr && metrics_ != nullptr) metrics_->OnStep(Labels(ref), *step);
  absl::MutexLock lock(&mu_);
  if (const auto* done = std::get_if<contract::DoneEvent>(&event)) {
    NoteLocked(ref, absl::StrCat("rank ", ref.rank(), " finished stage ", done->stage));
    return;
  }
  if (ref.rank() != 0) return;  // Rank 0 speaks for the group.
  v1::WorkerMessage msg;
  if (step != nullptr) {
    *msg.mutable_progress()->mutable_ref() = ref;
    *msg.mutable_progress()->mutable_progress() = ToProto(*step);
  } else if (const auto* ckpt = std::get_if<contract::CheckpointEvent>(&event)) {
    *msg.mutable_checkpoint()->mutable_ref() = ref;
    *msg.mutable_checkpoint()->mutable_checkpoint() = ToProto(*ckpt);
    ULOG(INFO) << "checkpoint committed: " << ckpt->path << " (step " << ckpt->step << ")";
  } else if (const auto* eval = std::get_if<contract::EvalEvent>(&event)) {
    *msg.mutable_eval()->mutable_ref() = ref;
    *msg.mutable_eval()->mutable_result() = ToProto(*eval);
  }
  EnqueueLocked(std::move(msg));
}

void WorkerAgent::Impl::OnBadEvent(const v1::WorkRef& ref, const std::string& line,
                                   const absl::Status& error) {
  ULOG(WARNING) << RefString(ref) << ": ignoring a malformed event line: " << error.message()
                << ": " << line;
  absl::MutexLock lock(&mu_);
  NoteLocked(ref, absl::StrCat("rank ", ref.rank(),
                               " printed a malformed event line (not reported, "
                               "kept as a log line): ",
                               error.message()));
}

void WorkerAgent::Impl::OnExit(const v1::WorkRef& ref, int slot_index, const ChildResult& result) {
  if (metrics_ != nullptr) metrics_->Forget(Labels(ref));  // Bounded: one attempt's series.
  const contract::ProcessExit exit = process::ProcessExitOf(result.wait_status);
  const bool failed = result.outcome == contract::RankOutcome::kFailed ||
                      result.outcome == contract::RankOutcome::kBadInput;
  std::string error;
  if (failed) {
    error = LastLines(result.stderr_tail);
    if (error.empty()) error = absl::StrCat("ulysses-train ", result.description);
  }
  ULOG(INFO) << RefString(ref) << ": ulysses-train " << result.description << " -> "
             << contract::RankOutcomeName(result.outcome)
             << (result.sigkilled_by_agent ? " (SIGKILL after the grace period)" : "")
             << (error.empty() ? "" : ": ") << error;
  absl::MutexLock lock(&mu_);
  NoteLocked(ref,
             absl::StrCat("ulysses-train ", result.description, " (",
                          contract::RankOutcomeName(result.outcome), ")",
                          result.sigkilled_by_agent ? ", SIGKILL after the grace period" : ""));
  ReportExitLocked(ref, slot_index, exit.exit_code, exit.signal,
                   result.stop_cause == contract::StopRequest::kPreempt,
                   result.stop_cause == contract::StopRequest::kAbort, error);
  if (slot_index < 0 || slot_index >= static_cast<int>(slots_.size())) return;  // Shut down.
  Slot& slot = slots_[slot_index];
  if (slot.ref && SameWork(*slot.ref, ref) && slot.ref->rank() == ref.rank()) {
    slot.ref.reset();
    slot.pid = 0;
  }
}

void WorkerAgent::Impl::ReportExitLocked(const v1::WorkRef& ref, int slot, int exit_code,
                                         int signal, bool preempted, bool aborted,
                                         const std::string& error) {
  v1::WorkerMessage msg;
  auto* e = msg.mutable_exited();
  *e->mutable_ref() = ref;
  e->set_exit_code(exit_code);
  e->set_signal(signal);
  e->set_preempted(preempted);
  e->set_aborted(aborted);
  e->set_error_message(error);
  if (slot >= 0 && slot < static_cast<int>(slots_.size())) unacked_exits_.emplace_back(ref, slot);
  EnqueueLocked(std::move(msg));
}

void WorkerAgent::Impl::EnqueueLocked(v1::WorkerMessage msg) {
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

void WorkerAgent::Impl::AddLogLocked(const v1::WorkRef& ref, v1::LogStream stream,
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

void WorkerAgent::Impl::NoteLocked(const v1::WorkRef& ref, const std::string& text) {
  AddLogLocked(ref, v1::LOG_STREAM_AGENT, text);
}

void WorkerAgent::Impl::FlushLogsLocked() {
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

WorkerAgent::WorkerAgent(WorkerConfig config) : impl_(new Impl(std::move(config))) {}
WorkerAgent::~WorkerAgent() = default;
absl::Status WorkerAgent::Run() { return impl_->Run(); }
void WorkerAgent::RequestShutdown() { impl_->RequestShutdown(); }

}  // namespace ulysses::agent
