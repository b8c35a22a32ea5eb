#include "coordinator/job_machine.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/contract/exit.h"
#include "common/logging.h"
#include "common/spec/job_spec_parser.h"
#include "coordinator/auth/tokens.h"
#include "coordinator/engine_spec.h"
#include "coordinator/failure_budget.h"
#include "coordinator/pool_demand.h"
#include "coordinator/scheduler.h"
#include "coordinator/views.h"
#include "google/protobuf/util/time_util.h"

namespace ulysses::coordinator {
namespace {

// The job's groups span workers only over a fabric (not spec.parallelism.allow_tcp_fabric).
bool FabricRequired(const JobRt& job) {
  if (job.allow_tcp_fabric < 0) {
    // The canonical spec the coordinator wrote itself (NewJobRecord): it parses.
    absl::StatusOr<spec::JobSpec> s = spec::ParseJobSpec(job.rec.spec_yaml, {});
    job.allow_tcp_fabric = s.ok() && s->parallelism.allow_tcp_fabric ? 1 : 0;
  }
  return job.allow_tcp_fabric == 0;
}

// A worker whose CUDA slots reach other nodes only over TCP sockets (GangRequest's
// fabric_required keeps groups from spanning it). CPU slots (Gloo) and workers that reported no
// fabric (older agents) are not restricted.
bool TcpOnly(const WorkerRt& w) {
  if (w.fabric != v1::FABRIC_SOCKETS) return false;
  return std::any_of(w.rec.devices.begin(), w.rec.devices.end(),
                     [](const std::string& d) { return d.rfind("cuda", 0) == 0; });
}

}  // namespace

using google::protobuf::util::TimeUtil;

void JobMachine::AddEvent(JobRt& job, v1::JobEvent event, bool persist, Txn& txn) {
  event.set_job_id(job.rec.id);
  event.set_sequence(job.next_event_seq++);
  *event.mutable_time() = TimeUtil::MillisecondsToTimestamp(NowMs());
  if (persist) {
    EventRecord rec{job.rec.id, event.sequence(), NowMs(), event.SerializeAsString()};
    txn.batch.events.push_back(std::move(rec));
  }
  KeepEvent(job, event, config_.event_history);
  if (!job.watchers.empty()) txn.notify.emplace_back(&job, std::move(event));
}

std::string JobMachine::NameFor(const JobRt& other, const JobRt& shown_to) {
  // Reasons and log lines are read by the job's tenant: another tenant's job stays unnamed.
  return other.rec.tenant == shown_to.rec.tenant ? other.rec.id : "a job of another tenant";
}

void JobMachine::DropOldestLog(JobRt& job) {
  const int64_t bytes = LogLineBytes(job.logs.front());
  job.log_bytes -= bytes;
  state_.log_bytes -= bytes;
  job.logs.pop_front();
}

void JobMachine::ForgetLogs(JobRt& job) {
  state_.log_bytes -= job.log_bytes;
  job.log_bytes = 0;
  job.logs.clear();
}

void JobMachine::AddLog(JobRt& job, v1::LogLine line, Txn& txn) {
  line.set_sequence(job.next_log_seq++);
  if (!line.has_time()) *line.mutable_time() = TimeUtil::MillisecondsToTimestamp(NowMs());
  const int64_t bytes = LogLineBytes(line);
  job.logs.push_back(line);
  job.log_bytes += bytes;
  state_.log_bytes += bytes;
  while (job.logs.size() > static_cast<size_t>(config_.log_buffer_lines) ||
         (job.log_bytes > config_.log_buffer_bytes_per_job && job.logs.size() > 1)) {
    DropOldestLog(job);
  }
  if (state_.log_bytes > config_.log_buffer_bytes_total) {
    // Down to 90% of the bound at once, from the largest buffers first, so this scan over
    // the jobs runs rarely.
    const int64_t target = config_.log_buffer_bytes_total - config_.log_buffer_bytes_total / 10;
    while (state_.log_bytes > target) {
      JobRt* largest = nullptr;
      for (auto& [id, j] : state_.jobs) {
        if (largest == nullptr || j->log_bytes > largest->log_bytes) largest = j.get();
      }
      if (largest == nullptr || largest->logs.empty()) break;
      const int64_t half = largest->log_bytes / 2;
      while (state_.log_bytes > target && !largest->logs.empty() && largest->log_bytes > half) {
        DropOldestLog(*largest);
      }
    }
  }
  txn.log_files.emplace_back(job.rec.id, line);
  if (!job.log_followers.empty()) txn.log_lines.emplace_back(&job, std::move(line));
}

void JobMachine::RestoreLogs(JobRt& job, std::vector<v1::LogLine> lines) {
  for (v1::LogLine& line : lines) {
    if (line.sequence() < job.next_log_seq) continue;  // Already there (or out of order).
    job.next_log_seq = line.sequence() + 1;
    const int64_t bytes = LogLineBytes(line);
    job.logs.push_back(std::move(line));
    job.log_bytes += bytes;
    state_.log_bytes += bytes;
    while (job.logs.size() > static_cast<size_t>(config_.log_buffer_lines) ||
           (job.log_bytes > config_.log_buffer_bytes_per_job && job.logs.size() > 1)) {
      DropOldestLog(job);
    }
  }
}

void JobMachine::ExpireLostWorkers(int64_t now_steady_ms, Txn& txn) {
  const int64_t ttl_ms = static_cast<int64_t>(config_.lost_worker_ttl_s * 1000);
  for (auto it = state_.workers.begin(); it != state_.workers.end();) {
    const WorkerRt& w = *it->second;
    if (w.state != v1::WORKER_STATE_LOST || w.sink != nullptr || w.busy() ||
        now_steady_ms - w.lost_since_steady < ttl_ms || txn.workers.count(it->second.get())) {
      ++it;
      continue;
    }
    ULOG(INFO) << "worker " << w.rec.id << " forgotten: lost for more than "
               << config_.lost_worker_ttl_s << "s";
    txn.batch.deleted_workers.push_back(w.rec.id);
    it = state_.workers.erase(it);
  }
}

void JobMachine::ExpireEndedJobs(int64_t now_ms, Txn& txn) {
  if (config_.ended_job_ttl_s <= 0) return;
  const int64_t ttl_ms = static_cast<int64_t>(config_.ended_job_ttl_s * 1000);
  for (auto it = state_.jobs.begin(); it != state_.jobs.end();) {
    JobRt& job = *it->second;
    if (!job.rec.terminal() || now_ms - job.rec.finished_ms < ttl_ms || !job.watchers.empty() ||
        !job.log_followers.empty() || txn.jobs.count(&job)) {
      ++it;
      continue;
    }
    ULOG(INFO) << job.rec.id << " deleted: ended " << StateName(job.rec.state)
               << " more than ended_job_ttl_s " << config_.ended_job_ttl_s << "s ago (checkpoints "
               << "stay in " << job.rec.checkpoint_dir << ")";
    txn.batch.deleted_jobs.push_back(job.rec.id);
    if (!job.rec.request_id.empty()) state_.job_by_request.erase(job.rec.request_id);
    ForgetLogs(job);
    it = state_.jobs.erase(it);
  }
}

void JobMachine::SendTo(WorkerRt& worker, v1::CoordinatorMessage message, Txn& txn) {
  txn.outbound.emplace_back(&worker, std::move(message));
}

void JobMachine::SendAbort(WorkerRt& worker, const v1::WorkRef& ref, const std::string& why,
                           Txn& txn) {
  v1::CoordinatorMessage msg;
  *msg.mutable_abort()->mutable_ref() = ref;
  msg.mutable_abort()->set_reason(why);
  msg.mutable_abort()->set_grace_period_ms(abort_grace_ms());
  SendTo(worker, std::move(msg), txn);
}

void JobMachine::SetState(JobRt& job, v1::JobState to, const std::string& reason, Txn& txn,
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
    if (metrics_.recovery) {
      metrics_.recovery->WithLabels()->Observe((steady - job.recovering_since_steady) / 1000.0);
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
  AddLog(job, std::move(line), txn);
}

int JobMachine::AllocatePort() {
  // The ports of live attempts, collected once per scheduling pass (a pass that launches
  // J jobs among N would otherwise walk every job J times) and per call outside one.
  if (!ports_in_use_.has_value()) {
    ports_in_use_.emplace();
    for (auto& [id, j] : state_.jobs) {
      const AttemptRecord* a = j->rec.current_attempt();
      if (a != nullptr && !a->ended()) ports_in_use_->insert(a->master_port);
    }
  }
  const int lo = static_cast<int>(config_.rendezvous_port_min);
  const int span = static_cast<int>(config_.rendezvous_port_max - config_.rendezvous_port_min + 1);
  int& next = state_.next_port;
  int port = -1;
  for (int i = 0; i < span; ++i) {
    const int candidate = lo + (next + i) % span;
    if (!ports_in_use_->count(candidate)) {
      next = (next + i + 1) % span;
      port = candidate;
      break;
    }
  }
  if (port < 0) {
    next = (next + 1) % span;
    port = lo + next;
  }
  ports_in_use_->insert(port);
  if (!in_pass_) ports_in_use_.reset();
  return port;
}

void JobMachine::SetWantedWorkers(const std::vector<QueuedJob>& queue) {
  if (metrics_.wanted_workers == nullptr) return;
  std::vector<PoolWorker> pool;
  pool.reserve(state_.workers.size());
  int64_t slots = 0;  // A worker's slots: the largest live worker's.
  for (const auto& [id, w] : state_.workers) {
    if (w->state == v1::WORKER_STATE_LOST) continue;
    slots = std::max<int64_t>(slots, w->rec.capacity);
    pool.push_back({w->rec.name, w->busy()});
  }
  std::vector<int64_t> worlds;
  worlds.reserve(queue.size());
  for (const QueuedJob& q : queue) worlds.push_back(int64_t{q.gang.sp} * q.gang.dp);
  metrics_.wanted_workers->WithLabels()->Set(
      static_cast<double>(WantedWorkers(pool, worlds, slots > 0 ? slots : 8)));
}

void JobMachine::Schedule(Txn& txn) {
  // One walk over the jobs and one over the workers: at 25,000 nodes and 10,000 queued
  // jobs each walk is what a pass costs (bench/schedule_pass, docs/BENCHMARKS.md).
  const int64_t now = NowMs();
  next_backoff_end_ms_ = INT64_MAX;
  PassJobs jobs = CollectJobs(now);
  SetWantedWorkers(jobs.queue);
  if (jobs.queue.empty()) {
    if (!jobs.recheck.empty()) {
      const LiveSlots live = RegisteredSlots();
      for (JobRt* job : jobs.recheck) UpdateUnschedulable(*job, live, txn);
    }
    return;
  }
  const PassSlots slots = CollectSlots();
  for (JobRt* job : jobs.recheck) UpdateUnschedulable(*job, slots.live, txn);
  const std::vector<RunningJob> running = PreemptionCandidates(jobs, now);
  in_pass_ = true;  // AllocatePort keeps its port set for the launches below.
  for (QueueDecision& d : PlanQueue(std::move(jobs.queue), slots.idle, slots.live, &config_.quotas,
                                    std::move(jobs.in_use), running, slots.freeing)) {
    Apply(d, jobs, txn);
  }
  in_pass_ = false;
  ports_in_use_.reset();
}

JobMachine::PassJobs JobMachine::CollectJobs(int64_t now) {
  PassJobs out;
  for (auto& [id, j] : state_.jobs) {
    const JobRt& job = *j;
    if (!job.preempting_for.empty()) out.preempting.emplace(job.preempting_for, &job);
    if (const AttemptRecord* a = job.rec.current_attempt(); a != nullptr && !a->ended()) {
      out.in_use[job.rec.tenant] += static_cast<int64_t>(a->worker_ids.size());
      if (job.rec.preemptible && job.rec.state == v1::JOB_STATE_RUNNING &&
          job.preempting_for.empty() && !job.awaiting_reconnect) {
        out.preemptible.push_back(&job);
      }
    }
    if (job.rec.terminal()) continue;
    const bool conditioned = job.unschedulable.status();
    if (job.awaiting_reconnect || !IsQueued(job.rec.state)) {
      if (conditioned) out.recheck.push_back(j.get());
      continue;
    }
    const AttemptRecord* a = job.rec.attempts.empty() ? nullptr : &job.rec.attempts.back();
    if (a != nullptr && a->generation == job.rec.generation && !a->ended()) {
      if (conditioned) out.recheck.push_back(j.get());
      continue;
    }
    const StageRecord& stage = job.rec.stages[job.rec.stage_index];
    const bool may_preempt = std::find(config_.non_preempting_priorities.begin(),
                                       config_.non_preempting_priorities.end(),
                                       job.rec.priority) == config_.non_preempting_priorities.end();
    if (may_preempt) {
      out.max_preempting_priority = std::max(out.max_preempting_priority, job.rec.priority);
    }
    if (job.rec.not_before_ms > now) {
      next_backoff_end_ms_ = std::min(next_backoff_end_ms_, job.rec.not_before_ms);
    }
    out.queue.push_back({job.rec.id, job.rec.priority, job.rec.number, stage.index,
                         GangRequest{stage.sp, stage.dp, job.rec.node_label, FabricRequired(job)},
                         job.rec.not_before_ms > now, job.rec.tenant, may_preempt,
                         static_cast<int>(job.rec.stages.size())});
    out.recheck.push_back(j.get());
  }
  return out;
}

JobMachine::PassSlots JobMachine::CollectSlots() const {
  PassSlots out;
  out.idle.reserve(state_.workers.size());
  // One entry per free or freeing slot: a full cluster has few, and a busy slot costs a
  // job lookup only when its job differs from the previous slot's.
  for (const auto& [id, w] : state_.workers) {
    const bool tcp_only = TcpOnly(*w);
    if (w->state != v1::WORKER_STATE_LOST) {
      out.live.Add(w->rec.node_label, std::max(0, w->rec.capacity), tcp_only);
    }
    if (w->draining) continue;
    const bool connected = w->sink != nullptr &&
                           (w->state == v1::WORKER_STATE_IDLE || w->state == v1::WORKER_STATE_BUSY);
    const std::string* last_job_id = nullptr;
    const JobRt* last_job = nullptr;
    auto held = w->slots.begin();
    FreeWorker* free = nullptr;
    for (int slot = 0; slot < w->rec.capacity; ++slot) {
      while (held != w->slots.end() && held->first < slot) ++held;
      if (held == w->slots.end() || held->first != slot) {
        if (!connected) continue;
        if (free == nullptr) {
          free = &out.idle.emplace_back(FreeWorker{w->rec.id, w->rec.node_label, {}, tcp_only});
        }
        free->slots.push_back(slot);
        continue;
      }
      if (w->state == v1::WORKER_STATE_LOST) continue;
      const v1::WorkRef& ref = held->second;
      if (last_job_id == nullptr || *last_job_id != ref.job_id()) {
        last_job_id = &ref.job_id();
        last_job = state_.FindJob(ref.job_id());
      }
      const AttemptRecord* a = last_job == nullptr ? nullptr : last_job->rec.current_attempt();
      if (a == nullptr || a->ended() || a->generation != ref.generation() ||
          !last_job->preempting_for.empty()) {
        out.freeing.push_back({w->rec.id, w->rec.node_label, slot, tcp_only});
      }
    }
  }
  return out;
}

std::vector<RunningJob> JobMachine::PreemptionCandidates(const PassJobs& jobs, int64_t now) const {
  // Only preemptible ones of lower priority than a job that may preempt (PlanPreemption takes
  // no others): listing every running job's slots per pass would be 200,000 entries on a full
  // 25,000-node cluster.
  std::vector<RunningJob> running;
  for (const JobRt* j : jobs.preemptible) {
    if (j->rec.priority >= jobs.max_preempting_priority) continue;
    const AttemptRecord* a = j->rec.current_attempt();
    RunningJob r;
    r.id = j->rec.id;
    r.priority = j->rec.priority;
    r.number = j->rec.number;
    for (size_t rank = 0; rank < a->worker_ids.size(); ++rank) {
      if (const WorkerRt* w = state_.FindWorker(a->worker_ids[rank]); w != nullptr) {
        r.workers.push_back({w->rec.id, w->rec.node_label, a->slots[rank], TcpOnly(*w)});
      }
    }
    // The work a preemption now would lose (the rule of ulysses_checkpoint_age_seconds).
    r.gpu_seconds_at_risk = static_cast<double>(a->worker_ids.size()) *
                            std::max<int64_t>(0, now - WorkAtRiskSinceMs(j->rec)) / 1000.0;
    r.tenant = j->rec.tenant;
    r.preemptible = true;
    running.push_back(std::move(r));
  }
  return running;
}

void JobMachine::Apply(QueueDecision& d, const PassJobs& jobs, Txn& txn) {
  JobRt& job = *state_.jobs[d.job_id];
  std::string reason;
  switch (d.kind) {
    case QueueDecision::Kind::kLaunch:
      Launch(job, d.worker_ids, d.slots, txn);
      if (d.backfill) {
        v1::LogLine line;
        line.set_stream(v1::LOG_STREAM_COORDINATOR);
        line.set_text("backfilled: started on idle workers the waiting head job does not need");
        AddLog(job, std::move(line), txn);
      }
      return;
    case QueueDecision::Kind::kPreempt:
      for (const Victim& v : d.victims) {
        if (JobRt* victim = state_.FindJob(v.job_id); victim != nullptr) {
          PreemptForPriority(*victim, job, v.gpu_seconds_at_risk, txn);
        }
      }
      reason = std::move(d.reason);
      break;
    case QueueDecision::Kind::kBackoff:
      return;  // Restart backoff still running; keep its explanation.
    case QueueDecision::Kind::kBlocked:
      reason = std::move(d.reason);
      break;
    case QueueDecision::Kind::kUnplaced:
      reason = std::move(d.reason);
      for (auto [it, end] = jobs.preempting.equal_range(job.rec.id); it != end; ++it) {
        absl::StrAppend(&reason, "; preempting ", NameFor(*it->second, job),
                        " (it checkpoints first)");
      }
      if (job.rec.state == v1::JOB_STATE_RECOVERING || job.rec.state == v1::JOB_STATE_PREEMPTED) {
        reason = absl::StrCat("restarting from ", CheckpointText(job.rec), "; ", reason);
      }
      break;
  }
  if (reason == job.rec.reason) return;
  job.rec.reason = std::move(reason);
  txn.jobs.insert(&job);
  if (!job.watchers.empty()) {  // watch shows the reason it waits for now (not kept).
    v1::JobEvent ev;
    ev.set_job_id(job.rec.id);
    *ev.mutable_time() = TimeUtil::MillisecondsToTimestamp(NowMs());
    ev.set_reason(job.rec.reason);
    txn.notify.emplace_back(&job, std::move(ev));
  }
}

LiveSlots JobMachine::RegisteredSlots() const {
  LiveSlots live;
  for (const auto& [id, w] : state_.workers) {
    if (w->state != v1::WORKER_STATE_LOST) {
      live.Add(w->rec.node_label, std::max(0, w->rec.capacity), TcpOnly(*w));
    }
  }
  return live;
}

void JobMachine::UpdateUnschedulable(JobRt& job, const LiveSlots& live, Txn& txn) {
  std::vector<GangRequest> gangs;
  gangs.reserve(job.rec.stages.size());
  for (const StageRecord& st : job.rec.stages) {
    gangs.push_back({st.sp, st.dp, job.rec.node_label, FabricRequired(job)});
  }
  const std::optional<UnschedulableStage> u =
      FirstUnschedulableStage(gangs, job.rec.stage_index, live);
  v1::JobCondition& c = job.unschedulable;
  const bool was = c.status();
  if (!u.has_value() && !was) return;
  if (u.has_value() && was && c.message() == u->message) return;
  c.set_type("Unschedulable");
  c.set_status(u.has_value());
  c.set_reason("ClusterTooSmall");
  if (u.has_value()) {
    c.set_message(u->message);
    c.set_stage(u->stage);
  }
  if (was == c.status()) return;  // Still holds, in other words: no event.
  *c.mutable_last_transition_time() = TimeUtil::MillisecondsToTimestamp(NowMs());
  v1::JobEvent event;
  *event.mutable_condition() = c;
  AddEvent(job, std::move(event), /*persist=*/true, txn);
}

void JobMachine::Launch(JobRt& job, const std::vector<std::string>& worker_ids,
                        const std::vector<int>& slots, Txn& txn) {
  JobRecord& rec = job.rec;
  // The spec with the job's checkpoint directory written in as data (engine_spec.h), not a
  // --set override the engine would parse again.
  absl::StatusOr<std::string> engine_spec = EngineSpecYaml(rec.spec_yaml, rec.checkpoint_dir);
  if (!engine_spec.ok()) {
    SetState(job, v1::JOB_STATE_FAILED, std::string(engine_spec.status().message()), txn);
    return;
  }
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
  attempt.slots = slots;
  for (size_t r = 0; r < worker_ids.size(); ++r) {
    const WorkerRecord& w = state_.workers[worker_ids[r]]->rec;
    attempt.devices.push_back(slots[r] < static_cast<int>(w.devices.size()) ? w.devices[slots[r]]
                                                                            : w.device);
    attempt.node_labels.push_back(w.node_label);
  }
  attempt.master_addr = state_.workers[worker_ids[0]]->rec.host;
  attempt.master_port = AllocatePort();
  attempt.started_ms = now;
  rec.attempts.push_back(attempt);
  AccountLaunch(job);
  job.started_ranks.clear();
  job.done_ranks.clear();
  if (metrics_.gang_wait && job.queued_since_steady > 0) {
    metrics_.gang_wait->WithLabels()->Observe((SteadyMs() - job.queued_since_steady) / 1000.0);
  }
  const std::optional<v1::CheckpointInterval> interval = LaunchInterval(job, stage.world());
  // One per attempt, in memory only: every rank of this generation gets it with its assignment.
  absl::StatusOr<std::string> secret = auth::NewToken();
  for (size_t r = 0; r < worker_ids.size(); ++r) {
    WorkerRt& w = *state_.workers[worker_ids[r]];
    v1::CoordinatorMessage msg;
    v1::Assignment* a = msg.mutable_assignment();
    if (interval.has_value()) *a->mutable_checkpoint_interval() = *interval;
    a->mutable_ref()->set_job_id(rec.id);
    a->mutable_ref()->set_generation(rec.generation);
    a->mutable_ref()->set_rank(static_cast<int>(r));
    a->mutable_ref()->set_stage(stage.index);
    a->set_job_name(rec.name);
    a->set_spec_yaml(*engine_spec);
    a->set_world_size(stage.world());
    a->set_sp(stage.sp);
    a->set_dp(stage.dp);
    a->set_master_addr(attempt.master_addr);
    a->set_master_port(attempt.master_port);
    a->set_checkpoint_dir(rec.checkpoint_dir);
    a->set_tenant(rec.tenant);
    if (secret.ok()) a->set_rendezvous_secret(*secret);
    a->set_out_dir(rec.out_dir);
    a->set_seq_len(stage.seq_len);
    a->set_steps(stage.steps);
    a->set_slot(slots[r]);
    w.slots[slots[r]] = a->ref();
    w.state = v1::WORKER_STATE_BUSY;
    SendTo(w, std::move(msg), txn);
  }
  if (interval.has_value()) {
    v1::LogLine line;
    line.set_stream(v1::LOG_STREAM_COORDINATOR);
    line.set_text(absl::StrCat("checkpoint interval version ", interval->version(),
                               " assigned: ", interval->reason()));
    AddLog(job, std::move(line), txn);
  }
  for (const std::string& warning : PlacementWarnings(attempt, stage.sp)) {
    v1::LogLine line;
    line.set_stream(v1::LOG_STREAM_COORDINATOR);
    line.set_text(absl::StrCat("warning: ", warning));
    AddLog(job, std::move(line), txn);
  }
  v1::JobEvent ev;
  *ev.mutable_attempt_started() = AttemptToProto(attempt, stage.sp);
  AddEvent(job, std::move(ev), true, txn);
  SetState(job, v1::JOB_STATE_SCHEDULING,
           absl::StrCat("starting ", StageName(stage.index, static_cast<int>(rec.stages.size())),
                        " (generation ", rec.generation, ") on ", worker_ids.size(),
                        worker_ids.size() == 1 ? " slot" : " slots", ", rendezvous ",
                        attempt.master_addr, ":", attempt.master_port),
           txn);
}

void JobMachine::EndAttempt(JobRt& job, v1::AttemptOutcome outcome, int exit_code,
                            const std::string& reason, int64_t grace_ms, Txn& txn) {
  AttemptRecord* attempt = job.rec.current_attempt();
  if (attempt == nullptr || attempt->ended()) return;
  attempt->outcome = outcome;
  attempt->ended_ms = NowMs();
  attempt->exit_code = exit_code;
  attempt->reason = reason;
  AccountEnd(job, *attempt);
  job.preempting_for.clear();
  job.awaiting_reconnect = false;
  job.reconnected_ranks.clear();
  for (WorkerRt* w : HoldingWorkers(job.rec.id, *attempt)) {
    v1::CoordinatorMessage msg;  // Stops every rank of the generation on that worker.
    *msg.mutable_abort()->mutable_ref() = w->Held(job.rec.id, attempt->generation).front();
    msg.mutable_abort()->set_reason(reason);
    msg.mutable_abort()->set_grace_period_ms(grace_ms);
    SendTo(*w, std::move(msg), txn);
  }
  v1::JobEvent ev;
  *ev.mutable_attempt_ended() = AttemptToProto(
      *attempt, job.rec.stages[std::clamp<int>(attempt->stage, 0, job.rec.stages.size() - 1)].sp);
  AddEvent(job, std::move(ev), true, txn);
  txn.jobs.insert(&job);
}

void JobMachine::RestartGroup(JobRt& job, const std::string& reason,
                              const std::string& metric_reason, Txn& txn) {
  EndAttempt(job, v1::ATTEMPT_OUTCOME_ABORTED, 0, reason, abort_grace_ms(), txn);
  job.rec.restarts++;
  metrics_.CountRestart(metric_reason);
  job.rec.not_before_ms = 0;
  SetState(job, v1::JOB_STATE_RECOVERING,
           absl::StrCat(reason, "; restarting from ", CheckpointText(job.rec)), txn);
}

void JobMachine::OnRankFailure(JobRt& job, v1::AttemptOutcome outcome, int exit_code,
                               const std::string& reason, const std::string& metric_reason,
                               contract::FailureKind kind, Txn& txn) {
  EndAttempt(job, outcome, exit_code, reason, abort_grace_ms(), txn);
  if (outcome == v1::ATTEMPT_OUTCOME_BAD_INPUT) {
    SetState(job, v1::JOB_STATE_FAILED, reason, txn);
    return;
  }
  const bool infra = kind == contract::FailureKind::kInfrastructure;
  ++(infra ? job.rec.infra_failures : job.rec.failures);
  const BudgetCount b = CountFailure(job.rec, infra, NowMs());
  std::string counted = absl::StrCat(contract::FailureKindName(kind), " failure ", b.count, " of ",
                                     infra ? "max_infra_failures " : "max_failures ", b.budget,
                                     " without a new checkpoint");
  if (job.rec.failure_window_s > 0) {
    absl::StrAppend(&counted, " within ", job.rec.failure_window_s, "s");
  }
  if (b.exhausted) {
    // A crash loop: the same kind of failure again and again without progress. The reason
    // is the last (repeated) error.
    SetState(job, v1::JOB_STATE_FAILED,
             absl::StrCat(b.count > 1 && !infra ? "crash loop: " : "", reason, " (", counted, ")"),
             txn);
    return;
  }
  job.rec.restarts++;
  metrics_.CountRestart(metric_reason);
  double backoff = std::min(config_.restart_backoff_max_s,
                            config_.restart_backoff_base_s * std::pow(2.0, b.count - 1));
  job.rec.not_before_ms = NowMs() + static_cast<int64_t>(backoff * 1000);
  SetState(
      job, v1::JOB_STATE_RECOVERING,
      absl::StrCat(reason, "; restarting from ", CheckpointText(job.rec), " in ", backoff, "s (",
                   counted, b.progress ? "; earlier failures forgotten: progress" : "", ")"),
      txn);
}

void JobMachine::OnRankLost(JobRt& job, const std::string& reason, Txn& txn) {
  if (job.awaiting_reconnect) {
    RestartGroup(job, reason, "coordinator_restart", txn);
  } else {
    OnRankFailure(job, v1::ATTEMPT_OUTCOME_LOST, -1, reason, "worker_lost",
                  contract::FailureKind::kInfrastructure, txn);
  }
}

void JobMachine::OnRankPreempted(JobRt& job, int rank, int exit_code, const std::string& how,
                                 Txn& txn) {
  const bool priority = !job.preempting_for.empty();
  std::string why =
      exit_code == contract::kExitPreempted
          ? absl::StrCat("rank ", rank, " preempted (exit ", exit_code, " after a checkpoint)")
          : absl::StrCat("rank ", rank, " preempted (it ", how, " instead of exiting ",
                         contract::kExitPreempted, " after a checkpoint)");
  if (priority) {
    const JobRt* for_job = state_.FindJob(job.preempting_for);
    absl::StrAppend(&why, " for ",
                    for_job == nullptr ? std::string("another job") : NameFor(*for_job, job));
  }
  // The work lost: GPU-seconds since the last committed checkpoint (the preemption
  // checkpoint, when it was committed) or since the attempt started.
  double lost_gpu_seconds = 0;
  if (const AttemptRecord* a = job.rec.current_attempt(); a != nullptr && !a->ended()) {
    int64_t since = a->started_ms;
    if (job.rec.last_checkpoint) since = std::max(since, job.rec.last_checkpoint->committed_ms);
    lost_gpu_seconds =
        static_cast<double>(a->worker_ids.size()) * std::max<int64_t>(0, NowMs() - since) / 1000.0;
  }
  EndAttempt(job, v1::ATTEMPT_OUTCOME_PREEMPTED, exit_code, why, PreemptionGraceMs(), txn);
  job.rec.preemptions++;
  job.rec.preemptions_budget_used++;
  const std::string metric_reason = priority ? "priority" : "worker";
  if (metrics_.preemptions) metrics_.preemptions->WithLabels({metric_reason})->Increment();
  if (metrics_.preemption_lost_gpu_seconds) {
    metrics_.preemption_lost_gpu_seconds->WithLabels({metric_reason})->Increment(lost_gpu_seconds);
  }
  if (job.rec.max_preemptions >= 0 && job.rec.preemptions_budget_used > job.rec.max_preemptions) {
    SetState(job, v1::JOB_STATE_FAILED,
             absl::StrCat(why, "; preempted ", job.rec.preemptions_budget_used,
                          " times, max_preemptions is ", job.rec.max_preemptions),
             txn);
    return;
  }
  SetState(job, v1::JOB_STATE_PREEMPTED,
           absl::StrCat(why, "; ", absl::StrFormat("%.1f", lost_gpu_seconds),
                        " GPU-seconds since the last checkpoint lost; requeued, resumes from ",
                        CheckpointText(job.rec)),
           txn);
}

void JobMachine::PreemptForPriority(JobRt& job, JobRt& for_job, double gpu_seconds_at_risk,
                                    Txn& txn) {
  AttemptRecord* attempt = job.rec.current_attempt();
  if (attempt == nullptr || attempt->ended() || !job.preempting_for.empty()) return;
  job.preempting_for = for_job.rec.id;
  const std::string why = absl::StrCat(
      "preempted for ", NameFor(for_job, job), " (priority ", for_job.rec.priority, " > ",
      job.rec.priority, "): checkpointing now; ", absl::StrFormat("%.1f", gpu_seconds_at_risk),
      " GPU-seconds since the last checkpoint at risk");
  for (WorkerRt* w : HoldingWorkers(job.rec.id, *attempt)) {
    v1::CoordinatorMessage msg;  // Preempts every rank of the generation on that worker.
    *msg.mutable_abort()->mutable_ref() = w->Held(job.rec.id, attempt->generation).front();
    msg.mutable_abort()->set_reason(why);
    msg.mutable_abort()->set_grace_period_ms(PreemptionGraceMs());
    msg.mutable_abort()->set_preempt(true);
    SendTo(*w, std::move(msg), txn);
  }
  SetState(job, v1::JOB_STATE_CHECKPOINTING, why, txn);
  v1::LogLine line;
  line.set_stream(v1::LOG_STREAM_COORDINATOR);
  line.set_text(absl::StrCat("preempting ", NameFor(job, for_job), " (priority ", job.rec.priority,
                             ", ", absl::StrFormat("%.1f", gpu_seconds_at_risk),
                             " GPU-seconds since its last checkpoint) to place this job"));
  AddLog(for_job, std::move(line), txn);
}

void JobMachine::CompleteStage(JobRt& job, Txn& txn) {
  JobRecord& rec = job.rec;
  StageRecord& stage = rec.stages[rec.stage_index];
  EndAttempt(job, v1::ATTEMPT_OUTCOME_SUCCEEDED, 0,
             absl::StrCat(StageName(stage.index, static_cast<int>(rec.stages.size())), " finished"),
             0, txn);
  stage.state = v1::STAGE_STATE_COMPLETED;
  stage.finished_ms = NowMs();
  stage.step = stage.steps;
  if (metrics_.stage_transitions) metrics_.stage_transitions->WithLabels()->Increment();
  rec.stage_index++;
  if (rec.stage_index >= static_cast<int>(rec.stages.size())) {
    SetState(job, v1::JOB_STATE_SUCCEEDED,
             absl::StrCat("all ", rec.stages.size(), " stages finished"), txn);
    return;
  }
  const StageRecord& next = rec.stages[rec.stage_index];
  SetState(job, v1::JOB_STATE_PENDING,
           absl::StrCat(StageName(stage.index, static_cast<int>(rec.stages.size())),
                        " finished; stage ", next.index + 1, " (seq_len ", next.seq_len, ", ",
                        next.world(), " slots) queued"),
           txn);
}

void JobMachine::OnWorkerLost(WorkerRt& worker, const std::string& why, Txn& txn) {
  ULOG(WARNING) << "worker " << worker.rec.id << " lost: " << why;
  worker.state = v1::WORKER_STATE_LOST;
  worker.lost_since_steady = SteadyMs();
  if (worker.sink != nullptr) {
    // Not a consequence of the store commit (worker liveness is not persisted), so the
    // stream is closed now: a commit that fails must not leave it open and unowned.
    worker.sink->Close(absl::UnavailableError(absl::StrCat("worker declared lost: ", why)));
    worker.sink = nullptr;
    worker.session = 0;
  }
  worker.pending.clear();
  std::map<int, v1::WorkRef> held = std::move(worker.slots);
  worker.slots.clear();
  for (const auto& [slot, ref] : held) {
    JobRt* job = state_.FindJob(ref.job_id());
    if (job == nullptr) continue;
    AttemptRecord* attempt = job->rec.current_attempt();
    // Once per attempt: the first lost rank ends it (a worker may hold several of its ranks).
    if (attempt == nullptr || attempt->ended() || attempt->generation != ref.generation()) continue;
    OnRankLost(*job,
               absl::StrCat("worker ", worker.rec.name, " (rank ", ref.rank(), ") lost: ", why),
               txn);
  }
}

std::vector<WorkerRt*> JobMachine::HoldingWorkers(const std::string& job_id,
                                                  const AttemptRecord& attempt) {
  std::vector<WorkerRt*> out;
  for (const std::string& wid : attempt.worker_ids) {
    WorkerRt* w = state_.FindWorker(wid);
    if (w == nullptr || w->Held(job_id, attempt.generation).empty() ||
        std::find(out.begin(), out.end(), w) != out.end()) {
      continue;
    }
    out.push_back(w);
  }
  return out;
}

void JobMachine::CheckReconnectDeadline(JobRt& job, int64_t now_steady_ms, Txn& txn) {
  if (!job.awaiting_reconnect || now_steady_ms < job.reconnect_deadline_steady) return;
  RestartGroup(job,
               absl::StrCat("coordinator restarted and only ", job.reconnected_ranks.size(), " of ",
                            job.rec.stages[job.rec.stage_index].world(),
                            " workers reconnected within ", config_.reconnect_window_s, "s"),
               "coordinator_restart", txn);
}

}  // namespace ulysses::coordinator
