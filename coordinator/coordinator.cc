#include "coordinator/coordinator.h"

#include "common/private_file.h"
#include "coordinator/state_lock.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/deferred_writes.h"
#include "coordinator/path_policy.h"

namespace ulysses::coordinator {

Coordinator::Coordinator(CoordinatorConfig config, std::unique_ptr<Store> store,
                         metrics::Registry* registry)
    : config_(std::move(config)),
      metrics_(
          CoordinatorMetrics::Register(registry, [this](CountsPart part) { return Counts(part); })),
      store_(std::move(store)),
      machine_(config_, *metrics_, state_),
      protocol_(config_, *metrics_, state_, machine_) {
  metrics_->SetSettings(config_.heartbeat_timeout_s, config_.cancel_grace_s);
  metrics_->SetHeartbeatInterval(config_.heartbeat_interval_s);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(const CoordinatorConfig& config,
                                                                 metrics::Registry* registry) {
  // One coordinator per state dir (state_lock.h), owner-only.
  if (absl::Status s = EnsurePrivateDir(config.state_dir); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("state ", s.message()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StateDirLock> state_lock,
                   StateDirLock::Acquire(config.state_dir, "ulysses-coordinator"));
  StoreOptions options;
  options.events_per_job = config.event_history;
  // state_max_bytes bounds everything the coordinator stores: the logs' files get a quarter,
  // the database the rest.
  const int64_t log_share = config.state_max_bytes / 4;
  options.max_bytes = config.state_max_bytes - log_share;
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(config.state_dir, options));
  std::unique_ptr<Coordinator> c(new Coordinator(config, std::move(store), registry));
  {
    absl::MutexLock lock(&c->mu_);
    c->state_lock_ = std::move(state_lock);
    c->log_files_ = std::make_unique<JobLogFiles>(config.state_dir + "/logs",
                                                  config.log_file_bytes_per_job, log_share);
  }
  RETURN_IF_ERROR(c->Recover());
  return c;
}

Coordinator::~Coordinator() { Shutdown(); }

absl::Status Coordinator::Recover() {
  LockDeferringWrites lock(&mu_);
  ASSIGN_OR_RETURN(Store::Snapshot snap, store_->Load());
  // Never an id the store or the checkpoint root has seen: a store restored from an older
  // backup has a lower high-water mark, but <root>/job-N of the jobs after it are on disk.
  state_.next_job_number =
      std::max(snap.max_job_number, HighestJobNumberUnder(config_.checkpoint_root)) + 1;
  for (CheckpointDirRecord& d : snap.checkpoint_dirs) state_.checkpoint_dirs[d.path] = d;
  const int64_t now = SteadyMs();
  // Workers known before the restart get reconnect_window_s (when longer than
  // lost_after_s) to come back before they are declared LOST.
  const int64_t grace_ms =
      static_cast<int64_t>((config_.reconnect_window_s - config_.lost_after_s) * 1000);
  for (WorkerRecord& w : snap.workers) {
    auto rt = std::make_unique<WorkerRt>();
    rt->rec = std::move(w);
    rt->last_seen_steady = now + std::max<int64_t>(0, grace_ms);
    state_.workers[rt->rec.id] = std::move(rt);
  }
  Txn txn;
  for (JobRecord& j : snap.jobs) {
    auto rt = std::make_unique<JobRt>();
    rt->rec = std::move(j);
    JobRt& job = *rt;
    if (!job.rec.checkpoint_dir.empty() && !state_.checkpoint_dirs.count(job.rec.checkpoint_dir)) {
      // A job from before schema 7 (no checkpoint_dirs row): its directory is recorded now, so
      // it stays its tenant's after the job is deleted.
      CheckpointDirRecord d{job.rec.checkpoint_dir, job.rec.tenant, job.rec.id, job.rec.number,
                            job.rec.created_ms};
      state_.checkpoint_dirs[d.path] = d;
      txn.batch.checkpoint_dirs.push_back(d);
    }
    ASSIGN_OR_RETURN(std::vector<EventRecord> events,
                     store_->LoadEvents(job.rec.id, static_cast<int>(config_.event_history)));
    for (const EventRecord& e : events) {
      v1::JobEvent ev;
      if (ev.ParseFromString(e.payload)) KeepEvent(job, std::move(ev), config_.event_history);
      job.next_event_seq = e.sequence + 1;
    }
    // The job's log lines from before the restart (job_log_files.h).
    machine_.RestoreLogs(job, log_files_->Load(job.rec.id));
    if (!job.rec.request_id.empty()) state_.job_by_request[job.rec.request_id] = job.rec.id;
    state_.jobs[job.rec.id] = std::move(rt);
    AttemptRecord* attempt = job.rec.current_attempt();
    if (job.rec.terminal() || attempt == nullptr || attempt->ended()) {
      if (IsQueued(job.rec.state)) job.queued_since_steady = now;
      continue;
    }
    job.awaiting_reconnect = true;
    job.reconnect_deadline_steady = now + static_cast<int64_t>(config_.reconnect_window_s * 1000);
    for (size_t r = 0; r < attempt->worker_ids.size(); ++r) {
      WorkerRt* w = state_.FindWorker(attempt->worker_ids[r]);
      if (w == nullptr) continue;
      v1::WorkRef ref;
      ref.set_job_id(job.rec.id);
      ref.set_generation(job.rec.generation);
      ref.set_rank(static_cast<int>(r));
      ref.set_stage(attempt->stage);
      w->slots[r < attempt->slots.size() ? attempt->slots[r] : 0] = ref;
    }
    machine_.SetState(job, v1::JOB_STATE_RECOVERING,
                      absl::StrCat("coordinator restarted; waiting up to ",
                                   config_.reconnect_window_s, "s for ", attempt->worker_ids.size(),
                                   " workers to reconnect (generation ", job.rec.generation, ")"),
                      txn);
  }
  RETURN_IF_ERROR(CommitLocked(txn));
  std::vector<std::string> known;  // Sorted: state_.jobs is a map.
  for (const auto& [id, job] : state_.jobs) known.push_back(id);
  if (const int stray = log_files_->RemoveExcept(known); stray > 0) {
    ULOG(INFO) << "removed the log files of " << stray << " jobs the store does not hold";
  }
  serving_ = true;
  ULOG(INFO) << "coordinator state recovered from " << store_->path() << ": " << state_.jobs.size()
             << " jobs, " << state_.workers.size() << " workers";
  return absl::OkStatus();
}

void Coordinator::Start() {
  absl::MutexLock lock(&ticker_mu_);
  if (ticker_.joinable() || stop_) return;
  last_tick_ms_ = SteadyMs();
  ticker_ = std::thread([this] { TickerLoop(); });
}

void Coordinator::Shutdown() {
  {
    absl::MutexLock lock(&ticker_mu_);
    stop_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
  LockDeferringWrites lock(&mu_);
  for (auto& [id, w] : state_.workers) {
    if (w->sink != nullptr) {
      w->sink->Close(absl::UnavailableError("coordinator shutting down"));
      w->sink = nullptr;
      w->session = 0;
    }
  }
  for (auto& [id, j] : state_.jobs) {
    for (JobEventSink* s : j->watchers) s->OnJobEnded();
    for (LogSink* s : j->log_followers) s->OnJobEnded();
    j->watchers.clear();
    j->log_followers.clear();
  }
  state_lock_.reset();  // Another coordinator (or a restore) may take the directory now.
}

void Coordinator::TickerLoop() {
  absl::MutexLock lock(&ticker_mu_);
  while (!stop_) {
    ticker_mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
    if (stop_) break;
    ticker_mu_.Unlock();
    const int64_t now = SteadyMs();
    const bool scan_workers = now - last_worker_scan_ms_ >= WorkerScanMs();
    if (scan_workers) last_worker_scan_ms_ = now;
    Tick(scan_workers);  // Its aborts, assignments, events: written after mu_ is released.
    last_tick_ms_ = SteadyMs();
    ticker_mu_.Lock();
  }
}

void Coordinator::TickForTesting() {
  LockDeferringWrites lock(&mu_);
  if (!serving_) ProbeStoreLocked();
  Txn txn;
  // A pass whether or not the ticker would have run one now.
  TickLocked(txn, /*scan_workers=*/true, /*force_pass=*/true);
  (void)CommitLocked(txn);
}

int64_t Coordinator::WorkerScanMs() const {
  return std::clamp<int64_t>(static_cast<int64_t>(config_.heartbeat_timeout_s * 100), 100, 1000);
}

void Coordinator::Tick(bool scan_workers) {
  LockDeferringWrites lock(&mu_);
  if (!serving_) ProbeStoreLocked();
  Txn txn;
  TickLocked(txn, scan_workers);
  (void)CommitLocked(txn);
}

void Coordinator::TickLocked(Txn& txn, bool scan_workers, bool force_pass) {
  const int64_t now = SteadyMs();
  tenant_bytes_ = TenantBytesLocked();
  // First, before any pointer to a worker enters txn.
  if (scan_workers) machine_.ExpireLostWorkers(now, txn);
  machine_.ExpireEndedJobs(NowMs(), txn);
  const int64_t lost_ms = static_cast<int64_t>(config_.lost_after_s * 1000);
  int64_t live_workers = 0;
  for (auto& [id, w] : state_.workers) {
    if (!scan_workers) break;
    if (w->state == v1::WORKER_STATE_LOST) continue;
    ++live_workers;
    int64_t age = now - w->last_seen_steady;
    if (age > lost_ms) {
      machine_.OnWorkerLost(*w,
                            absl::StrFormat("no message for %.1fs (lost_after_s %g)", age / 1000.0,
                                            config_.lost_after_s),
                            txn);
    } else if (age > SuspectAfterMs(config_, w->told_heartbeat_interval_ms)) {
      machine_.OnWorkerSuspect(*w, age, txn);
    }
  }
  if (scan_workers) {
    // The cluster's size sets the heartbeat interval asked for (max_heartbeats_per_s).
    const double interval_s = HeartbeatIntervalFor(config_, live_workers);
    protocol_.set_heartbeat_interval_ms(static_cast<int64_t>(interval_s * 1000));
    metrics_->SetHeartbeatInterval(interval_s);
  }
  for (auto& [id, j] : state_.jobs) {
    JobRt& job = *j;
    machine_.CheckReconnectDeadline(job, now, txn);
    machine_.SettleGoodput(job, txn);
    if (job.progress_dirty && now - job.last_flush_steady >= 1000) {
      job.progress_dirty = false;
      job.last_flush_steady = now;
      txn.jobs.insert(&job);
    }
  }
  if (force_pass) {
    SchedulePassLocked(txn);
  } else {
    MaybeScheduleLocked(txn, now);
  }
}

void Coordinator::MaybeScheduleLocked(Txn& txn, int64_t now) {
  // At 25,000 nodes with 10,000 queued jobs a pass takes ~80 ms (bench/schedule_pass):
  // run inline per event, a reconnect storm or a large job's rank exits (one per rank)
  // would be tens of minutes of passes. Asked-for passes wait max(50 ms, 4 x the last pass) after
  // the previous one (at most ~20 % of a core); a queued job's backoff ending is asked
  // for by the clock; every max(50 ms, 20 x the last pass) one runs regardless, a
  // backstop for a state change that asked for none (every tick on a small cluster).
  const int64_t since = now - last_pass_end_steady_;
  const bool asked = schedule_requested_ || machine_.next_backoff_end_ms() <= NowMs();
  if ((asked && since >= std::max<int64_t>(50, 4 * last_pass_cost_ms_)) ||
      since >= std::max<int64_t>(50, 20 * last_pass_cost_ms_)) {
    SchedulePassLocked(txn);
  }
}

void Coordinator::SchedulePassLocked(Txn& txn) {
  const int64_t start = SteadyMs();
  const absl::Time t0 = absl::Now();
  machine_.Schedule(txn);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  if (metrics_->scheduling_pass != nullptr) {
    metrics_->scheduling_pass->WithLabels()->Observe(seconds);
  }
  schedule_requested_ = false;
  last_pass_end_steady_ = SteadyMs();
  last_pass_cost_ms_ = last_pass_end_steady_ - start;
}

void Coordinator::ProbeStoreLocked() {
  if (store_->writable()) return;  // Not a store failure (still recovering at start).
  absl::Status probe = store_->Probe();
  if (!probe.ok()) return;  // Still failing: stay NOT_SERVING, try again next tick.
  metrics_->SetStoreWritable(true);
  serving_ = true;
  ULOG(INFO) << "state store " << store_->path() << " accepts writes again; serving";
}

absl::Status Coordinator::LivenessAt(int64_t now_ms, int64_t stall_ms) const {
  const int64_t last = last_tick_ms_.load();
  if (last == 0) return absl::UnavailableError("coordinator: the ticker has not started");
  if (now_ms - last > stall_ms) {
    return absl::UnavailableError(absl::StrCat("coordinator: no tick completed for ",
                                               (now_ms - last) / 1000, " s (limit ",
                                               stall_ms / 1000, " s): the scheduling loop hangs"));
  }
  return absl::OkStatus();
}

std::string Coordinator::health_reason() const {
  LockDeferringWrites lock(&mu_);
  if (serving_) return "";
  const absl::Status& reason = store_->read_only_reason();
  return reason.ok() ? std::string("starting") : std::string(reason.message());
}

absl::Status Coordinator::CheckServingLocked() const {
  if (!serving_) return absl::UnavailableError("coordinator is not serving (state store error)");
  return absl::OkStatus();
}

absl::Status Coordinator::CommitLocked(Txn& txn) {
  for (JobRt* j : txn.jobs) txn.batch.jobs.push_back(j->rec);
  for (WorkerRt* w : txn.workers) txn.batch.workers.push_back(w->rec);
  absl::Status s = store_->Write(txn.batch);
  if (!s.ok() && !store_->writable()) {
    // Nothing of txn is durable or was sent: undo its in-memory changes, so that memory
    // equals the store when writes work again (ProbeStoreLocked, every tick).
    if (serving_.exchange(false)) {
      ULOG(ERROR) << s << "; coordinator is NOT_SERVING until a probe write succeeds";
      metrics_->CountStoreWriteError("io");
    }
    metrics_->SetStoreWritable(false);
    RestoreLocked(txn);
    txn = Txn();
    return absl::UnavailableError(std::string(s.message()));
  }
  if (!s.ok()) {
    metrics_->CountStoreWriteError("refused");
    // The store refused this change's data (a bug: validation should have caught it).
    // Only this request fails: its in-memory changes are undone, nothing is sent.
    ULOG(ERROR) << s << "; the change was undone (please report this bug)";
    RestoreLocked(txn);
    txn = Txn();
    return absl::InternalError(absl::StrCat(s.message(), "; the change was undone"));
  }
  // Durable: now the side effects, still under mu_ so that every stream sees them in
  // the order of the commits (sinks only enqueue).
  if (log_files_ != nullptr) {
    // A tenant at its byte quota keeps its new lines in memory only (tenant_bytes_: counted
    // at each tick, plus what was written since).
    log_files_->Append(txn.log_files, [this](const std::string& job_id, int64_t bytes) {
      mu_.AssertHeld();
      auto job = state_.jobs.find(job_id);
      if (job == state_.jobs.end()) return true;
      const std::string& tenant = job->second->rec.tenant;
      const int64_t quota = config_.quotas.For(tenant).max_bytes;
      int64_t& used = tenant_bytes_[tenant];
      if (quota > 0 && used + bytes > quota) return false;
      used += bytes;
      return true;
    });
    for (const std::string& id : txn.batch.deleted_jobs) log_files_->Remove(id);
  }
  for (auto& [worker, msg] : txn.outbound) {
    if (worker->sink != nullptr) {
      worker->sink->Send(msg);
    } else {
      worker->pending.push_back(std::move(msg));
    }
  }
  for (auto& [job, ev] : txn.notify) {
    for (JobEventSink* sink : job->watchers) sink->OnEvent(ev);
  }
  for (size_t i = 0; i < txn.log_lines.size();) {
    // Consecutive lines of one job go to its followers as one batch.
    JobRt* job = txn.log_lines[i].first;
    std::vector<v1::LogLine> batch;
    for (; i < txn.log_lines.size() && txn.log_lines[i].first == job; ++i) {
      batch.push_back(std::move(txn.log_lines[i].second));
    }
    for (LogSink* sink : job->log_followers) sink->OnLines(batch);
  }
  for (JobRt* job : txn.ended) JobEndedLocked(*job);
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
    auto it = state_.jobs.find(id);
    if (it == state_.jobs.end()) continue;
    JobRt& job = *it->second;
    absl::StatusOr<std::optional<JobRecord>> stored = store_->LoadJob(id);
    if (!stored.ok()) {
      ULOG(ERROR) << id << ": cannot reload after a refused write: " << stored.status();
      continue;
    }
    if (!stored->has_value()) {  // Never written (a new job): it does not exist.
      if (job.watchers.empty() && job.log_followers.empty()) {
        machine_.ForgetLogs(job);
        state_.jobs.erase(it);
      }
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
      job.event_bytes = 0;
      for (const EventRecord& e : *events) {
        v1::JobEvent ev;
        if (ev.ParseFromString(e.payload)) KeepEvent(job, std::move(ev), config_.event_history);
      }
    }
    v1::LogLine line;
    line.set_stream(v1::LOG_STREAM_COORDINATOR);
    line.set_text("the state store refused the last change to this job; it was undone");
    Txn notice;  // Nothing to write: only the log line for the followers.
    machine_.AddLog(job, std::move(line), notice);
    for (auto& [j, l] : notice.log_lines) {
      for (LogSink* sink : j->log_followers) sink->OnLines({l});
    }
  }
  for (WorkerRt* w : txn.workers) {
    absl::StatusOr<std::optional<WorkerRecord>> stored = store_->LoadWorker(w->rec.id);
    if (!stored.ok()) continue;
    if (stored->has_value()) {
      w->rec = std::move(**stored);
    } else if (w->sink == nullptr) {
      state_.workers.erase(w->rec.id);  // Never written (a new registration): it does not exist.
    }
  }
  // Assignments made by the undone change point at attempts that no longer exist.
  for (auto& [id, w] : state_.workers) {
    for (auto it = w->slots.begin(); it != w->slots.end();) {
      const v1::WorkRef& held = it->second;
      JobRt* job = job_ids.count(held.job_id()) ? state_.FindJob(held.job_id()) : nullptr;
      const AttemptRecord* a = job == nullptr ? nullptr : job->rec.current_attempt();
      if (!job_ids.count(held.job_id()) ||
          (a != nullptr && !a->ended() && a->generation == held.generation())) {
        ++it;
      } else {
        it = w->slots.erase(it);
      }
    }
    if (!w->busy() && w->state == v1::WORKER_STATE_BUSY) w->state = v1::WORKER_STATE_IDLE;
  }
}

void Coordinator::JobEndedLocked(JobRt& job) {
  if (!job.rec.terminal()) return;  // Resumed within the same transaction.
  for (JobEventSink* s : job.watchers) s->OnJobEnded();
  for (LogSink* s : job.log_followers) s->OnJobEnded();
  job.watchers.clear();
  job.log_followers.clear();
  metrics_->ForgetJob(job.rec.id);
}

std::map<std::string, int64_t> Coordinator::TenantBytesLocked() {
  std::map<std::string, int64_t> out;
  for (auto& [id, j] : state_.jobs) {
    out[j->rec.tenant] +=
        static_cast<int64_t>(j->rec.spec_yaml.size()) + j->event_bytes + log_files_->Bytes(id);
  }
  return out;
}

std::map<std::string, std::string> Coordinator::JobTenants() {
  std::map<std::string, std::string> out;
  LockDeferringWrites lock(&mu_);
  for (auto& [id, j] : state_.jobs) out.emplace(id, j->rec.tenant);
  return out;
}

StateCounts Coordinator::Counts(CountsPart part) {
  StateCounts out;
  LockDeferringWrites lock(&mu_);
  switch (part) {
    case CountsPart::kJobs:
      for (auto& [id, j] : state_.jobs) out.jobs_by_state[j->rec.state]++;
      break;
    case CountsPart::kQueue:
      for (auto& [id, j] : state_.jobs) out.queued_jobs += IsQueued(j->rec.state) ? 1 : 0;
      break;
    case CountsPart::kWorkers:
      for (auto& [id, w] : state_.workers) {
        out.workers_by_state[w->state]++;
        if (w->state == v1::WORKER_STATE_LOST) continue;
        const int64_t busy = static_cast<int64_t>(w->slots.size());
        const int64_t idle = std::max<int64_t>(0, w->rec.capacity - busy);
        const bool schedulable = !w->draining && (w->state == v1::WORKER_STATE_IDLE ||
                                                  w->state == v1::WORKER_STATE_BUSY);
        out.busy_slots += busy;
        (schedulable ? out.free_slots : out.unavailable_slots) += idle;
      }
      break;
    case CountsPart::kHeartbeats: {
      const int64_t now = SteadyMs();
      for (auto& [id, w] : state_.workers) {
        if (w->state == v1::WORKER_STATE_LOST) continue;
        out.heartbeat_ages_s.emplace_back(id,
                                          std::max<int64_t>(0, now - w->last_seen_steady) / 1000.0);
      }
      break;
    }
    case CountsPart::kCheckpointAges: {
      // Work at risk: training since the later of the last commit and the attempt's start
      // (a restarted attempt resumed from that commit).
      const int64_t now = NowMs();
      for (auto& [id, j] : state_.jobs) {
        if (j->rec.state != v1::JOB_STATE_RUNNING && j->rec.state != v1::JOB_STATE_CHECKPOINTING) {
          continue;
        }
        const int64_t since = WorkAtRiskSinceMs(j->rec);
        if (since <= 0) continue;
        out.checkpoint_ages_s.emplace_back(id, std::max<int64_t>(0, now - since) / 1000.0);
      }
      break;
    }
    case CountsPart::kGoodput: {
      const int64_t now = NowMs();
      for (auto& [id, j] : state_.jobs) {
        if (j->rec.terminal() || j->rec.goodput.generation == 0) continue;
        out.goodput_ratios.emplace_back(id, GoodputToProto(j->rec.goodput, now).ratio());
      }
      break;
    }
  }
  return out;
}

}  // namespace ulysses::coordinator
