#include "worker/agent/worker_agent.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/net/host_port.h"
#include "common/process/cpu_share.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "ulysses/v1/worker_service.pb.h"
#include "worker/agent/agent_messages.h"
#include "worker/agent/assignment_check.h"
#include "worker/agent/child_supervisor.h"
#include "worker/agent/coordinator_session.h"
#include "worker/agent/devices.h"
#include "worker/agent/fabric.h"
#include "worker/agent/slot_table.h"
#include "worker/agent/worker_metrics.h"

namespace ulysses::agent {
namespace {

namespace v1 = ::ulysses::v1;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

}  // namespace

// The agent proper: dispatch of the coordinator's messages, the assignments' launch, the
// children's callbacks and the shutdown. The session (CoordinatorSession) and the slots
// (SlotTable) are its parts; mu() is the one lock of all three.
class WorkerAgent::Impl {
 public:
  explicit Impl(WorkerConfig config)
      : config_(std::move(config)),
        session_(config_, &slots_, [this](const v1::CoordinatorMessage& m) { Dispatch(m); }) {}

  absl::Status Run();
  void RequestShutdown() {
    absl::MutexLock lock(&mu());
    shutdown_ = true;
  }

 private:
  absl::Mutex& mu() ABSL_LOCK_RETURNED(session_.mu()) { return session_.mu(); }

  // Every coordinator message but acks (the session's), on the session thread.
  void Dispatch(const v1::CoordinatorMessage& msg);
  void HandleAbort(const v1::Abort& abort);
  void HandleCheckpointInterval(const v1::CheckpointIntervalUpdate& update);
  void HandleAssignment(const v1::Assignment& assignment);
  // HandleAssignment's phases. Admit: false when refused (reported) or a duplicate; else the
  // slot's previous child in `replaced` (stopped if it still ran), `launch` filled but for its
  // files, and assigning_ counted up. Prepare: checks the paths and the interval, writes the
  // spec; the interval's control line if the assignment has one. Bad input is
  // InvalidArgument (exit 2 in the report), a write failure Internal (exit 1). Refused
  // before the fork: reports the prepared assignment's refusal (bad input, shutdown, rank 0's
  // rendezvous port taken) and counts assigning_ down; false when it may start. Publish:
  // the child becomes the slot's, its `started` report queued.
  bool AdmitAssignmentLocked(const v1::Assignment& a, std::unique_ptr<ChildSupervisor>* replaced,
                             RankLaunch* launch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  RankLaunch LaunchFor(const v1::Assignment& a, const std::string& device, int slots) const;
  absl::StatusOr<std::optional<std::string>> PrepareRankFiles(const v1::Assignment& a,
                                                              RankLaunch* launch) const;
  bool RefusedBeforeFork(const v1::Assignment& a, const RankLaunch& launch,
                         const absl::StatusOr<std::optional<std::string>>& interval_line)
      ABSL_LOCKS_EXCLUDED(mu());
  // The child's callbacks; each waits for `*published` (guarded by mu()) first.
  ChildCallbacks CallbacksFor(const v1::WorkRef& ref, int slot, std::shared_ptr<bool> published);
  void PublishLocked(const v1::Assignment& a, const RankLaunch& launch,
                     std::unique_ptr<ChildSupervisor> child,
                     const std::optional<std::string>& interval_line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());

  // `slot`: the slot the rank ran on (claimed until the report is acked).
  void ReportExitLocked(const v1::WorkRef& ref, int slot, int exit_code, int signal, bool preempted,
                        bool aborted, const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());

  // Child callbacks (supervisor thread).
  void OnEvent(const v1::WorkRef& ref, const contract::RankEvent& event) ABSL_LOCKS_EXCLUDED(mu());
  void OnBadEvent(const v1::WorkRef& ref, const std::string& line, const absl::Status& error)
      ABSL_LOCKS_EXCLUDED(mu());
  void OnExit(const v1::WorkRef& ref, int slot, const ChildResult& result)
      ABSL_LOCKS_EXCLUDED(mu());

  absl::Status StartMetrics();
  void LogStartup() const;
  // Run()'s shutdown: preempts every running rank (its children, to be waited for).
  std::vector<ChildSupervisor*> PreemptAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Run()'s shutdown starts once no assignment is between admit and publish.
  bool ShutdownSettledLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) {
    return shutdown_ && assigning_ == 0;
  }

  WorkerConfig config_;
  metrics::Registry registry_;
  std::unique_ptr<WorkerMetrics> metrics_;  // Null without --metrics-listen.
  // Declared before the slots (its lock outlives them); given their address only.
  CoordinatorSession session_;
  SlotTable slots_ ABSL_GUARDED_BY(mu());
  bool shutdown_ ABSL_GUARDED_BY(mu()) = false;  // Graceful shutdown requested.
  // Assignments admitted but not yet published (HandleAssignment forks outside mu()).
  int assigning_ ABSL_GUARDED_BY(mu()) = 0;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;  // Scrapes take mu().
};

absl::Status WorkerAgent::Impl::StartMetrics() {
  if (config_.metrics_listen.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(metrics_, WorkerMetrics::Register(&registry_, config_.peak_flops));
  metrics_->SetFabric(FabricName(config_.fabric));
  RETURN_IF_ERROR(metrics_->ServeAgentState([this] {
    absl::MutexLock lock(&mu());
    AgentState s;
    s.busy_slots = slots_.Busy();
    s.free_slots = slots_.size() - s.busy_slots;
    // Before Run() fills slots_ (the scrape raced the start): every device is free.
    if (slots_.empty()) s.free_slots = static_cast<int64_t>(config_.devices.size());
    s.connected = session_.ConnectedLocked();
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

void WorkerAgent::Impl::LogStartup() const {
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
}

absl::Status WorkerAgent::Impl::Run() {
  RETURN_IF_ERROR(StartMetrics());
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(config_.Channel(), args);
  if (!channel.ok()) return channel.status();
  LogStartup();
  {
    absl::MutexLock lock(&mu());
    slots_.Open(config_.devices);
  }
  session_.Start(*std::move(channel));

  mu().Lock();
  mu().Await(absl::Condition(this, &Impl::ShutdownSettledLocked));
  std::vector<ChildSupervisor*> stopping = PreemptAllLocked();
  if (!stopping.empty()) {
    mu().Unlock();
    // Bounded: the SIGKILL tier fires after the grace. The children stay owned by their
    // slots (assignments that arrive now are refused: shutdown_ is set).
    for (ChildSupervisor* child : stopping) child->Wait();
    mu().Lock();
  }
  // Deliver the exit report (and the last logs) before leaving.
  if (!session_.DrainLocked(absl::FromChrono(config_.report_drain))) {
    ULOG(WARNING) << "shutting down with unacknowledged reports";
  }
  session_.StopLocked();
  std::vector<Slot> slots = slots_.TakeAll();
  mu().Unlock();
  session_.Join();
  slots.clear();  // Joins the supervisor threads (their callbacks lock mu()).
  if (metrics_server_) metrics_server_->Stop();
  ULOG(INFO) << "ulysses-worker " << config_.name << " stopped";
  return absl::OkStatus();
}

std::vector<ChildSupervisor*> WorkerAgent::Impl::PreemptAllLocked() {
  std::vector<ChildSupervisor*> stopping;
  for (Slot* slot : slots_.Running()) {
    ULOG(INFO) << "shutting down: preempting " << RefString(*slot->ref) << " (grace "
               << config_.grace_period.count() / 1000.0 << " s)";
    session_.NoteLocked(*slot->ref, absl::StrCat("worker ", config_.name,
                                                 " is shutting down: SIGTERM to the rank, grace ",
                                                 config_.grace_period.count() / 1000.0, " s"));
    v1::WorkerMessage notice;
    *notice.mutable_preempting()->mutable_ref() = *slot->ref;
    session_.EnqueueLocked(std::move(notice));
    slot->child->Stop(contract::StopRequest::kPreempt, config_.grace_period);
    stopping.push_back(slot->child.get());
  }
  return stopping;
}

void WorkerAgent::Impl::Dispatch(const v1::CoordinatorMessage& msg) {
  switch (msg.kind_case()) {
    case v1::CoordinatorMessage::kAssignment:
      HandleAssignment(msg.assignment());
      return;
    case v1::CoordinatorMessage::kAbort:
      HandleAbort(msg.abort());
      return;
    case v1::CoordinatorMessage::kCheckpointInterval:
      HandleCheckpointInterval(msg.checkpoint_interval());
      return;
    case v1::CoordinatorMessage::kStop:
      ULOG(INFO) << "coordinator asked this worker to stop: " << msg.stop().reason();
      RequestShutdown();
      return;
    default:
      ULOG(WARNING) << "ignoring an unknown coordinator message";
  }
}

void WorkerAgent::Impl::HandleAbort(const v1::Abort& abort) {
  absl::MutexLock lock(&mu());
  // preempt: the coordinator makes room for a higher-priority job. SIGTERM, the rank
  // checkpoints and exits 75 (reported as preempted); this worker keeps taking work.
  const bool preempt = abort.preempt();
  // Every rank of that generation on this worker.
  const std::vector<Slot*> running = slots_.Running(&abort.ref());
  for (Slot* slot : running) {
    ULOG(INFO) << (preempt ? "preempt " : "abort ") << RefString(*slot->ref) << ": "
               << abort.reason();
    session_.NoteLocked(*slot->ref, absl::StrCat(preempt ? "preemption" : "abort",
                                                 " from coordinator: ", abort.reason(), " (grace ",
                                                 abort.grace_period_ms(), " ms)"));
    slot->child->Stop(preempt ? contract::StopRequest::kPreempt : contract::StopRequest::kAbort,
                      milliseconds(std::max<int64_t>(0, abort.grace_period_ms())));
  }
  if (running.empty()) {
    ULOG(INFO) << "ignoring abort for " << abort.ref().job_id() << " gen "
               << abort.ref().generation() << ": not running it";
  }
}

void WorkerAgent::Impl::HandleCheckpointInterval(const v1::CheckpointIntervalUpdate& u) {
  // every_steps: auto: a new interval for the ranks of a running generation, written to
  // each one's --control stdin; they apply it at a step boundary once all hold it.
  absl::StatusOr<std::string> line = IntervalControlLine(u.interval());
  absl::MutexLock lock(&mu());
  const std::vector<Slot*> running = slots_.Running(&u.ref());
  for (Slot* slot : running) {
    if (!line.ok()) {
      session_.NoteLocked(*slot->ref,
                          absl::StrCat("refused a checkpoint interval from the coordinator: ",
                                       line.status().message()));
    } else if (!slot->child->SendLine(*line)) {
      session_.NoteLocked(*slot->ref, "could not pass the new checkpoint interval to the rank");
    }
  }
  if (running.empty()) {
    ULOG(INFO) << "ignoring a checkpoint interval for " << u.ref().job_id() << " gen "
               << u.ref().generation() << ": not running it";
  }
}

// Three phases, so that no directory is written and no process forked while mu() is held:
// admit (under mu(): refuse or claim the slot, take out its previous child), launch (outside
// mu(): join the previous child, check paths, write the spec, fork), publish (under mu(): the
// child becomes the slot's). Run()'s shutdown waits for every admitted assignment to be
// published (assigning_), so a shutdown racing an assignment still gracefully stops the
// rank it started; the child's callbacks wait for the publish, so its events never precede
// its `started` report and its exit always finds its slot.
void WorkerAgent::Impl::HandleAssignment(const v1::Assignment& a) {
  std::unique_ptr<ChildSupervisor> replaced;
  RankLaunch launch;
  {
    absl::MutexLock lock(&mu());
    if (!AdmitAssignmentLocked(a, &replaced, &launch)) return;
  }
  replaced.reset();  // Joins its supervisor thread (its exit report is queued); takes mu().
  absl::StatusOr<std::optional<std::string>> interval_line = PrepareRankFiles(a, &launch);
  if (RefusedBeforeFork(a, launch, interval_line)) return;
  launch.control_stdin = interval_line->has_value();  // interval updates (kCheckpointInterval)
  auto published = std::make_shared<bool>(false);     // Guarded by mu().
  auto child =
      ChildSupervisor::Start(BuildRankArgv(launch), "", CallbacksFor(a.ref(), a.slot(), published),
                             RankEnvironment(launch));

  absl::MutexLock lock(&mu());
  --assigning_;
  if (!child.ok()) {
    ReportExitLocked(a.ref(), a.slot(), contract::kExitFailure, 0, false, false,
                     absl::StrCat("worker ", config_.name,
                                  " cannot start ulysses-train: ", child.status().message()));
    return;
  }
  // Published even when shutdown_ was set meanwhile: Run() waits for assigning_ to reach 0
  // and then stops this child with the grace like every other.
  *published = true;
  PublishLocked(a, launch, *std::move(child), *interval_line);
}

bool WorkerAgent::Impl::RefusedBeforeFork(
    const v1::Assignment& a, const RankLaunch& launch,
    const absl::StatusOr<std::optional<std::string>>& interval_line) {
  const v1::WorkRef& ref = a.ref();
  {
    absl::MutexLock lock(&mu());
    if (!interval_line.ok() || shutdown_) {
      --assigning_;
      const bool refused = !interval_line.ok();
      // A refused assignment: bad input (paths, interval) or the spec not written.
      ReportExitLocked(
          ref, a.slot(),
          refused ? contract::ExitCodeFor(interval_line.status()) : contract::kExitPreempted, 0,
          /*preempted=*/!refused, /*aborted=*/false,
          refused ? std::string(interval_line.status().message()) : "worker is shutting down");
      return true;
    }
  }
  // Rank 0 hosts the group's rendezvous store on master_port: a port another process holds on
  // this host (e.g. a job of another coordinator with an overlapping range) fails the attempt
  // here, before any rank starts, with the port and the fix as the job's reason; the retry
  // gets another port.
  if (launch.rank == 0 && launch.world_size > 1 && launch.master_port > 0 &&
      !net::TcpPortFree(launch.master_port)) {
    absl::MutexLock lock(&mu());
    --assigning_;
    ReportExitLocked(
        ref, a.slot(), contract::RankExitCodeFor(absl::UnavailableError("")), 0, false, false,
        absl::StrCat("rank 0 cannot host the rendezvous: port ", launch.master_port, " on ",
                     config_.name,
                     " is in use by another process (e.g. a job of another "
                     "coordinator whose rendezvous port range overlaps: give each coordinator on "
                     "a host its own rendezvous_port_min..rendezvous_port_max); the attempt is "
                     "retried on another port"));
    return true;
  }
  return false;
}

ChildCallbacks WorkerAgent::Impl::CallbacksFor(const v1::WorkRef& ref, int slot,
                                               std::shared_ptr<bool> published) {
  // Blocks a callback of the child until the child is its slot's (bounded: publish follows).
  auto await_published = [this, published] {
    mu().LockWhen(absl::Condition(published.get()));
    mu().Unlock();
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
    mu().LockWhen(absl::Condition(published.get()));
    session_.AddLogLocked(ref, stream == "stderr" ? v1::LOG_STREAM_STDERR : v1::LOG_STREAM_STDOUT,
                          line);
    mu().Unlock();
  };
  callbacks.on_exit = [this, ref, slot, await_published](const ChildResult& result) {
    await_published();
    OnExit(ref, slot, result);
  };
  return callbacks;
}

void WorkerAgent::Impl::PublishLocked(const v1::Assignment& a, const RankLaunch& launch,
                                      std::unique_ptr<ChildSupervisor> child,
                                      const std::optional<std::string>& interval_line) {
  const v1::WorkRef& ref = a.ref();
  const int slot_index = a.slot();
  const int64_t pid = child->pid();
  Slot& slot = slots_.Publish(slot_index, ref, pid, std::move(child));
  // The pipe holds the line until the rank's control reader takes it.
  if (interval_line.has_value() && !slot.child->SendLine(*interval_line)) {
    session_.NoteLocked(ref,
                        "could not pass the checkpoint interval to the rank (its stdin is closed)");
  }
  ULOG(INFO) << "started " << RefString(ref) << " on slot " << slot_index << " (" << slot.device
             << "; world " << launch.world_size << ", seq_len " << a.seq_len() << ", master "
             << launch.master_addr << ":" << launch.master_port << ") as pid " << slot.pid;
  v1::WorkerMessage started;
  *started.mutable_started()->mutable_ref() = ref;
  started.mutable_started()->set_pid(slot.pid);
  session_.EnqueueLocked(std::move(started));
  session_.NoteLocked(
      ref, absl::StrCat("worker ", config_.name, " started rank ", ref.rank(), "/",
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
  if (slots_.Runs(ref)) {
    ULOG(INFO) << "duplicate assignment for " << RefString(ref) << ": already running";
    return false;
  }
  const int slot_index = a.slot();
  if (!slots_.Valid(slot_index)) {
    ReportExitLocked(
        ref, slot_index, contract::kExitFailure, 0, false, false,
        absl::StrCat("worker ", config_.name, " was assigned slot ", slot_index, " but has ",
                     slots_.size(), " (devices ", absl::StrJoin(config_.devices, ","), ")"));
    return false;
  }
  Slot& slot = slots_.at(slot_index);
  if (slot.child != nullptr) {
    // A finished child is destroyed by the caller; a stale one (the coordinator moved on) is
    // stopped here first.
    *replaced = std::move(slot.child);
    if (slot.ref) {
      ULOG(WARNING) << "new assignment " << RefString(ref) << " replaces running "
                    << RefString(*slot.ref) << " on slot " << slot_index;
      session_.NoteLocked(*slot.ref, "replaced by a newer assignment: aborting");
      (*replaced)->Stop(contract::StopRequest::kAbort, kReconnectAbortGrace);
    }
  }
  *launch = LaunchFor(a, slot.device, slots_.size());
  ++assigning_;
  return true;
}

RankLaunch WorkerAgent::Impl::LaunchFor(const v1::Assignment& a, const std::string& device,
                                        int slots) const {
  const v1::WorkRef& ref = a.ref();
  RankLaunch launch;
  launch.engine_bin = config_.engine_bin;
  launch.job_id = ref.job_id();
  launch.tenant = a.tenant();
  launch.generation = ref.generation();
  launch.rendezvous_secret = a.rendezvous_secret();
  launch.stage = ref.stage();
  launch.rank = ref.rank();
  launch.world_size = std::max(1, a.world_size());
  launch.master_addr = a.master_addr().empty() ? config_.advertise_host : a.master_addr();
  launch.master_port = a.master_port();
  launch.device = device;
  launch.collective_timeout_s = config_.collective_timeout_s;
  launch.peak_flops = config_.peak_flops;
  // The rank leaves within the grace even mid-step (worker/engine/train/preemption.h).
  launch.stop_grace_s = config_.grace_period.count() / 1000.0;
  launch.intra_op_threads = config_.intra_op_threads > 0
                                ? config_.intra_op_threads
                                : process::IntraOpThreadShare(process::UsableCores(), slots);
  launch.overrides.assign(a.overrides().begin(), a.overrides().end());
  return launch;
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
  absl::MutexLock lock(&mu());
  if (const auto* done = std::get_if<contract::DoneEvent>(&event)) {
    session_.NoteLocked(ref, absl::StrCat("rank ", ref.rank(), " finished stage ", done->stage));
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
  session_.EnqueueLocked(std::move(msg));
}

void WorkerAgent::Impl::OnBadEvent(const v1::WorkRef& ref, const std::string& line,
                                   const absl::Status& error) {
  ULOG(WARNING) << RefString(ref) << ": ignoring a malformed event line: " << error.message()
                << ": " << line;
  absl::MutexLock lock(&mu());
  session_.NoteLocked(ref, absl::StrCat("rank ", ref.rank(),
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
  absl::MutexLock lock(&mu());
  session_.NoteLocked(
      ref, absl::StrCat("ulysses-train ", result.description, " (",
                        contract::RankOutcomeName(result.outcome), ")",
                        result.sigkilled_by_agent ? ", SIGKILL after the grace period" : ""));
  ReportExitLocked(ref, slot_index, exit.exit_code, exit.signal,
                   result.stop_cause == contract::StopRequest::kPreempt,
                   result.stop_cause == contract::StopRequest::kAbort, error);
  slots_.Finish(slot_index, ref);  // A no-op once shut down (the table was taken).
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
  slots_.ExitReported(ref, slot);
  session_.EnqueueLocked(std::move(msg));
}

WorkerAgent::WorkerAgent(WorkerConfig config) : impl_(new Impl(std::move(config))) {}
WorkerAgent::~WorkerAgent() = default;
absl::Status WorkerAgent::Run() { return impl_->Run(); }
void WorkerAgent::RequestShutdown() { impl_->RequestShutdown(); }

}  // namespace ulysses::agent
