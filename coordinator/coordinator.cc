#include "coordinator/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/contract/exit.h"
#include "common/logging.h"
#include "common/metrics/build_info.h"
#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "coordinator/scheduler.h"
#include "coordinator/validation.h"
#include "google/protobuf/util/time_util.h"

namespace ulysses::coordinator {
namespace {

using google::protobuf::util::TimeUtil;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SetTime(int64_t ms, google::protobuf::Timestamp* ts) {
  if (ms > 0) *ts = TimeUtil::MillisecondsToTimestamp(ms);
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

bool IsQueued(v1::JobState s) {
  return s == v1::JOB_STATE_PENDING || s == v1::JOB_STATE_PREEMPTED ||
         s == v1::JOB_STATE_RECOVERING;
}

std::string StateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  return n.rfind("JOB_STATE_", 0) == 0 ? n.substr(10) : n;
}

std::string CheckpointText(const JobRecord& job) {
  if (!job.last_checkpoint) return "the start of the stage (no committed checkpoint)";
  return absl::StrCat("checkpoint stage ", job.last_checkpoint->stage, " step ",
                      job.last_checkpoint->step);
}

v1::Checkpoint ToProto(const CheckpointRecord& c) {
  v1::Checkpoint p;
  p.set_path(c.path);
  p.set_stage(c.stage);
  p.set_step(c.step);
  p.set_bytes(c.bytes);
  p.set_seconds(c.seconds);
  p.set_generation(c.generation);
  SetTime(c.committed_ms, p.mutable_committed_at());
  return p;
}

v1::Attempt ToProto(const AttemptRecord& a) {
  v1::Attempt p;
  p.set_generation(a.generation);
  p.set_stage(a.stage);
  for (const auto& w : a.worker_ids) p.add_worker_ids(w);
  p.set_master_addr(a.master_addr);
  p.set_master_port(a.master_port);
  SetTime(a.started_ms, p.mutable_started_at());
  SetTime(a.ended_ms, p.mutable_ended_at());
  p.set_outcome(a.outcome);
  p.set_exit_code(a.exit_code);
  p.set_reason(a.reason);
  return p;
}

}  // namespace

struct Coordinator::WorkerRt {
  WorkerRecord rec;
  v1::WorkerState state = v1::WORKER_STATE_DISCONNECTED;
  WorkerSink* sink = nullptr;
  uint64_t session = 0;
  int64_t last_seen_steady = 0;
  std::optional<v1::WorkRef> assigned;          // What we believe it runs (until its exit report).
  std::vector<v1::CoordinatorMessage> pending;  // Queued while no session is open.
  // The worker announced its own shutdown (SIGTERM: a Kubernetes preemption). It gets no new
  // work until it registers again, so a requeued job is not placed on a worker about to exit.
  bool draining = false;
};

struct Coordinator::JobRt {
  JobRecord rec;
  std::set<int> started_ranks;
  std::set<int> done_ranks;
  bool awaiting_reconnect = false;
  int64_t reconnect_deadline_steady = 0;
  std::set<int> reconnected_ranks;
  std::deque<v1::JobEvent> events;
  int64_t next_event_seq = 1;
  std::deque<v1::LogLine> logs;
  int64_t next_log_seq = 1;
  std::set<JobEventSink*> watchers;
  std::set<LogSink*> log_followers;
  bool progress_dirty = false;
  int64_t last_flush_steady = 0;
  int64_t queued_since_steady = 0;
  int64_t recovering_since_steady = 0;
  int64_t last_progress_steady = 0;
  int64_t last_progress_generation = 0;
};

struct Coordinator::Txn {
  std::set<JobRt*> jobs;
  std::set<WorkerRt*> workers;
  Store::Batch batch;
  std::vector<std::pair<WorkerRt*, v1::CoordinatorMessage>> outbound;
  std::vector<std::pair<JobRt*, v1::JobEvent>> notify;
  std::vector<JobRt*> ended;
};

struct Coordinator::Metrics {
  std::unique_ptr<metrics::Registry> owned;
  metrics::HistogramFamily* gang_wait = nullptr;
  metrics::CounterFamily* restarts = nullptr;
  metrics::CounterFamily* preemptions = nullptr;
  metrics::HistogramFamily* recovery = nullptr;
  metrics::CounterFamily* stage_transitions = nullptr;
  metrics::HistogramFamily* checkpoint_seconds = nullptr;
  metrics::GaugeFamily* checkpoint_bytes = nullptr;
  metrics::GaugeFamily* loss = nullptr;
  metrics::GaugeFamily* tokens_per_s = nullptr;
  metrics::GaugeFamily* step = nullptr;
  metrics::CounterFamily* tokens = nullptr;
  metrics::CounterFamily* rejected_reports = nullptr;
};

Coordinator::Coordinator(CoordinatorConfig config, std::unique_ptr<Store> store,
                         metrics::Registry* registry)
    : config_(std::move(config)), store_(std::move(store)), metrics_(new Metrics) {
  if (registry == nullptr) {
    metrics_->owned = std::make_unique<metrics::Registry>();
    registry = metrics_->owned.get();
  }
  auto must = [](auto status_or) {
    if (!status_or.ok()) ULOG(ERROR) << "metric registration: " << status_or.status();
    return status_or.ok() ? *status_or : nullptr;
  };
  auto check = [](const absl::Status& s) {
    if (!s.ok()) ULOG(ERROR) << "metric registration: " << s;
  };
  Metrics& m = *metrics_;
  m.gang_wait = must(
      registry->AddHistogram("ulysses_gang_wait_seconds",
                             "Time a job waited in the queue until its whole group was placed.", {},
                             metrics::ExponentialBuckets(0.5, 2, 12)));
  m.restarts = must(registry->AddCounter("ulysses_job_restarts_total",
                                         "Group restarts after a failure, by reason.", {"reason"}));
  m.preemptions = must(registry->AddCounter("ulysses_preemptions_total",
                                            "Preemptions (rank exit 75 after a checkpoint)."));
  m.recovery =
      must(registry->AddHistogram("ulysses_recovery_duration_seconds",
                                  "Time from a group breaking (RECOVERING) until it runs again.",
                                  {}, metrics::ExponentialBuckets(0.5, 2, 12)));
  m.stage_transitions = must(registry->AddCounter(
      "ulysses_stage_transitions_total", "Stages completed (moves to the next stage or success)."));
  m.checkpoint_seconds = must(registry->AddHistogram("ulysses_checkpoint_save_duration_seconds",
                                                     "Wall time of committed checkpoint saves.", {},
                                                     metrics::ExponentialBuckets(0.5, 2, 12)));
  m.checkpoint_bytes =
      must(registry->AddGauge("ulysses_checkpoint_bytes",
                              "Size of the last committed checkpoint per live job.", {"job_id"}));
  m.loss = must(registry->AddGauge("ulysses_train_loss",
                                   "Last reported training loss per live job.", {"job_id"}));
  m.tokens_per_s = must(registry->AddGauge("ulysses_train_tokens_per_second",
                                           "Last reported throughput per live job.", {"job_id"}));
  m.step = must(registry->AddGauge(
      "ulysses_train_step", "Last reported step of the current stage per live job.", {"job_id"}));
  m.tokens = must(registry->AddCounter(
      "ulysses_train_tokens_total",
      "Tokens trained per live job since the coordinator started (reported throughput "
      "integrated between rank-0 progress reports).",
      {"job_id"}));
  m.rejected_reports = must(registry->AddCounter(
      "ulysses_rejected_reports_total",
      "Worker session messages rejected (dropped, answered with an error Ack), by reason.",
      {"reason"}));
  check(registry->AddCallbackGaugeFamily("ulysses_jobs", "Jobs by state.", {"state"},
                                         [this] { return CountJobsByState(); }));
  check(registry->AddCallbackGauge("ulysses_queue_length",
                                   "Jobs waiting for placement (PENDING, PREEMPTED, RECOVERING).",
                                   [this] { return QueueLength(); }));
  check(registry->AddCallbackGaugeFamily("ulysses_workers", "Workers by state.", {"state"},
                                         [this] { return CountWorkersByState(); }));
  check(
      registry->AddCallbackGaugeFamily("ulysses_worker_heartbeat_age_seconds",
                                       "Seconds since the last message from each non-lost worker.",
                                       {"worker"}, [this] { return HeartbeatAges(); }));
  if (metrics_->owned == nullptr) {
    // build_info belongs to the process; registered once by whoever owns the registry.
    absl::Status s = metrics::RegisterBuildInfo(registry);
    if (!s.ok() && !absl::IsAlreadyExists(s)) ULOG(ERROR) << s;
  }
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(const CoordinatorConfig& config,
                                                                 metrics::Registry* registry) {
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(config.state_dir));
  std::unique_ptr<Coordinator> c(new Coordinator(config, std::move(store), registry));
  RETURN_IF_ERROR(c->Recover());
  return c;
}

Coordinator::~Coordinator() { Shutdown(); }

absl::Status Coordinator::Recover() {
  ASSIGN_OR_RETURN(Store::Snapshot snap, store_->Load());
  std::lock_guard<std::mutex> lock(mu_);
  next_job_number_ = snap.max_job_number + 1;
  const int64_t now = SteadyMs();
  // Workers known before the restart get reconnect_window_s (not heartbeat_timeout_s)
  // to come back before they are declared LOST.
  const int64_t grace_ms =
      static_cast<int64_t>((config_.reconnect_window_s - config_.heartbeat_timeout_s) * 1000);
  for (WorkerRecord& w : snap.workers) {
    auto rt = std::make_unique<WorkerRt>();
    rt->rec = std::move(w);
    rt->last_seen_steady = now + std::max<int64_t>(0, grace_ms);
    workers_[rt->rec.id] = std::move(rt);
  }
  Txn txn;
  for (JobRecord& j : snap.jobs) {
    auto rt = std::make_unique<JobRt>();
    rt->rec = std::move(j);
    JobRt& job = *rt;
    ASSIGN_OR_RETURN(std::vector<EventRecord> events,
                     store_->LoadEvents(job.rec.id, static_cast<int>(config_.event_history)));
    for (const EventRecord& e : events) {
      v1::JobEvent ev;
      if (ev.ParseFromString(e.payload)) job.events.push_back(std::move(ev));
      job.next_event_seq = e.sequence + 1;
    }
    jobs_[job.rec.id] = std::move(rt);
    AttemptRecord* attempt = job.rec.current_attempt();
    if (job.rec.terminal() || attempt == nullptr || attempt->ended()) {
      if (IsQueued(job.rec.state)) job.queued_since_steady = now;
      continue;
    }
    job.awaiting_reconnect = true;
    job.reconnect_deadline_steady = now + static_cast<int64_t>(config_.reconnect_window_s * 1000);
    for (size_t r = 0; r < attempt->worker_ids.size(); ++r) {
      auto it = workers_.find(attempt->worker_ids[r]);
      if (it == workers_.end()) continue;
      v1::WorkRef ref;
      ref.set_job_id(job.rec.id);
      ref.set_generation(job.rec.generation);
      ref.set_rank(static_cast<int>(r));
      ref.set_stage(attempt->stage);
      it->second->assigned = ref;
    }
    SetState(job, v1::JOB_STATE_RECOVERING,
             absl::StrCat("coordinator restarted; waiting up to ", config_.reconnect_window_s,
                          "s for ", attempt->worker_ids.size(),
                          " workers to reconnect (generation ", job.rec.generation, ")"),
             txn);
  }
  RETURN_IF_ERROR(CommitLocked(txn));
  serving_ = true;
  ULOG(INFO) << "coordinator state recovered from " << store_->path() << ": " << jobs_.size()
             << " jobs, " << workers_.size() << " workers";
  return absl::OkStatus();
}

void Coordinator::Start() {
  std::lock_guard<std::mutex> lock(ticker_mu_);
  if (ticker_.joinable() || stop_) return;
  ticker_ = std::thread([this] { TickerLoop(); });
}

void Coordinator::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(ticker_mu_);
    stop_ = true;
  }
  ticker_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, w] : workers_) {
    if (w->sink != nullptr) {
      w->sink->Close(absl::UnavailableError("coordinator shutting down"));
      w->sink = nullptr;
      w->session = 0;
    }
  }
  for (auto& [id, j] : jobs_) {
    for (JobEventSink* s : j->watchers) s->OnJobEnded();
    for (LogSink* s : j->log_followers) s->OnJobEnded();
    j->watchers.clear();
    j->log_followers.clear();
  }
}

void Coordinator::TickerLoop() {
  std::unique_lock<std::mutex> lock(ticker_mu_);
  while (!stop_) {
    ticker_cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_) break;
    lock.unlock();
    TickForTesting();
    lock.lock();
  }
}

void Coordinator::TickForTesting() {
  std::lock_guard<std::mutex> lock(mu_);
  Txn txn;
  TickLocked(txn);
  (void)CommitLocked(txn);
}

void Coordinator::TickLocked(Txn& txn) {
  const int64_t now = SteadyMs();
  const int64_t timeout_ms = static_cast<int64_t>(config_.heartbeat_timeout_s * 1000);
  for (auto& [id, w] : workers_) {
    if (w->state == v1::WORKER_STATE_LOST) continue;
    int64_t age = now - w->last_seen_steady;
    if (age > timeout_ms) {
      OnWorkerLost(*w, absl::StrFormat("no heartbeat for %.1fs", age / 1000.0), txn);
    }
  }
  for (auto& [id, j] : jobs_) {
    JobRt& job = *j;
    if (job.awaiting_reconnect && now >= job.reconnect_deadline_steady) {
      std::string why =
          absl::StrCat("coordinator restarted and only ", job.reconnected_ranks.size(), " of ",
                       job.rec.stages[job.rec.stage_index].world(), " workers reconnected within ",
                       config_.reconnect_window_s, "s");
      EndAttempt(job, v1::ATTEMPT_OUTCOME_ABORTED, 0, why,
                 static_cast<int64_t>(config_.abort_grace_s * 1000), txn);
      job.rec.restarts++;
      if (metrics_->restarts) metrics_->restarts->WithLabels({"coordinator_restart"})->Increment();
      job.rec.not_before_ms = 0;
      SetState(job, v1::JOB_STATE_RECOVERING,
               absl::StrCat(why, "; restarting from ", CheckpointText(job.rec)), txn);
    }
    if (job.progress_dirty && now - job.last_flush_steady >= 1000) {
      job.progress_dirty = false;
      job.last_flush_steady = now;
      txn.jobs.insert(&job);
    }
  }
  ScheduleLocked(txn);
}

absl::Status Coordinator::CommitLocked(Txn& txn) {
  for (JobRt* j : txn.jobs) txn.batch.jobs.push_back(j->rec);
  for (WorkerRt* w : txn.workers) txn.batch.workers.push_back(w->rec);
  absl::Status s = store_->Write(txn.batch);
  if (!s.ok() && !store_->writable()) {
    if (serving_.exchange(false)) ULOG(ERROR) << s << "; coordinator is NOT_SERVING";
    return absl::UnavailableError(std::string(s.message()));
  }
  if (!s.ok()) {
    // The store refused this change's data (a bug: validation should have caught it).
    // Only this request fails: its in-memory changes are undone, nothing is sent.
    ULOG(ERROR) << s << "; the change was undone (please report this bug)";
    RestoreLocked(txn);
    txn = Txn();
    return absl::InternalError(absl::StrCat(s.message(), "; the change was undone"));
  }
  for (auto& [worker, msg] : txn.outbound) {
    if (worker->sink != nullptr) {
      worker->sink->Send(msg);
    } else {
      worker->pending.push_back(std::move(msg));
    }
  }
  for (auto& [job, ev] : txn.notify) {
    for (JobEventSink* s : job->watchers) s->OnEvent(ev);
  }
  for (JobRt* job : txn.ended) JobEnded(*job);
  txn = Txn();
  return absl::OkStatus();
}

void Coordinator::RestoreLocked(const Txn& txn) {
  std::set<std::string> job_ids;
  for (JobRt* j : txn.jobs) job_ids.insert(j->rec.id);
  for (const EventRecord& e : txn.batch.events) job_ids.insert(e.job_id);
  for (const CheckpointRecord& c : txn.batch.checkpoints) job_ids.insert(c.job_id);
  for (const auto& [job, event] : txn.notify) job_ids.insert(job->rec.id);
  for (JobRt* j : txn.ended) job_ids.insert(j->rec.id);
  for (const std::string& id : job_ids) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    JobRt& job = *it->second;
    absl::StatusOr<std::optional<JobRecord>> stored = store_->LoadJob(id);
    if (!stored.ok()) {
      ULOG(ERROR) << id << ": cannot reload after a refused write: " << stored.status();
      continue;
    }
    if (!stored->has_value()) {  // Never written (a new job): it does not exist.
      if (job.watchers.empty() && job.log_followers.empty()) jobs_.erase(it);
      continue;
    }
    if ((*stored)->generation != job.rec.generation) {
      job.started_ranks.clear();
      job.done_ranks.clear();
    }
    job.rec = std::move(**stored);
    absl::StatusOr<std::vector<EventRecord>> events =
        store_->LoadEvents(id, static_cast<int>(config_.event_history));
    if (events.ok()) {
      job.events.clear();
      for (const EventRecord& e : *events) {
        v1::JobEvent ev;
        if (ev.ParseFromString(e.payload)) job.events.push_back(std::move(ev));
      }
    }
    v1::LogLine line;
    line.set_stream(v1::LOG_STREAM_COORDINATOR);
    line.set_text("the state store refused the last change to this job; it was undone");
    std::vector<v1::LogLine> batch;
    AddLogLocked(job, std::move(line), &batch);
    for (LogSink* s : job.log_followers) s->OnLines(batch);
  }
  for (WorkerRt* w : txn.workers) {
    absl::StatusOr<std::optional<WorkerRecord>> stored = store_->LoadWorker(w->rec.id);
    if (!stored.ok()) continue;
    if (stored->has_value()) {
      w->rec = std::move(**stored);
    } else if (w->sink == nullptr) {
      workers_.erase(w->rec.id);  // Never written (a new registration): it does not exist.
    }
  }
  // Assignments made by the undone change point at attempts that no longer exist.
  for (auto& [id, w] : workers_) {
    if (!w->assigned || !job_ids.count(w->assigned->job_id())) continue;
    auto jt = jobs_.find(w->assigned->job_id());
    const AttemptRecord* a = jt == jobs_.end() ? nullptr : jt->second->rec.current_attempt();
    if (a != nullptr && !a->ended() && a->generation == w->assigned->generation()) continue;
    w->assigned.reset();
    if (w->state == v1::WORKER_STATE_BUSY) w->state = v1::WORKER_STATE_IDLE;
  }
}

void Coordinator::JobEnded(JobRt& job) {
  if (!job.rec.terminal()) return;  // Resumed within the same transaction.
  for (JobEventSink* s : job.watchers) s->OnJobEnded();
  for (LogSink* s : job.log_followers) s->OnJobEnded();
  job.watchers.clear();
  job.log_followers.clear();
  for (metrics::GaugeFamily* f :
       {metrics_->checkpoint_bytes, metrics_->loss, metrics_->tokens_per_s, metrics_->step}) {
    if (f) f->Remove({job.rec.id});
  }
  if (metrics_->tokens) metrics_->tokens->Remove({job.rec.id});
}

void Coordinator::AddEvent(JobRt& job, v1::JobEvent event, bool persist, Txn& txn) {
  event.set_job_id(job.rec.id);
  event.set_sequence(job.next_event_seq++);
  *event.mutable_time() = TimeUtil::MillisecondsToTimestamp(NowMs());
  if (persist) {
    EventRecord rec{job.rec.id, event.sequence(), NowMs(), event.SerializeAsString()};
    txn.batch.events.push_back(std::move(rec));
  }
  job.events.push_back(event);
  while (job.events.size() > static_cast<size_t>(config_.event_history)) job.events.pop_front();
  if (!job.watchers.empty()) txn.notify.emplace_back(&job, std::move(event));
}

void Coordinator::SetState(JobRt& job, v1::JobState to, const std::string& reason, Txn& txn,
                           const std::string& actor) {
  const v1::JobState from = job.rec.state;
  const int64_t now = NowMs();
  const int64_t steady = SteadyMs();
  job.rec.reason = reason;
  txn.jobs.insert(&job);
  if (from == to) return;
  job.rec.state = to;
  job.rec.state_entered_ms = now;
  if (to == v1::JOB_STATE_RUNNING && job.rec.started_ms == 0) job.rec.started_ms = now;
  if (IsTerminal(to)) {
    job.rec.finished_ms = now;
    txn.ended.push_back(&job);
  }
  if (IsQueued(to) && !IsQueued(from)) job.queued_since_steady = steady;
  if ((to == v1::JOB_STATE_RECOVERING || to == v1::JOB_STATE_PREEMPTED) &&
      job.recovering_since_steady == 0) {
    job.recovering_since_steady = steady;
  }
  if (to == v1::JOB_STATE_RUNNING && job.recovering_since_steady != 0) {
    if (metrics_->recovery) {
      metrics_->recovery->WithLabels()->Observe((steady - job.recovering_since_steady) / 1000.0);
    }
    job.recovering_since_steady = 0;
  }
  if (IsTerminal(to)) job.recovering_since_steady = 0;
  ULOG(INFO) << job.rec.id << ": " << StateName(from) << " -> " << StateName(to) << " (" << reason
             << ")";
  v1::JobEvent ev;
  ev.mutable_state_change()->set_from(from);
  ev.mutable_state_change()->set_to(to);
  ev.mutable_state_change()->set_reason(reason);
  ev.mutable_state_change()->set_actor(actor);
  AddEvent(job, std::move(ev), /*persist=*/true, txn);
  v1::LogLine line;
  line.set_stream(v1::LOG_STREAM_COORDINATOR);
  line.set_text(absl::StrCat("job ", StateName(from), " -> ", StateName(to), ": ", reason));
  std::vector<v1::LogLine> batch;
  AddLogLocked(job, std::move(line), &batch);
  for (LogSink* s : job.log_followers) s->OnLines(batch);
}

void Coordinator::AddLogLocked(JobRt& job, v1::LogLine line, std::vector<v1::LogLine>* batch) {
  line.set_sequence(job.next_log_seq++);
  if (!line.has_time()) *line.mutable_time() = TimeUtil::MillisecondsToTimestamp(NowMs());
  job.logs.push_back(line);
  while (job.logs.size() > static_cast<size_t>(config_.log_buffer_lines)) job.logs.pop_front();
  batch->push_back(std::move(line));
}

void Coordinator::SendTo(WorkerRt& worker, v1::CoordinatorMessage message, Txn& txn) {
  txn.outbound.emplace_back(&worker, std::move(message));
}

int Coordinator::AllocatePort() {
  std::set<int> in_use;
  for (auto& [id, j] : jobs_) {
    const AttemptRecord* a = j->rec.current_attempt();
    if (a != nullptr && !a->ended()) in_use.insert(a->master_port);
  }
  const int lo = static_cast<int>(config_.rendezvous_port_min);
  const int span = static_cast<int>(config_.rendezvous_port_max - config_.rendezvous_port_min + 1);
  for (int i = 0; i < span; ++i) {
    int port = lo + (next_port_ + i) % span;
    if (!in_use.count(port)) {
      next_port_ = (next_port_ + i + 1) % span;
      return port;
    }
  }
  next_port_ = (next_port_ + 1) % span;
  return lo + next_port_;
}

void Coordinator::ScheduleLocked(Txn& txn) {
  const int64_t now = NowMs();
  std::vector<JobRt*> queue;
  for (auto& [id, j] : jobs_) {
    JobRt& job = *j;
    if (job.rec.terminal() || job.awaiting_reconnect || !IsQueued(job.rec.state)) continue;
    const AttemptRecord* a = job.rec.current_attempt();
    if (a != nullptr && !a->ended()) continue;
    queue.push_back(&job);
  }
  if (queue.empty()) return;
  std::sort(queue.begin(), queue.end(), [](const JobRt* a, const JobRt* b) {
    return QueueKey{a->rec.priority, a->rec.number} < QueueKey{b->rec.priority, b->rec.number};
  });
  std::vector<IdleWorker> idle;
  for (auto& [id, w] : workers_) {
    if (w->sink != nullptr && w->state == v1::WORKER_STATE_IDLE && !w->assigned && !w->draining) {
      idle.push_back({w->rec.id, w->rec.node_label});
    }
  }
  const JobRt* blocker = nullptr;
  for (JobRt* job : queue) {
    const StageRecord& stage = job->rec.stages[job->rec.stage_index];
    std::string reason;
    if (blocker != nullptr) {
      reason = absl::StrCat("queued behind ", blocker->rec.id, " (priority ", blocker->rec.priority,
                            ")");
    } else if (job->rec.not_before_ms > now) {
      reason = job->rec.reason;  // Restart backoff still running; keep its explanation.
    } else {
      Placement p = PlaceGang({stage.sp, stage.dp, job->rec.node_label}, idle);
      if (p.placed) {
        std::set<std::string> used(p.worker_ids.begin(), p.worker_ids.end());
        idle.erase(std::remove_if(idle.begin(), idle.end(),
                                  [&](const IdleWorker& w) { return used.count(w.id) > 0; }),
                   idle.end());
        Launch(*job, p.worker_ids, txn);
        continue;
      }
      reason = absl::StrCat("stage ", stage.index, ": ", p.reason);
      if (job->rec.state == v1::JOB_STATE_RECOVERING || job->rec.state == v1::JOB_STATE_PREEMPTED) {
        reason = absl::StrCat("restarting from ", CheckpointText(job->rec), "; ", reason);
      }
      // Head-of-line blocking keeps big gangs from starving, unless the job could
      // never be placed with the workers that exist.
      int eligible = 0;
      for (auto& [id, w] : workers_) {
        if (w->state != v1::WORKER_STATE_LOST &&
            (job->rec.node_label.empty() || w->rec.node_label == job->rec.node_label)) {
          ++eligible;
        }
      }
      if (eligible >= stage.world()) blocker = job;
    }
    if (reason != job->rec.reason) {
      job->rec.reason = reason;
      txn.jobs.insert(job);
    }
  }
}

void Coordinator::Launch(JobRt& job, const std::vector<std::string>& worker_ids, Txn& txn) {
  JobRecord& rec = job.rec;
  StageRecord& stage = rec.stages[rec.stage_index];
  const int64_t now = NowMs();
  rec.generation++;
  rec.not_before_ms = 0;
  stage.attempts++;
  if (stage.state != v1::STAGE_STATE_RUNNING) {
    stage.state = v1::STAGE_STATE_RUNNING;
    if (stage.started_ms == 0) stage.started_ms = now;
  }
  AttemptRecord attempt;
  attempt.generation = rec.generation;
  attempt.stage = stage.index;
  attempt.worker_ids = worker_ids;
  attempt.master_addr = workers_[worker_ids[0]]->rec.host;
  attempt.master_port = AllocatePort();
  attempt.started_ms = now;
  rec.attempts.push_back(attempt);
  job.started_ranks.clear();
  job.done_ranks.clear();
  if (metrics_->gang_wait && job.queued_since_steady > 0) {
    metrics_->gang_wait->WithLabels()->Observe((SteadyMs() - job.queued_since_steady) / 1000.0);
  }
  for (size_t r = 0; r < worker_ids.size(); ++r) {
    WorkerRt& w = *workers_[worker_ids[r]];
    v1::CoordinatorMessage msg;
    v1::Assignment* a = msg.mutable_assignment();
    a->mutable_ref()->set_job_id(rec.id);
    a->mutable_ref()->set_generation(rec.generation);
    a->mutable_ref()->set_rank(static_cast<int>(r));
    a->mutable_ref()->set_stage(stage.index);
    a->set_job_name(rec.name);
    a->set_spec_yaml(rec.spec_yaml);
    a->set_world_size(stage.world());
    a->set_sp(stage.sp);
    a->set_dp(stage.dp);
    a->set_master_addr(attempt.master_addr);
    a->set_master_port(attempt.master_port);
    a->set_checkpoint_dir(rec.checkpoint_dir);
    a->set_out_dir(rec.out_dir);
    a->add_overrides(absl::StrCat("spec.checkpoint.dir=", rec.checkpoint_dir));
    a->set_seq_len(stage.seq_len);
    a->set_steps(stage.steps);
    w.assigned = a->ref();
    w.state = v1::WORKER_STATE_BUSY;
    SendTo(w, std::move(msg), txn);
  }
  v1::JobEvent ev;
  *ev.mutable_attempt_started() = coordinator::ToProto(attempt);
  AddEvent(job, std::move(ev), true, txn);
  SetState(job, v1::JOB_STATE_SCHEDULING,
           absl::StrCat("starting stage ", stage.index, " (generation ", rec.generation, ") on ",
                        worker_ids.size(), " workers, rendezvous ", attempt.master_addr, ":",
                        attempt.master_port),
           txn);
}

void Coordinator::EndAttempt(JobRt& job, v1::AttemptOutcome outcome, int exit_code,
                             const std::string& reason, int64_t grace_ms, Txn& txn) {
  AttemptRecord* attempt = job.rec.current_attempt();
  if (attempt == nullptr || attempt->ended()) return;
  attempt->outcome = outcome;
  attempt->ended_ms = NowMs();
  attempt->exit_code = exit_code;
  attempt->reason = reason;
  job.awaiting_reconnect = false;
  job.reconnected_ranks.clear();
  for (const std::string& wid : attempt->worker_ids) {
    auto it = workers_.find(wid);
    if (it == workers_.end()) continue;
    WorkerRt& w = *it->second;
    if (!w.assigned || w.assigned->job_id() != job.rec.id ||
        w.assigned->generation() != attempt->generation) {
      continue;
    }
    v1::CoordinatorMessage msg;
    *msg.mutable_abort()->mutable_ref() = *w.assigned;
    msg.mutable_abort()->set_reason(reason);
    msg.mutable_abort()->set_grace_period_ms(grace_ms);
    SendTo(w, std::move(msg), txn);
  }
  v1::JobEvent ev;
  *ev.mutable_attempt_ended() = coordinator::ToProto(*attempt);
  AddEvent(job, std::move(ev), true, txn);
  txn.jobs.insert(&job);
}

void Coordinator::OnRankFailure(JobRt& job, v1::AttemptOutcome outcome, int exit_code,
                                const std::string& reason, const std::string& metric_reason,
                                Txn& txn) {
  EndAttempt(job, outcome, exit_code, reason, static_cast<int64_t>(config_.abort_grace_s * 1000),
             txn);
  if (outcome == v1::ATTEMPT_OUTCOME_BAD_INPUT) {
    SetState(job, v1::JOB_STATE_FAILED, reason, txn);
    return;
  }
  job.rec.failures++;
  if (job.rec.failures >= job.rec.max_failures) {
    SetState(job, v1::JOB_STATE_FAILED,
             absl::StrCat(reason, " (failure ", job.rec.failures, " of max_failures ",
                          job.rec.max_failures, ")"),
             txn);
    return;
  }
  job.rec.restarts++;
  if (metrics_->restarts) metrics_->restarts->WithLabels({metric_reason})->Increment();
  double backoff = std::min(config_.restart_backoff_max_s,
                            config_.restart_backoff_base_s * std::pow(2.0, job.rec.failures - 1));
  job.rec.not_before_ms = NowMs() + static_cast<int64_t>(backoff * 1000);
  SetState(
      job, v1::JOB_STATE_RECOVERING,
      absl::StrCat(reason, "; restarting from ", CheckpointText(job.rec), " in ", backoff,
                   "s (failure ", job.rec.failures, " of max_failures ", job.rec.max_failures, ")"),
      txn);
}

void Coordinator::OnRankPreempted(JobRt& job, int rank, int exit_code, const std::string& how,
                                  Txn& txn) {
  std::string why =
      exit_code == contract::kExitPreempted
          ? absl::StrCat("rank ", rank, " preempted (exit ", exit_code, " after a checkpoint)")
          : absl::StrCat("rank ", rank, " preempted (it ", how, " instead of exiting ",
                         contract::kExitPreempted, " after a checkpoint)");
  EndAttempt(job, v1::ATTEMPT_OUTCOME_PREEMPTED, exit_code, why,
             static_cast<int64_t>(config_.cancel_grace_s * 1000), txn);
  job.rec.preemptions++;
  job.rec.preemptions_budget_used++;
  if (metrics_->preemptions) metrics_->preemptions->WithLabels()->Increment();
  if (job.rec.max_preemptions >= 0 && job.rec.preemptions_budget_used > job.rec.max_preemptions) {
    SetState(job, v1::JOB_STATE_FAILED,
             absl::StrCat(why, "; preempted ", job.rec.preemptions_budget_used,
                          " times, max_preemptions is ", job.rec.max_preemptions),
             txn);
    return;
  }
  SetState(job, v1::JOB_STATE_PREEMPTED,
           absl::StrCat(why, "; requeued, resumes from ", CheckpointText(job.rec)), txn);
}

void Coordinator::CompleteStage(JobRt& job, Txn& txn) {
  JobRecord& rec = job.rec;
  StageRecord& stage = rec.stages[rec.stage_index];
  EndAttempt(job, v1::ATTEMPT_OUTCOME_SUCCEEDED, 0,
             absl::StrCat("stage ", stage.index, " finished"), 0, txn);
  stage.state = v1::STAGE_STATE_COMPLETED;
  stage.finished_ms = NowMs();
  stage.step = stage.steps;
  if (metrics_->stage_transitions) metrics_->stage_transitions->WithLabels()->Increment();
  rec.stage_index++;
  if (rec.stage_index >= static_cast<int>(rec.stages.size())) {
    SetState(job, v1::JOB_STATE_SUCCEEDED,
             absl::StrCat("all ", rec.stages.size(), " stages finished"), txn);
    return;
  }
  const StageRecord& next = rec.stages[rec.stage_index];
  SetState(job, v1::JOB_STATE_PENDING,
           absl::StrCat("stage ", stage.index, " finished; stage ", next.index, " (seq_len ",
                        next.seq_len, ", ", next.world(), " workers) queued"),
           txn);
}

void Coordinator::OnWorkerLost(WorkerRt& worker, const std::string& why, Txn& txn) {
  ULOG(WARNING) << "worker " << worker.rec.id << " lost: " << why;
  worker.state = v1::WORKER_STATE_LOST;
  if (worker.sink != nullptr) {
    worker.sink->Close(absl::UnavailableError(absl::StrCat("worker declared lost: ", why)));
    worker.sink = nullptr;
    worker.session = 0;
  }
  worker.pending.clear();
  if (!worker.assigned) return;
  v1::WorkRef ref = *worker.assigned;
  worker.assigned.reset();
  auto it = jobs_.find(ref.job_id());
  if (it == jobs_.end()) return;
  JobRt& job = *it->second;
  AttemptRecord* attempt = job.rec.current_attempt();
  if (attempt == nullptr || attempt->ended() || attempt->generation != ref.generation()) return;
  std::string reason =
      absl::StrCat("worker ", worker.rec.name, " (rank ", ref.rank(), ") lost: ", why);
  if (job.awaiting_reconnect) {
    EndAttempt(job, v1::ATTEMPT_OUTCOME_ABORTED, 0, reason,
               static_cast<int64_t>(config_.abort_grace_s * 1000), txn);
    job.rec.restarts++;
    if (metrics_->restarts) metrics_->restarts->WithLabels({"coordinator_restart"})->Increment();
    SetState(job, v1::JOB_STATE_RECOVERING,
             absl::StrCat(reason, "; restarting from ", CheckpointText(job.rec)), txn);
    return;
  }
  OnRankFailure(job, v1::ATTEMPT_OUTCOME_LOST, -1, reason, "worker_lost", txn);
}

// ---------------------------------------------------------------------------
// JobService

absl::StatusOr<v1::SubmitJobResponse> Coordinator::SubmitJob(const v1::SubmitJobRequest& request,
                                                             const auth::Principal& caller) {
  spec::ParseOptions options;
  options.overrides.assign(request.overrides().begin(), request.overrides().end());
  absl::StatusOr<spec::JobSpec> parsed = spec::ParseJobSpec(request.spec_yaml(), options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(std::string(parsed.status().message()));
  }
  const spec::JobSpec& s = *parsed;
  JobRecord rec;
  rec.name = s.metadata.name;
  rec.owner = caller.user;
  rec.tenant = caller.tenant;
  rec.spec_yaml = spec::ToYaml(s);
  rec.priority = s.scheduling.priority;
  rec.max_failures = static_cast<int>(s.scheduling.max_failures);
  rec.max_preemptions = static_cast<int>(s.scheduling.max_preemptions);
  rec.node_label = s.scheduling.node_label;
  for (size_t i = 0; i < s.stages.size(); ++i) {
    StageRecord st;
    st.index = static_cast<int>(i);
    st.seq_len = s.stages[i].seq_len;
    st.steps = s.stages[i].steps;
    st.sp = static_cast<int>(s.StageSp(i));
    st.dp = static_cast<int>(s.StageDp(i));
    rec.stages.push_back(st);
  }
  if (rec.stages.empty()) {
    return absl::InvalidArgumentError("spec.stages: empty (add at least one {seq_len, steps})");
  }
  v1::SubmitJobResponse response;
  response.set_canonical_spec_yaml(rec.spec_yaml);
  std::lock_guard<std::mutex> lock(mu_);
  if (!serving_) return absl::UnavailableError("coordinator is not serving (state store error)");
  rec.created_ms = NowMs();
  rec.state_entered_ms = rec.created_ms;
  if (request.dry_run()) {
    JobRt preview;
    preview.rec = std::move(rec);
    preview.rec.reason = "dry run: valid, not queued";
    *response.mutable_job() = ToProto(preview, true);
    return response;
  }
  rec.number = next_job_number_;
  rec.id = absl::StrFormat("job-%06d", rec.number);
  rec.checkpoint_dir =
      s.checkpoint.dir.empty() ? config_.checkpoint_root + "/" + rec.id : s.checkpoint.dir;
  rec.out_dir = config_.out_root + "/" + rec.id;
  rec.state = v1::JOB_STATE_UNSPECIFIED;
  auto rt = std::make_unique<JobRt>();
  rt->rec = std::move(rec);
  JobRt& job = *rt;
  const std::string id = job.rec.id;
  jobs_[id] = std::move(rt);
  Txn txn;
  SetState(job, v1::JOB_STATE_PENDING, "queued", txn);
  if (absl::Status st = CommitLocked(txn); !st.ok()) {
    jobs_.erase(id);
    return st;
  }
  next_job_number_++;
  ScheduleLocked(txn);
  (void)CommitLocked(txn);
  response.set_job_id(id);
  *response.mutable_job() = ToProto(job, true);
  return response;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const v1::GetJobRequest& request,
                                            const auth::Principal& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end() || !auth::MaySeeTenant(caller, it->second->rec.tenant)) {
    return absl::NotFoundError(absl::StrCat("job \"", request.job_id(), "\" not found"));
  }
  v1::Job job = ToProto(*it->second, true);
  if (request.include_events()) {
    for (const v1::JobEvent& e : it->second->events) *job.add_events() = e;
  }
  if (!request.include_spec()) job.clear_spec_yaml();
  return job;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request,
                                                           const auth::Principal& caller) {
  int page_size = request.page_size() <= 0 ? 100 : std::min(request.page_size(), 1000);
  int64_t before = INT64_MAX;
  if (!request.page_token().empty() && !absl::SimpleAtoi(request.page_token(), &before)) {
    return absl::InvalidArgumentError(absl::StrCat("page_token: \"", request.page_token(),
                                                   "\" is not a token from ListJobs (omit it)"));
  }
  std::set<int> states(request.states().begin(), request.states().end());
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const JobRt*> matching;
  for (auto& [id, j] : jobs_) {
    if (j->rec.number >= before) continue;
    if (!states.empty() && !states.count(j->rec.state)) continue;
    if (!auth::MaySeeTenant(caller, j->rec.tenant)) continue;
    matching.push_back(j.get());
  }
  std::sort(matching.begin(), matching.end(),
            [](const JobRt* a, const JobRt* b) { return a->rec.number > b->rec.number; });
  v1::ListJobsResponse response;
  for (size_t i = 0; i < matching.size() && i < static_cast<size_t>(page_size); ++i) {
    v1::Job job = ToProto(*matching[i], false);
    job.clear_spec_yaml();
    *response.add_jobs() = std::move(job);
  }
  if (matching.size() > static_cast<size_t>(page_size)) {
    response.set_next_page_token(absl::StrCat(matching[page_size - 1]->rec.number));
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& job_id, const std::string& reason,
                                               const auth::Principal& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!serving_) return absl::UnavailableError("coordinator is not serving (state store error)");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !auth::MaySeeTenant(caller, it->second->rec.tenant))
    return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
  JobRt& job = *it->second;
  if (job.rec.terminal()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " is already ", StateName(job.rec.state), " (nothing to cancel)"));
  }
  std::string why = reason.empty() ? absl::StrCat("cancelled by ", caller.user) : reason;
  Txn txn;
  EndAttempt(job, v1::ATTEMPT_OUTCOME_ABORTED, 0, why,
             static_cast<int64_t>(config_.cancel_grace_s * 1000), txn);
  SetState(job, v1::JOB_STATE_CANCELLED, why, txn, caller.user);
  RETURN_IF_ERROR(CommitLocked(txn));
  return ToProto(job, true);
}

absl::StatusOr<v1::Job> Coordinator::ResumeJob(const std::string& job_id,
                                               const auth::Principal& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!serving_) return absl::UnavailableError("coordinator is not serving (state store error)");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !auth::MaySeeTenant(caller, it->second->rec.tenant))
    return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
  JobRt& job = *it->second;
  if (job.rec.state != v1::JOB_STATE_FAILED && job.rec.state != v1::JOB_STATE_CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " is ", StateName(job.rec.state),
                     "; only FAILED or CANCELLED jobs can be resumed"));
  }
  Txn txn;
  job.rec.failures = 0;
  job.rec.preemptions_budget_used = 0;
  job.rec.finished_ms = 0;
  job.rec.not_before_ms = 0;
  SetState(job, v1::JOB_STATE_PENDING,
           absl::StrCat("resumed by ", caller.user, " from ", CheckpointText(job.rec)), txn,
           caller.user);
  RETURN_IF_ERROR(CommitLocked(txn));
  ScheduleLocked(txn);
  (void)CommitLocked(txn);
  return ToProto(job, true);
}

v1::ListWorkersResponse Coordinator::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListWorkersResponse response;
  const int64_t now = SteadyMs();
  for (auto& [id, w] : workers_) *response.add_workers() = ToProto(*w, now);
  return response;
}

absl::Status Coordinator::WatchJob(const std::string& job_id, const auth::Principal& caller,
                                   JobEventSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !auth::MaySeeTenant(caller, it->second->rec.tenant))
    return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
  JobRt& job = *it->second;
  v1::JobEvent snapshot;
  snapshot.set_job_id(job_id);
  *snapshot.mutable_time() = TimeUtil::MillisecondsToTimestamp(NowMs());
  *snapshot.mutable_snapshot() = ToProto(job, true);
  snapshot.mutable_snapshot()->clear_spec_yaml();
  sink->OnEvent(snapshot);
  if (job.rec.terminal()) {
    sink->OnJobEnded();
  } else {
    job.watchers.insert(sink);
  }
  return absl::OkStatus();
}

void Coordinator::UnwatchJob(const std::string& job_id, JobEventSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second->watchers.erase(sink);
}

absl::Status Coordinator::GetJobLogs(const v1::GetJobLogsRequest& request,
                                     const auth::Principal& caller, LogSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end() || !auth::MaySeeTenant(caller, it->second->rec.tenant)) {
    return absl::NotFoundError(absl::StrCat("job \"", request.job_id(), "\" not found"));
  }
  JobRt& job = *it->second;
  size_t n = request.tail_lines() < 0    ? job.logs.size()
             : request.tail_lines() == 0 ? 100
                                         : static_cast<size_t>(request.tail_lines());
  n = std::min(n, job.logs.size());
  std::vector<v1::LogLine> tail(job.logs.end() - static_cast<std::ptrdiff_t>(n), job.logs.end());
  if (!tail.empty()) sink->OnLines(tail);
  if (!request.follow() || job.rec.terminal()) {
    sink->OnJobEnded();
  } else {
    job.log_followers.insert(sink);
  }
  return absl::OkStatus();
}

void Coordinator::UnfollowLogs(const std::string& job_id, LogSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second->log_followers.erase(sink);
}

// ---------------------------------------------------------------------------
// WorkerService

absl::StatusOr<v1::RegisterResponse> Coordinator::Register(const v1::RegisterRequest& request,
                                                           const auth::Principal& caller) {
  RETURN_IF_ERROR(ValidateRegisterRequest(request));
  if (!auth::MayActAsWorker(caller, request.name())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "name: \"", request.name(), "\" is not the worker ", caller.Describe(),
        " may register (a worker registers the name of its certificate's CN or worker token)"));
  }
  const std::string identity = caller.WorkerIdentity();
  std::lock_guard<std::mutex> lock(mu_);
  if (!serving_) return absl::UnavailableError("coordinator is not serving (state store error)");
  const std::string id = "w-" + request.name();
  auto& slot = workers_[id];
  if (!slot) {
    slot = std::make_unique<WorkerRt>();
    slot->rec.id = id;
    slot->rec.name = request.name();
    slot->rec.registered_ms = NowMs();
    slot->rec.identity = identity;
  }
  WorkerRt& w = *slot;
  if (w.rec.identity != identity) {
    const bool live =
        w.state != v1::WORKER_STATE_LOST &&
        (w.sink != nullptr || SteadyMs() - w.last_seen_steady <
                                  static_cast<int64_t>(config_.heartbeat_timeout_s * 1000));
    if (live) {
      return absl::PermissionDeniedError(absl::StrCat(
          "name: worker \"", request.name(), "\" is live and held by another identity (",
          w.rec.identity, "); it can be taken over only once it is LOST"));
    }
    ULOG(WARNING) << "worker " << request.name() << " taken over by " << identity << " (was "
                  << w.rec.identity << ", not live)";
    w.rec.identity = identity;
  }
  w.rec.node_label = request.node_label().empty() ? request.name() : request.node_label();
  w.rec.device = request.device();
  w.rec.host = request.host();
  w.rec.capacity = std::max(1, request.capacity());
  w.rec.last_seen_ms = NowMs();
  w.last_seen_steady = SteadyMs();
  if (w.state == v1::WORKER_STATE_LOST) w.state = v1::WORKER_STATE_DISCONNECTED;
  w.draining = false;  // A (re)registering worker process takes new work again.
  Txn txn;
  txn.workers.insert(&w);
  bool keep_running = false;
  if (request.has_running()) {
    const v1::WorkRef& ref = request.running().ref();
    auto jt = jobs_.find(ref.job_id());
    JobRt* job = jt == jobs_.end() ? nullptr : jt->second.get();
    AttemptRecord* attempt = job ? job->rec.current_attempt() : nullptr;
    if (attempt != nullptr && !attempt->ended() && attempt->generation == ref.generation() &&
        ref.rank() >= 0 && ref.rank() < static_cast<int>(attempt->worker_ids.size()) &&
        attempt->worker_ids[ref.rank()] == id) {
      keep_running = true;
      w.assigned = ref;
      if (job->awaiting_reconnect) {
        job->reconnected_ranks.insert(ref.rank());
        if (job->reconnected_ranks.size() == attempt->worker_ids.size()) {
          job->awaiting_reconnect = false;
          job->reconnected_ranks.clear();
          job->started_ranks.clear();
          for (size_t r = 0; r < attempt->worker_ids.size(); ++r) {
            job->started_ranks.insert(static_cast<int>(r));
          }
          SetState(
              *job, v1::JOB_STATE_RUNNING,
              absl::StrCat("recovered after coordinator restart: all ", attempt->worker_ids.size(),
                           " ranks reconnected (generation ", attempt->generation, ")"),
              txn);
        }
      }
    } else {
      v1::CoordinatorMessage msg;
      *msg.mutable_abort()->mutable_ref() = ref;
      msg.mutable_abort()->set_reason(absl::StrCat("generation ", ref.generation(), " of ",
                                                   ref.job_id(), " is no longer current"));
      msg.mutable_abort()->set_grace_period_ms(static_cast<int64_t>(config_.abort_grace_s * 1000));
      SendTo(w, std::move(msg), txn);
    }
  } else if (w.assigned) {
    // The worker came back without the child we assigned: that rank is gone.
    v1::WorkRef ref = *w.assigned;
    w.assigned.reset();
    auto jt = jobs_.find(ref.job_id());
    if (jt != jobs_.end()) {
      JobRt& job = *jt->second;
      AttemptRecord* attempt = job.rec.current_attempt();
      if (attempt != nullptr && !attempt->ended() && attempt->generation == ref.generation()) {
        std::string reason = absl::StrCat("worker ", w.rec.name, " (rank ", ref.rank(),
                                          ") restarted without its rank");
        if (job.awaiting_reconnect) {
          EndAttempt(job, v1::ATTEMPT_OUTCOME_ABORTED, 0, reason,
                     static_cast<int64_t>(config_.abort_grace_s * 1000), txn);
          job.rec.restarts++;
          if (metrics_->restarts) {
            metrics_->restarts->WithLabels({"coordinator_restart"})->Increment();
          }
          SetState(job, v1::JOB_STATE_RECOVERING,
                   absl::StrCat(reason, "; restarting from ", CheckpointText(job.rec)), txn);
        } else {
          OnRankFailure(job, v1::ATTEMPT_OUTCOME_LOST, -1, reason, "worker_lost", txn);
        }
      }
    }
  }
  if (w.sink != nullptr) {
    w.state = w.assigned ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_IDLE;
  }
  RETURN_IF_ERROR(CommitLocked(txn));
  v1::RegisterResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_interval_ms(static_cast<int64_t>(config_.heartbeat_interval_s * 1000));
  response.set_heartbeat_timeout_ms(static_cast<int64_t>(config_.heartbeat_timeout_s * 1000));
  response.set_keep_running(keep_running);
  return response;
}

absl::StatusOr<uint64_t> Coordinator::OpenSession(const std::string& worker_id,
                                                  const auth::Principal& caller, WorkerSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker \"", worker_id, "\" is not registered (call Register first)"));
  }
  WorkerRt& w = *it->second;
  if (w.rec.identity != caller.WorkerIdentity()) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker \"", worker_id, "\" was registered by another identity (",
                     w.rec.identity, "); ", caller.Describe(), " cannot open its session"));
  }
  if (w.state == v1::WORKER_STATE_LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker \"", worker_id, "\" was declared lost; call Register again"));
  }
  if (w.sink != nullptr) w.sink->Close(absl::AbortedError("superseded by a newer session"));
  w.sink = sink;
  w.session = next_session_id_++;
  w.last_seen_steady = SteadyMs();
  w.state = w.assigned ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_IDLE;
  for (v1::CoordinatorMessage& m : w.pending) sink->Send(m);
  w.pending.clear();
  Txn txn;
  ScheduleLocked(txn);
  (void)CommitLocked(txn);
  return w.session;
}

void Coordinator::CloseSession(const std::string& worker_id, uint64_t session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second->session != session_id) return;
  WorkerRt& w = *it->second;
  w.sink = nullptr;
  w.session = 0;
  if (w.state != v1::WORKER_STATE_LOST) w.state = v1::WORKER_STATE_DISCONNECTED;
}

void Coordinator::OnWorkerMessage(const std::string& worker_id, uint64_t session_id,
                                  const v1::WorkerMessage& message) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second->session != session_id) return;
  WorkerRt& w = *it->second;
  w.last_seen_steady = SteadyMs();
  Txn txn;
  HandleWorkMessage(w, message, txn);
  if (message.has_exited() || message.has_heartbeat()) {
    if (message.has_exited() || !w.assigned) ScheduleLocked(txn);
  }
  (void)CommitLocked(txn);
}

namespace {

// How an Ack tells the worker what became of its message.
v1::AckCode AckCodeFor(const absl::Status& status) {
  if (status.ok()) return v1::ACK_CODE_OK;
  if (absl::IsFailedPrecondition(status)) return v1::ACK_CODE_STALE;
  return v1::ACK_CODE_INVALID;
}

}  // namespace

Coordinator::JobRt* Coordinator::Fence(const v1::WorkRef& ref, absl::Status* error) {
  auto it = jobs_.find(ref.job_id());
  if (it == jobs_.end()) {
    *error = absl::FailedPreconditionError(absl::StrCat("unknown job \"", ref.job_id(), "\""));
    return nullptr;
  }
  JobRt& job = *it->second;
  if (ref.generation() != job.rec.generation) {
    *error = absl::FailedPreconditionError(
        absl::StrCat("stale generation ", ref.generation(), " of ", ref.job_id(),
                     " (current generation is ", job.rec.generation, ")"));
    return nullptr;
  }
  return &job;
}

void Coordinator::HandleWorkMessage(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  auto ack = [&](const absl::Status& status) {
    v1::CoordinatorMessage msg;
    msg.mutable_ack()->set_seq(m.seq());
    msg.mutable_ack()->set_result(AckCodeFor(status));
    msg.mutable_ack()->set_message(std::string(status.message()));
    SendTo(w, std::move(msg), txn);
  };
  // A rejected message is dropped (nothing about its job changes), answered with an
  // error Ack and counted.
  auto reject = [&](const absl::Status& status, const std::string& reason) {
    if (metrics_->rejected_reports) metrics_->rejected_reports->WithLabels({reason})->Increment();
    ack(status);
  };
  auto abort_ref = [&](const v1::WorkRef& ref, const std::string& why) {
    v1::CoordinatorMessage msg;
    *msg.mutable_abort()->mutable_ref() = ref;
    msg.mutable_abort()->set_reason(why);
    msg.mutable_abort()->set_grace_period_ms(static_cast<int64_t>(config_.abort_grace_s * 1000));
    SendTo(w, std::move(msg), txn);
  };
  // Fences a work report: the job's current generation, the rank this worker holds,
  // and a live attempt. Rejections are acked with FAILED_PRECONDITION and the stray
  // child is aborted.
  auto fence_live = [&](const v1::WorkRef& ref) -> JobRt* {
    absl::Status error;
    JobRt* job = Fence(ref, &error);
    if (job != nullptr) {
      AttemptRecord* a = job->rec.current_attempt();
      if (a == nullptr || a->ended()) {
        error = absl::FailedPreconditionError(
            absl::StrCat("generation ", ref.generation(), " of ", ref.job_id(), " has ended",
                         a ? absl::StrCat(" (", a->reason, ")") : ""));
        job = nullptr;
      } else if (ref.rank() < 0 || ref.rank() >= static_cast<int>(a->worker_ids.size()) ||
                 a->worker_ids[ref.rank()] != w.rec.id) {
        error = absl::FailedPreconditionError(
            absl::StrCat("rank ", ref.rank(), " of ", ref.job_id(), " generation ",
                         ref.generation(), " is not assigned to ", w.rec.id));
        job = nullptr;
      }
    }
    if (job == nullptr) {
      reject(error, "stale");
      abort_ref(ref, std::string(error.message()));
    }
    return job;
  };

  // Bounds first (validation.h), against the stages of the job the message names.
  const v1::WorkRef* named_ref = WorkRefOf(m);
  auto named = named_ref == nullptr ? jobs_.end() : jobs_.find(named_ref->job_id());
  absl::Status invalid = ValidateWorkerMessage(
      m, named == jobs_.end() ? absl::Span<const StageRecord>() : named->second->rec.stages);
  if (!invalid.ok()) {
    reject(invalid, InvalidReason(m));
    return;
  }

  switch (m.kind_case()) {
    case v1::WorkerMessage::kHeartbeat: {
      const v1::Heartbeat& hb = m.heartbeat();
      if (!hb.has_running() && w.assigned) {
        // Idle while we think it runs something: trust it only for ended attempts.
        auto jt = jobs_.find(w.assigned->job_id());
        const AttemptRecord* a = jt == jobs_.end() ? nullptr : jt->second->rec.current_attempt();
        if (a == nullptr || a->ended() || a->generation != w.assigned->generation()) {
          w.assigned.reset();
        }
      } else if (hb.has_running()) {
        const v1::WorkRef& ref = hb.running().ref();
        auto jt = jobs_.find(ref.job_id());
        const AttemptRecord* a = jt == jobs_.end() ? nullptr : jt->second->rec.current_attempt();
        bool live = a != nullptr && !a->ended() && a->generation == ref.generation();
        if (!live) abort_ref(ref, "generation is no longer current");
      }
      if (w.state != v1::WORKER_STATE_LOST) {
        w.state = w.assigned ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_IDLE;
      }
      if (hb.request_ack()) ack(absl::OkStatus());
      return;
    }
    case v1::WorkerMessage::kStarted:
    case v1::WorkerMessage::kProgress: {
      const v1::WorkRef& ref = m.has_started() ? m.started().ref() : m.progress().ref();
      JobRt* job = fence_live(ref);
      if (job == nullptr) return;
      job->started_ranks.insert(ref.rank());
      StageRecord& stage = job->rec.stages[job->rec.stage_index];
      if (m.has_progress()) {
        const v1::StepProgress& p = m.progress().progress();
        if (p.step() >= stage.step) {
          stage.step = p.step();
          stage.loss = p.loss();
          stage.tokens_per_s = p.tokens_per_s();
          job->rec.loss = p.loss();
          job->progress_dirty = true;
        }
        if (ref.rank() == 0) {
          if (metrics_->loss) metrics_->loss->WithLabels({job->rec.id})->Set(p.loss());
          if (metrics_->tokens_per_s) {
            metrics_->tokens_per_s->WithLabels({job->rec.id})->Set(p.tokens_per_s());
          }
          if (metrics_->step) metrics_->step->WithLabels({job->rec.id})->Set(p.step());
          const int64_t now = SteadyMs();
          if (metrics_->tokens && job->last_progress_steady > 0 &&
              job->last_progress_generation == ref.generation()) {
            double dt = std::min(60.0, (now - job->last_progress_steady) / 1000.0);
            metrics_->tokens->WithLabels({job->rec.id})->Increment(p.tokens_per_s() * dt);
          }
          job->last_progress_steady = now;
          job->last_progress_generation = ref.generation();
          v1::JobEvent ev;
          v1::StepProgress* sp = ev.mutable_progress();
          *sp = p;
          sp->set_stage(ref.stage());
          if (sp->steps() <= 0) sp->set_steps(stage.steps);
          if (sp->seq_len() <= 0) sp->set_seq_len(stage.seq_len);
          AddEvent(*job, std::move(ev), /*persist=*/false, txn);
        }
      }
      if (job->rec.state == v1::JOB_STATE_SCHEDULING &&
          job->started_ranks.size() == static_cast<size_t>(stage.world())) {
        SetState(*job, v1::JOB_STATE_RUNNING,
                 absl::StrCat("all ", stage.world(), " ranks of stage ", stage.index,
                              " running (generation ", job->rec.generation, ")"),
                 txn);
      }
      return;
    }
    case v1::WorkerMessage::kLogs: {
      const v1::LogBatch& b = m.logs();
      auto jt = jobs_.find(b.ref().job_id());
      if (jt == jobs_.end()) return;
      JobRt& job = *jt->second;
      std::vector<v1::LogLine> batch;
      for (const v1::LogLine& l : b.lines()) {
        v1::LogLine line = l;
        if (line.text().size() > kMaxLogLineBytes) {
          line.set_text(TruncateText(l.text(), kMaxLogLineBytes));
        }
        line.set_worker_id(w.rec.id);
        line.set_rank(b.ref().rank());
        line.set_generation(b.ref().generation());
        if (line.stream() == v1::LOG_STREAM_UNSPECIFIED) line.set_stream(v1::LOG_STREAM_STDERR);
        AddLogLocked(job, std::move(line), &batch);
      }
      for (LogSink* s : job.log_followers) s->OnLines(batch);
      return;
    }
    case v1::WorkerMessage::kCheckpoint: {
      const v1::WorkRef& c_ref = m.checkpoint().ref();
      const v1::Checkpoint& c = m.checkpoint().checkpoint();
      absl::Status error;
      JobRt* job = Fence(c_ref, &error);
      if (job == nullptr) {
        reject(error, "stale");
        return;
      }
      const auto& last = job->rec.last_checkpoint;
      if (!last || last->stage != c_ref.stage() || last->step != c.step()) {
        CheckpointRecord rec;
        rec.job_id = job->rec.id;
        rec.generation = c_ref.generation();
        rec.stage = c_ref.stage();
        rec.step = c.step();
        rec.path = c.path();
        rec.bytes = c.bytes();
        rec.seconds = c.seconds();
        rec.committed_ms = NowMs();
        job->rec.last_checkpoint = rec;
        txn.batch.checkpoints.push_back(rec);
        txn.jobs.insert(job);
        if (metrics_->checkpoint_seconds)
          metrics_->checkpoint_seconds->WithLabels()->Observe(c.seconds());
        if (metrics_->checkpoint_bytes) {
          metrics_->checkpoint_bytes->WithLabels({job->rec.id})
              ->Set(static_cast<double>(c.bytes()));
        }
        v1::JobEvent ev;
        *ev.mutable_checkpoint() = coordinator::ToProto(rec);
        AddEvent(*job, std::move(ev), true, txn);
      }
      ack(absl::OkStatus());
      return;
    }
    case v1::WorkerMessage::kEval: {
      const v1::EvalResult& e = m.eval().result();
      JobRt* job = fence_live(m.eval().ref());
      if (job == nullptr) return;
      int idx = m.eval().ref().stage();
      if (idx >= 0 && idx < static_cast<int>(job->rec.stages.size())) {
        StageRecord& stage = job->rec.stages[idx];
        stage.eval_loss = e.loss();
        stage.eval_accuracy = e.accuracy();
        stage.eval_seq_len = e.seq_len();
      }
      v1::JobEvent ev;
      *ev.mutable_eval() = e;
      ev.mutable_eval()->set_stage(idx);
      AddEvent(*job, std::move(ev), true, txn);
      return;
    }
    case v1::WorkerMessage::kPreempting: {
      w.draining = true;
      JobRt* job = fence_live(m.preempting().ref());
      if (job == nullptr) return;
      if (job->rec.state == v1::JOB_STATE_RUNNING || job->rec.state == v1::JOB_STATE_SCHEDULING) {
        SetState(*job, v1::JOB_STATE_CHECKPOINTING,
                 absl::StrCat("rank ", m.preempting().ref().rank(),
                              " got SIGTERM; writing a preemption checkpoint"),
                 txn);
      }
      return;
    }
    case v1::WorkerMessage::kExited: {
      const v1::AttemptExited& x = m.exited();
      const v1::WorkRef& ref = x.ref();
      if (w.assigned && w.assigned->job_id() == ref.job_id() &&
          w.assigned->generation() == ref.generation()) {
        w.assigned.reset();
        if (w.state == v1::WORKER_STATE_BUSY) w.state = v1::WORKER_STATE_IDLE;
      }
      absl::Status error;
      JobRt* job = Fence(ref, &error);
      if (job == nullptr) {
        reject(error, "stale");
        return;
      }
      ack(absl::OkStatus());
      AttemptRecord* a = job->rec.current_attempt();
      if (a == nullptr || a->ended()) return;  // Already ended (aborted, cancelled).
      if (ref.rank() < 0 || ref.rank() >= static_cast<int>(a->worker_ids.size()) ||
          a->worker_ids[ref.rank()] != w.rec.id) {
        return;
      }
      std::string detail =
          x.error_message().empty()
              ? ""
              : absl::StrCat(": ", TruncateText(x.error_message(), kMaxReasonBytes));
      const contract::StopRequest stop = x.aborted()     ? contract::StopRequest::kAbort
                                         : x.preempted() ? contract::StopRequest::kPreempt
                                                         : contract::StopRequest::kNone;
      const std::string how = x.signal() != 0 ? absl::StrCat("was killed by signal ", x.signal())
                                              : absl::StrCat("exited ", x.exit_code());
      switch (contract::OutcomeOf(contract::ProcessExit{x.exit_code(), x.signal()}, stop)) {
        case contract::RankOutcome::kSucceeded:
          job->done_ranks.insert(ref.rank());
          if (job->done_ranks.size() == a->worker_ids.size()) CompleteStage(*job, txn);
          break;
        case contract::RankOutcome::kPreempted:
          OnRankPreempted(*job, ref.rank(), x.exit_code(), how, txn);
          break;
        case contract::RankOutcome::kBadInput:
          OnRankFailure(*job, v1::ATTEMPT_OUTCOME_BAD_INPUT, x.exit_code(),
                        absl::StrCat("rank ", ref.rank(), " rejected its input (exit ",
                                     contract::kExitBadInput, ")", detail),
                        "bad_input", txn);
          break;
        case contract::RankOutcome::kFailed:
        case contract::RankOutcome::kAborted:  // Its worker stopped it; this attempt needs it.
          OnRankFailure(*job, v1::ATTEMPT_OUTCOME_FAILED, x.exit_code(),
                        absl::StrCat("rank ", ref.rank(), " ", how, detail), "rank_failed", txn);
          break;
      }
      return;
    }
    case v1::WorkerMessage::kHello:
    case v1::WorkerMessage::KIND_NOT_SET:
      reject(absl::InvalidArgumentError("unexpected message kind on an open session"),
             "unexpected_kind");
      return;
  }
}

// ---------------------------------------------------------------------------
// Views and metrics

v1::Job Coordinator::ToProto(const JobRt& job, bool full) const {
  const JobRecord& r = job.rec;
  v1::Job p;
  p.set_id(r.id);
  p.set_name(r.name);
  p.set_owner(r.owner);
  p.set_tenant(r.tenant);
  p.set_state(r.state);
  p.set_reason(r.reason);
  SetTime(r.created_ms, p.mutable_created_at());
  SetTime(r.started_ms, p.mutable_started_at());
  SetTime(r.finished_ms, p.mutable_finished_at());
  SetTime(r.state_entered_ms, p.mutable_state_entered_at());
  p.set_priority(r.priority);
  p.set_stage_index(r.stage_index);
  for (const StageRecord& s : r.stages) {
    v1::StageStatus* st = p.add_stages();
    st->set_index(s.index);
    st->set_state(s.state);
    st->set_seq_len(s.seq_len);
    st->set_steps(s.steps);
    st->set_sp(s.sp);
    st->set_dp(s.dp);
    if (s.step > 0) {
      v1::StepProgress* p = st->mutable_progress();
      p->set_stage(s.index);
      p->set_step(s.step);
      p->set_steps(s.steps);
      p->set_loss(s.loss);
      p->set_tokens_per_s(s.tokens_per_s);
      p->set_seq_len(s.seq_len);
    }
    if (s.eval_seq_len > 0) {
      v1::EvalResult* e = st->mutable_eval();
      e->set_stage(s.index);
      e->set_seq_len(s.eval_seq_len);
      e->set_loss(s.eval_loss);
      e->set_accuracy(s.eval_accuracy);
    }
    st->set_attempts(s.attempts);
    SetTime(s.started_ms, st->mutable_started_at());
    SetTime(s.finished_ms, st->mutable_finished_at());
  }
  p.set_restarts(r.restarts);
  p.set_preemptions(r.preemptions);
  p.set_failures(r.failures);
  if (r.last_checkpoint) *p.mutable_last_checkpoint() = coordinator::ToProto(*r.last_checkpoint);
  p.set_loss(r.loss);
  if (full) {
    for (const AttemptRecord& a : r.attempts) *p.add_attempts() = coordinator::ToProto(a);
  }
  p.set_generation(r.generation);
  p.set_spec_yaml(r.spec_yaml);
  p.set_checkpoint_dir(r.checkpoint_dir);
  p.set_max_failures(r.max_failures);
  p.set_max_preemptions(r.max_preemptions);
  p.set_node_label(r.node_label);
  return p;
}

v1::Worker Coordinator::ToProto(const WorkerRt& w, int64_t now_steady_ms) const {
  v1::Worker p;
  p.set_id(w.rec.id);
  p.set_name(w.rec.name);
  p.set_node_label(w.rec.node_label);
  p.set_device(w.rec.device);
  p.set_host(w.rec.host);
  p.set_capacity(w.rec.capacity);
  p.set_state(w.state);
  p.set_draining(w.draining);
  if (w.assigned) *p.mutable_running()->mutable_ref() = *w.assigned;
  SetTime(w.rec.registered_ms, p.mutable_registered_at());
  const int64_t age_ms = std::max<int64_t>(0, now_steady_ms - w.last_seen_steady);
  SetTime(NowMs() - age_ms, p.mutable_last_heartbeat_at());
  p.set_heartbeat_age_seconds(age_ms / 1000.0);
  return p;
}

std::vector<metrics::CallbackSample> Coordinator::CountJobsByState() {
  std::map<int, int> counts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, j] : jobs_) counts[j->rec.state]++;
  }
  std::vector<metrics::CallbackSample> out;
  for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
    std::string name = StateName(static_cast<v1::JobState>(s));
    for (char& c : name) c = static_cast<char>(std::tolower(c));
    out.push_back({{name}, static_cast<double>(counts[s])});
  }
  return out;
}

std::vector<metrics::CallbackSample> Coordinator::CountWorkersByState() {
  std::map<int, int> counts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, w] : workers_) counts[w->state]++;
  }
  std::vector<metrics::CallbackSample> out;
  for (int s = v1::WORKER_STATE_IDLE; s <= v1::WORKER_STATE_LOST; ++s) {
    std::string name = v1::WorkerState_Name(static_cast<v1::WorkerState>(s)).substr(13);
    for (char& c : name) c = static_cast<char>(std::tolower(c));
    out.push_back({{name}, static_cast<double>(counts[s])});
  }
  return out;
}

std::vector<metrics::CallbackSample> Coordinator::HeartbeatAges() {
  std::vector<metrics::CallbackSample> out;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = SteadyMs();
  for (auto& [id, w] : workers_) {
    if (w->state == v1::WORKER_STATE_LOST) continue;
    out.push_back({{id}, std::max<int64_t>(0, now - w->last_seen_steady) / 1000.0});
  }
  return out;
}

double Coordinator::QueueLength() {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (auto& [id, j] : jobs_) {
    if (IsQueued(j->rec.state)) ++n;
  }
  return n;
}

}  // namespace ulysses::coordinator
