#include "coordinator/worker_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/contract/exit.h"
#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "coordinator/checkpoint_verify.h"
#include "coordinator/path_policy.h"
#include "coordinator/validation.h"
#include "coordinator/views.h"

namespace ulysses::coordinator {
namespace {

// How an Ack tells the worker what became of its message.
v1::AckCode AckCodeFor(const absl::Status& status) {
  if (status.ok()) return v1::ACK_CODE_OK;
  if (absl::IsFailedPrecondition(status)) return v1::ACK_CODE_STALE;
  return v1::ACK_CODE_INVALID;
}

// The timing figures (StepProgress 7..11) of a validated report, and nothing else.
void SetStepFigures(const v1::StepProgress& p, v1::StepProgress* figures) {
  figures->Clear();
  if (p.has_step_seconds()) figures->set_step_seconds(p.step_seconds());
  if (p.has_mfu()) figures->set_mfu(p.mfu());
  if (p.has_median_step_seconds()) figures->set_median_step_seconds(p.median_step_seconds());
  if (p.has_slowest_rank()) figures->set_slowest_rank(p.slowest_rank());
  if (p.has_slowest_step_seconds()) figures->set_slowest_step_seconds(p.slowest_step_seconds());
}

}  // namespace

absl::StatusOr<WorkerProtocol::Registered> WorkerProtocol::Register(
    const v1::RegisterRequest& request, Txn& txn) {
  RETURN_IF_ERROR(ValidateRegisterRequest(request));
  const std::string id = "w-" + request.name();
  auto& slot = state_.workers[id];
  if (!slot) {
    slot = std::make_unique<WorkerRt>();
    slot->rec.id = id;
    slot->rec.name = request.name();
    slot->rec.registered_ms = NowMs();
  }
  WorkerRt& w = *slot;
  w.rec.node_label = request.node_label().empty() ? request.name() : request.node_label();
  w.rec.devices.assign(request.devices().begin(), request.devices().end());
  if (w.rec.devices.empty())
    w.rec.devices.assign(std::max(1, request.capacity()), request.device());
  w.rec.device = w.rec.devices.front();
  w.rec.host = request.host();
  w.rec.capacity = static_cast<int>(w.rec.devices.size());
  w.fabric = request.fabric();
  w.rec.last_seen_ms = NowMs();
  machine_.OnWorkerBack(w, SteadyMs() - w.last_seen_steady, txn);  // Only when SUSPECT.
  w.last_seen_steady = SteadyMs();
  if (w.state == v1::WORKER_STATE_LOST) w.state = v1::WORKER_STATE_DISCONNECTED;
  w.lost_since_steady = 0;
  w.draining = false;  // A (re)registering worker process takes new work again.
  txn.workers.insert(&w);
  Registered out{&w, false};
  // What it still runs: each reported rank that is current is kept (on the slot it reports),
  // the others are aborted; a rank we assigned that it no longer reports is gone.
  std::vector<v1::RunningWork> reported(request.running_ranks().begin(),
                                        request.running_ranks().end());
  if (reported.empty() && request.has_running()) reported.push_back(request.running());
  std::map<int, v1::WorkRef> before = std::move(w.slots);
  w.slots.clear();
  for (const v1::RunningWork& running : reported) {
    const v1::WorkRef& ref = running.ref();
    JobRt* job = state_.FindJob(ref.job_id());
    AttemptRecord* attempt = job ? job->rec.current_attempt() : nullptr;
    const int slot = running.slot();
    if (attempt != nullptr && !attempt->ended() && attempt->generation == ref.generation() &&
        ref.rank() >= 0 && ref.rank() < static_cast<int>(attempt->worker_ids.size()) &&
        attempt->worker_ids[ref.rank()] == id && slot >= 0 && slot < w.rec.capacity &&
        !w.slots.count(slot)) {
      out.keep_running = true;
      w.slots[slot] = ref;
      if (job->awaiting_reconnect) {
        job->reconnected_ranks.insert(ref.rank());
        if (job->reconnected_ranks.size() == attempt->worker_ids.size()) {
          job->awaiting_reconnect = false;
          job->reconnected_ranks.clear();
          job->started_ranks.clear();
          for (size_t r = 0; r < attempt->worker_ids.size(); ++r) {
            job->started_ranks.insert(static_cast<int>(r));
          }
          machine_.SetState(
              *job, v1::JOB_STATE_RUNNING,
              absl::StrCat("recovered after coordinator restart: all ", attempt->worker_ids.size(),
                           " ranks reconnected (generation ", attempt->generation, ")"),
              txn);
        }
      }
    } else {
      machine_.SendAbort(w, ref,
                         absl::StrCat("generation ", ref.generation(), " of ", ref.job_id(),
                                      " is no longer current"),
                         txn);
    }
  }
  for (const auto& [slot, ref] : before) {
    if (w.SlotOf(ref) >= 0) continue;
    // The worker came back without a rank we assigned: that rank is gone.
    if (JobRt* job = state_.FindJob(ref.job_id()); job != nullptr) {
      AttemptRecord* attempt = job->rec.current_attempt();
      if (attempt != nullptr && !attempt->ended() && attempt->generation == ref.generation()) {
        machine_.OnRankLost(*job,
                            absl::StrCat("worker ", w.rec.name, " (rank ", ref.rank(),
                                         ") restarted without its rank"),
                            txn);
      }
    }
  }
  if (w.sink != nullptr) {
    w.state = w.busy() ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_IDLE;
  }
  return out;
}

void WorkerProtocol::Ack(WorkerRt& w, const v1::WorkerMessage& m, const absl::Status& status,
                         Txn& txn) {
  v1::CoordinatorMessage msg;
  msg.mutable_ack()->set_seq(m.seq());
  msg.mutable_ack()->set_result(AckCodeFor(status));
  msg.mutable_ack()->set_message(std::string(status.message()));
  if (w.told_heartbeat_interval_ms != heartbeat_interval_ms_) {
    msg.mutable_ack()->set_heartbeat_interval_ms(heartbeat_interval_ms_);
    w.told_heartbeat_interval_ms = heartbeat_interval_ms_;
  }
  machine_.SendTo(w, std::move(msg), txn);
}

void WorkerProtocol::Reject(WorkerRt& w, const v1::WorkerMessage& m, const absl::Status& status,
                            const std::string& reason, Txn& txn) {
  metrics_.CountRejected(reason);
  Ack(w, m, status, txn);
}

WorkerProtocol::Fenced WorkerProtocol::FenceReport(const WorkerRt& w, const v1::WorkRef& ref,
                                                   Need need) {
  Fenced out;
  auto reject = [&](const std::string& reason, std::string message) {
    out.job = nullptr;
    out.attempt = nullptr;
    out.reason = reason;
    out.error = absl::FailedPreconditionError(std::move(message));
    return out;
  };
  JobRt* job = state_.FindJob(ref.job_id());
  AttemptRecord* held = nullptr;  // The attempt of ref.generation, if `w` held ref.rank in it.
  if (job != nullptr) {
    for (auto it = job->rec.attempts.rbegin(); it != job->rec.attempts.rend(); ++it) {
      if (it->generation != ref.generation()) continue;
      if (ref.rank() >= 0 && ref.rank() < static_cast<int>(it->worker_ids.size()) &&
          it->worker_ids[ref.rank()] == w.rec.id && it->stage == ref.stage()) {
        held = &*it;
      }
      break;
    }
  }
  if (held == nullptr) {
    return reject("not_assigned", absl::StrCat("rank ", ref.rank(), " of stage index ", ref.stage(),
                                               " of ", ref.job_id(), " generation ",
                                               ref.generation(), " is not assigned to ", w.rec.id));
  }
  out.job = job;
  out.attempt = held;
  if (need == Need::kHeld) return out;
  if (ref.generation() != job->rec.generation) {
    return reject("stale_generation",
                  absl::StrCat("stale generation ", ref.generation(), " of ", ref.job_id(),
                               " (current generation is ", job->rec.generation, ")"));
  }
  if (need == Need::kExit) return out;
  const v1::JobState state = job->rec.state;
  if (need == Need::kCheckpoint) {
    if (held->outcome == v1::ATTEMPT_OUTCOME_SUCCEEDED) {
      return reject("job_not_running", absl::StrCat("generation ", ref.generation(), " of ",
                                                    ref.job_id(), " has already succeeded"));
    }
    return out;
  }
  const bool running_state = state == v1::JOB_STATE_SCHEDULING || state == v1::JOB_STATE_RUNNING ||
                             state == v1::JOB_STATE_CHECKPOINTING ||
                             (state == v1::JOB_STATE_RECOVERING && job->awaiting_reconnect);
  if (held->ended() || !running_state) {
    return reject("job_not_running",
                  absl::StrCat("generation ", ref.generation(), " of ", ref.job_id(), " has ended",
                               held->ended() ? absl::StrCat(" (", held->reason, ")")
                                             : absl::StrCat(" (job is ", StateName(state), ")")));
  }
  return out;
}

JobRt* WorkerProtocol::Accept(WorkerRt& w, const v1::WorkerMessage& m, const v1::WorkRef& ref,
                              Need need, bool abort, Txn& txn) {
  Fenced f = FenceReport(w, ref, need);
  if (f.job == nullptr) {
    Reject(w, m, f.error, f.reason, txn);
    if (abort) machine_.SendAbort(w, ref, std::string(f.error.message()), txn);
  }
  return f.job;
}

void WorkerProtocol::OnMessage(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  // Bounds first (validation.h), against the stages of the job the message names.
  const v1::WorkRef* named_ref = WorkRefOf(m);
  JobRt* named = named_ref == nullptr ? nullptr : state_.FindJob(named_ref->job_id());
  absl::Status invalid = ValidateWorkerMessage(
      m, named == nullptr ? absl::Span<const StageRecord>() : named->rec.stages);
  if (!invalid.ok()) {
    Reject(w, m, invalid, InvalidReason(m), txn);
    return;
  }
  switch (m.kind_case()) {
    case v1::WorkerMessage::kHeartbeat:
      return OnHeartbeat(w, m, txn);
    case v1::WorkerMessage::kStarted:
      return OnStarted(w, m, txn);
    case v1::WorkerMessage::kProgress:
      return OnProgress(w, m, txn);
    case v1::WorkerMessage::kLogs:
      return OnLogs(w, m, txn);
    case v1::WorkerMessage::kCheckpoint:
      return OnCheckpoint(w, m, txn);
    case v1::WorkerMessage::kEval:
      return OnEval(w, m, txn);
    case v1::WorkerMessage::kPreempting:
      return OnPreempting(w, m, txn);
    case v1::WorkerMessage::kExited:
      return OnExited(w, m, txn);
    case v1::WorkerMessage::kHello:
    case v1::WorkerMessage::KIND_NOT_SET:
      Reject(w, m, absl::InvalidArgumentError("unexpected message kind on an open session"),
             "unexpected_kind", txn);
      return;
  }
}

void WorkerProtocol::OnHeartbeat(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  const v1::Heartbeat& hb = m.heartbeat();
  std::vector<v1::RunningWork> running(hb.running_ranks().begin(), hb.running_ranks().end());
  if (running.empty() && hb.has_running()) running.push_back(hb.running());
  // A rank we assigned that it no longer runs: trust that only for ended attempts (an
  // exit report is on its way otherwise).
  for (auto it = w.slots.begin(); it != w.slots.end();) {
    const v1::WorkRef& held = it->second;
    const bool reported = std::any_of(running.begin(), running.end(), [&](const auto& r) {
      return r.ref().job_id() == held.job_id() && r.ref().generation() == held.generation() &&
             r.ref().rank() == held.rank();
    });
    JobRt* job = state_.FindJob(held.job_id());
    const AttemptRecord* a = job == nullptr ? nullptr : job->rec.current_attempt();
    if (!reported && (a == nullptr || a->ended() || a->generation != held.generation())) {
      it = w.slots.erase(it);
    } else {
      ++it;
    }
  }
  for (const v1::RunningWork& r : running) {
    const v1::WorkRef& ref = r.ref();
    JobRt* job = state_.FindJob(ref.job_id());
    const AttemptRecord* a = job == nullptr ? nullptr : job->rec.current_attempt();
    bool live = a != nullptr && !a->ended() && a->generation == ref.generation();
    if (!live) machine_.SendAbort(w, ref, "generation is no longer current", txn);
  }
  if (w.state != v1::WORKER_STATE_LOST) {
    w.state = w.busy() ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_IDLE;
  }
  if (hb.request_ack()) Ack(w, m, absl::OkStatus(), txn);
}

void WorkerProtocol::MarkStarted(JobRt& job, int rank, Txn& txn) {
  job.started_ranks.insert(rank);
  const StageRecord& stage = job.rec.stages[job.rec.stage_index];
  if (job.rec.state == v1::JOB_STATE_SCHEDULING &&
      job.started_ranks.size() == static_cast<size_t>(stage.world())) {
    machine_.SetState(
        job, v1::JOB_STATE_RUNNING,
        absl::StrCat(stage.world() == 1 ? std::string("the rank")
                                        : absl::StrCat("all ", stage.world(), " ranks"),
                     " of ", StageName(stage.index, static_cast<int>(job.rec.stages.size())),
                     " running (generation ", job.rec.generation, ")"),
        txn);
    metrics_.SetJobStage(job.rec.id, stage.index, stage.steps, stage.seq_len, stage.world());
  }
}

void WorkerProtocol::SetCheckpointEvery(JobRt& job) {
  if (metrics_.checkpoint_every == nullptr) return;
  if (job.checkpoint_every_steps < 0) {
    // The canonical spec the coordinator wrote itself (NewJobRecord): it parses.
    absl::StatusOr<spec::JobSpec> s = spec::ParseJobSpec(job.rec.spec_yaml, {});
    job.checkpoint_every_steps = s.ok() ? s->checkpoint.every_steps : 0;
  }
  // every_steps: auto: the interval the ranks were sent (0 while it is by time).
  const int64_t every =
      job.interval.sent.has_value() ? job.interval.sent->every_steps : job.checkpoint_every_steps;
  metrics_.checkpoint_every->WithLabels({job.rec.id})->Set(static_cast<double>(every));
}

void WorkerProtocol::UpdateStageEta(JobRt& job, const StageRecord& stage, int64_t step,
                                    int64_t now_steady) {
  if (metrics_.stage_eta == nullptr) return;
  if (job.eta_base_generation != job.rec.generation || job.eta_base_stage != stage.index ||
      step < job.eta_base_step) {
    job.eta_base_generation = job.rec.generation;
    job.eta_base_stage = stage.index;
    job.eta_base_step = step;
    job.eta_base_steady = now_steady;
    return;  // One report gives no rate yet.
  }
  const double elapsed_s = (now_steady - job.eta_base_steady) / 1000.0;
  const int64_t done = step - job.eta_base_step;
  if (done <= 0 || elapsed_s < 0) return;
  const double eta_s = static_cast<double>(std::max<int64_t>(0, stage.steps - step)) *
                       (elapsed_s / static_cast<double>(done));
  metrics_.stage_eta->WithLabels({job.rec.id})->Set(eta_s);
}

void WorkerProtocol::OnStarted(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  const v1::WorkRef& ref = m.started().ref();
  JobRt* job = Accept(w, m, ref, Need::kLiveAttempt, /*abort=*/true, txn);
  if (job == nullptr) return;
  MarkStarted(*job, ref.rank(), txn);
}

void WorkerProtocol::LogProgress(JobRt& job, const StageRecord& stage, const v1::StepProgress& p,
                                 int64_t now_steady, Txn& txn) {
  const int64_t every_ms = progress_log_every_ms_;
  if (every_ms <= 0) return;
  const bool last_step = stage.steps > 0 && p.step() >= stage.steps;
  if (job.last_progress_log_steady > 0 && now_steady - job.last_progress_log_steady < every_ms &&
      !last_step) {
    return;
  }
  job.last_progress_log_steady = now_steady;
  std::string text =
      absl::StrCat("progress: stage ", stage.index + 1, " of ", job.rec.stages.size(), ", step ",
                   p.step(), "/", stage.steps, ", loss ", absl::StrFormat("%.4f", p.loss()), ", ",
                   absl::StrFormat("%.0f", p.tokens_per_s()), " tokens/s");
  if (p.has_mfu()) absl::StrAppend(&text, absl::StrFormat(", MFU %.1f%%", 100 * p.mfu()));
  // Work at risk, as ulysses_checkpoint_age_seconds.
  if (const int64_t since = WorkAtRiskSinceMs(job.rec); since > 0) {
    absl::StrAppend(&text, ", checkpoint age ", std::max<int64_t>(0, NowMs() - since) / 1000, " s");
  }
  v1::LogLine line;
  line.set_stream(v1::LOG_STREAM_COORDINATOR);
  line.set_text(std::move(text));
  machine_.AddLog(job, std::move(line), txn);
}

void WorkerProtocol::OnProgress(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  const v1::WorkRef& ref = m.progress().ref();
  JobRt* job = Accept(w, m, ref, Need::kLiveAttempt, /*abort=*/true, txn);
  if (job == nullptr) return;
  job->started_ranks.insert(ref.rank());  // A rank that reports progress has started.
  StageRecord& stage = job->rec.stages[job->rec.stage_index];
  const v1::StepProgress& p = m.progress().progress();
  if (p.step() >= stage.step) {
    stage.step = p.step();
    stage.loss = p.loss();
    stage.tokens_per_s = p.tokens_per_s();
    job->rec.loss = p.loss();
    job->progress_dirty = true;
    if (ref.rank() == 0) SetStepFigures(p, &stage.figures);
  }
  if (ref.rank() == 0) {
    if (metrics_.loss) metrics_.loss->WithLabels({job->rec.id})->Set(p.loss());
    if (metrics_.tokens_per_s) {
      metrics_.tokens_per_s->WithLabels({job->rec.id})->Set(p.tokens_per_s());
    }
    if (metrics_.step) metrics_.step->WithLabels({job->rec.id})->Set(p.step());
    const int64_t now = SteadyMs();
    if (metrics_.tokens && job->last_progress_steady > 0 &&
        job->last_progress_generation == ref.generation()) {
      double dt = std::min(60.0, (now - job->last_progress_steady) / 1000.0);
      metrics_.tokens->WithLabels({job->rec.id})->Increment(p.tokens_per_s() * dt);
    }
    job->last_progress_steady = now;
    job->last_progress_generation = ref.generation();
    metrics_.SetJobStage(job->rec.id, stage.index, stage.steps, stage.seq_len, stage.world());
    machine_.AccountStep(*job, p);
    if (p.has_step_seconds() && ref.generation() == job->rec.generation) {
      machine_.OnStepSeconds(*job, p.step_seconds(), txn);
    }
    SetCheckpointEvery(*job);
    UpdateStageEta(*job, stage, p.step(), now);
    LogProgress(*job, stage, p, now, txn);
    v1::JobEvent ev;
    v1::StepProgress* sp = ev.mutable_progress();
    *sp = p;
    sp->set_stage(ref.stage());
    if (sp->steps() <= 0) sp->set_steps(stage.steps);
    if (sp->seq_len() <= 0) sp->set_seq_len(stage.seq_len);
    machine_.AddEvent(*job, std::move(ev), /*persist=*/false, txn);
  }
  MarkStarted(*job, ref.rank(), txn);
}

void WorkerProtocol::OnLogs(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  const v1::LogBatch& b = m.logs();
  JobRt* job = Accept(w, m, b.ref(), Need::kHeld, /*abort=*/false, txn);
  if (job == nullptr) return;
  // An ended job takes the last lines of the ranks still held (the agent sends them before
  // its exit report); a worker that once ran it may not append to it afterwards.
  if (job->rec.terminal() && w.SlotOf(b.ref()) < 0) {
    Reject(w, m,
           absl::FailedPreconditionError(absl::StrCat(
               b.ref().job_id(), " has ended (", StateName(job->rec.state), "): no more logs")),
           "job_not_running", txn);
    return;
  }
  for (const v1::LogLine& l : b.lines()) {
    v1::LogLine line = l;
    line.set_text(TruncateText(EscapeControl(l.text()), kMaxLogLineBytes));
    line.set_worker_id(w.rec.id);
    line.set_rank(b.ref().rank());
    line.set_generation(b.ref().generation());
    if (line.stream() == v1::LOG_STREAM_UNSPECIFIED) line.set_stream(v1::LOG_STREAM_STDERR);
    machine_.AddLog(*job, std::move(line), txn);
  }
}

void WorkerProtocol::OnCheckpoint(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  const v1::WorkRef& ref = m.checkpoint().ref();
  const v1::Checkpoint& c = m.checkpoint().checkpoint();
  JobRt* job = Accept(w, m, ref, Need::kCheckpoint, /*abort=*/false, txn);
  if (job == nullptr) return;
  // Rank 0 commits a checkpoint (it writes the manifest last) and speaks for the group: the
  // worker of another rank may not set the job's checkpoint (its final one is the result).
  if (ref.rank() != 0) {
    Reject(w, m,
           absl::PermissionDeniedError(absl::StrCat("rank ", ref.rank(), " of ", ref.job_id(),
                                                    " reported a checkpoint; only rank 0 does")),
           "checkpoint_not_rank0", txn);
    return;
  }
  if (absl::Status inside = CheckCommittedCheckpointPath("checkpoint.checkpoint.path", c.path(),
                                                         job->rec.checkpoint_dir);
      !inside.ok()) {
    Reject(w, m, inside, "checkpoint_outside_dir", txn);
    return;
  }
  const auto& last = job->rec.last_checkpoint;
  if (!last || last->stage != ref.stage() || last->step != c.step()) {
    CheckpointRecord rec;
    rec.job_id = job->rec.id;
    rec.generation = ref.generation();
    rec.stage = ref.stage();
    rec.step = c.step();
    rec.path = c.path();
    rec.bytes = c.bytes();
    rec.seconds = c.seconds();
    rec.committed_ms = NowMs();
    job->rec.last_checkpoint = rec;
    machine_.AccountCommit(*job, ref.generation(), c);
    txn.batch.checkpoints.push_back(rec);
    txn.jobs.insert(job);
    if (metrics_.checkpoint_seconds) {
      metrics_.checkpoint_seconds->WithLabels()->Observe(c.seconds());
    }
    if (metrics_.checkpoint_bytes) {
      metrics_.checkpoint_bytes->WithLabels({job->rec.id})->Set(static_cast<double>(c.bytes()));
    }
    v1::JobEvent ev;
    *ev.mutable_checkpoint() = CheckpointToProto(rec);
    machine_.AddEvent(*job, std::move(ev), true, txn);
    // every_steps: auto's cost C: periodic saves of the current stage (the stage end's save
    // is synchronous and not what the interval trades against).
    const StageRecord& stage = job->rec.stages[job->rec.stage_index];
    if (c.has_blocked_seconds() && ref.stage() == stage.index && c.step() < stage.steps) {
      machine_.OnCheckpointCost(*job, c.blocked_seconds(), txn);
    }
  }
  Ack(w, m, absl::OkStatus(), txn);
}

void WorkerProtocol::OnEval(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  const v1::EvalResult& e = m.eval().result();
  JobRt* job = Accept(w, m, m.eval().ref(), Need::kLiveAttempt, /*abort=*/true, txn);
  if (job == nullptr) return;
  int idx = m.eval().ref().stage();
  if (idx >= 0 && idx < static_cast<int>(job->rec.stages.size())) {
    StageRecord& stage = job->rec.stages[idx];
    stage.eval_loss = e.loss();
    stage.eval_accuracy = e.accuracy();
    stage.eval_seq_len = e.seq_len();
    metrics_.SetEval(job->rec.id, idx, e.loss(),
                     e.has_accuracy() ? std::optional<double>(e.accuracy()) : std::nullopt);
  }
  v1::JobEvent ev;
  *ev.mutable_eval() = e;
  ev.mutable_eval()->set_stage(idx);
  machine_.AddEvent(*job, std::move(ev), true, txn);
}

void WorkerProtocol::OnPreempting(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  w.draining = true;
  JobRt* job = Accept(w, m, m.preempting().ref(), Need::kLiveAttempt, /*abort=*/true, txn);
  if (job == nullptr) return;
  if (job->rec.state == v1::JOB_STATE_RUNNING || job->rec.state == v1::JOB_STATE_SCHEDULING) {
    machine_.SetState(*job, v1::JOB_STATE_CHECKPOINTING,
                      absl::StrCat("rank ", m.preempting().ref().rank(),
                                   " got SIGTERM; writing a preemption checkpoint"),
                      txn);
  }
}

void WorkerProtocol::OnExited(WorkerRt& w, const v1::WorkerMessage& m, Txn& txn) {
  const v1::AttemptExited& x = m.exited();
  const v1::WorkRef& ref = x.ref();
  if (w.Release(ref) && !w.busy() && w.state == v1::WORKER_STATE_BUSY) {
    w.state = v1::WORKER_STATE_IDLE;
  }
  Fenced f = FenceReport(w, ref, Need::kExit);
  if (f.job == nullptr) {
    Reject(w, m, f.error, f.reason, txn);
    return;
  }
  JobRt* job = f.job;
  AttemptRecord* a = f.attempt;
  Ack(w, m, absl::OkStatus(), txn);
  if (a->ended()) return;  // Already ended (aborted, cancelled): nothing more to decide.
  // A broken collective while a peer's worker is silent: that worker is the likely cause
  // (its attempt ends LOST now, an infrastructure failure, instead of after lost_after_s).
  if (x.exit_code() == contract::kExitPeerLost && x.signal() == 0 && !x.aborted() &&
      !x.preempted() && job->preempting_for.empty() &&
      machine_.LoseSuspectPeers(*a,
                                absl::StrCat("rank ", ref.rank(), " of ", ref.job_id(),
                                             " lost a peer (exit ", contract::kExitPeerLost, ")"),
                                txn)) {
    return;
  }
  std::string detail =
      x.error_message().empty()
          ? ""
          : absl::StrCat(": ", TruncateText(EscapeControl(x.error_message()), kMaxReasonBytes));
  const contract::StopRequest stop = x.aborted()     ? contract::StopRequest::kAbort
                                     : x.preempted() ? contract::StopRequest::kPreempt
                                                     : contract::StopRequest::kNone;
  const contract::ProcessExit exit{x.exit_code(), x.signal()};
  const std::string how = x.signal() != 0 ? absl::StrCat("was killed by signal ", x.signal())
                          : x.exit_code() == contract::kExitPeerLost
                              ? absl::StrCat("exited ", x.exit_code(), " (lost a peer)")
                              : absl::StrCat("exited ", x.exit_code());
  contract::RankOutcome outcome = contract::OutcomeOf(exit, stop);
  // A rank of an attempt the coordinator is preempting for priority that stops in any way
  // but finishing its stage (exit 75, SIGKILL after the grace, a worker too old to know
  // Abort.preempt) is preempted: the job resumes from its last checkpoint, no failure.
  if (!job->preempting_for.empty() && outcome != contract::RankOutcome::kSucceeded) {
    outcome = contract::RankOutcome::kPreempted;
  }
  switch (outcome) {
    case contract::RankOutcome::kSucceeded: {
      job->done_ranks.insert(ref.rank());
      if (job->done_ranks.size() != a->worker_ids.size()) break;
      // The job's result is its final checkpoint: an exit 0 without it (a worker that
      // claims success, an engine that skipped the commit) is a failure, not SUCCEEDED.
      const StageRecord& stage = job->rec.stages[job->rec.stage_index];
      const auto& last = job->rec.last_checkpoint;
      const bool final_stage = job->rec.stage_index + 1 == static_cast<int>(job->rec.stages.size());
      if (final_stage && (!last || last->stage != stage.index || last->step != stage.steps)) {
        machine_.OnRankFailure(
            *job, v1::ATTEMPT_OUTCOME_FAILED, x.exit_code(),
            absl::StrCat("all ranks of the final stage (",
                         StageName(stage.index, static_cast<int>(job->rec.stages.size())),
                         ") exited 0 without a committed checkpoint of its last step (step ",
                         stage.steps, "; the last committed is ",
                         last ? absl::StrCat("stage ", last->stage + 1, " step ", last->step)
                              : std::string("none"),
                         ")"),
            "rank_failed", contract::FailureKind::kApplication, txn);
        break;
      }
      // The claim must hold on disk: rank 0's manifest of that step, with its shards.
      if (final_stage) {
        if (absl::Status on_disk = VerifyFinalCheckpoint(
                {last->path, job->rec.tenant, job->rec.id, stage.index, stage.steps});
            !on_disk.ok()) {
          machine_.OnRankFailure(
              *job, v1::ATTEMPT_OUTCOME_FAILED, x.exit_code(),
              absl::StrCat("all ranks of the final stage (",
                           StageName(stage.index, static_cast<int>(job->rec.stages.size())),
                           ") exited 0, but ", on_disk.message()),
              "rank_failed", contract::FailureKind::kApplication, txn);
          break;
        }
      }
      machine_.CompleteStage(*job, txn);
      break;
    }
    case contract::RankOutcome::kPreempted:
      machine_.OnRankPreempted(*job, ref.rank(), x.exit_code(), how, txn);
      break;
    case contract::RankOutcome::kBadInput:
      machine_.OnRankFailure(*job, v1::ATTEMPT_OUTCOME_BAD_INPUT, x.exit_code(),
                             absl::StrCat("rank ", ref.rank(), " rejected its input (exit ",
                                          contract::kExitBadInput, ")", detail),
                             "bad_input", contract::FailureKind::kApplication, txn);
      break;
    case contract::RankOutcome::kFailed:
      machine_.OnRankFailure(*job, v1::ATTEMPT_OUTCOME_FAILED, x.exit_code(),
                             absl::StrCat("rank ", ref.rank(), " ", how, detail), "rank_failed",
                             contract::FailureKindOf(exit), txn);
      break;
    case contract::RankOutcome::kAborted:  // Its worker stopped it; this attempt needs it.
      machine_.OnRankFailure(
          *job, v1::ATTEMPT_OUTCOME_FAILED, x.exit_code(),
          absl::StrCat("rank ", ref.rank(), " ", how, " (stopped by its worker)", detail),
          "rank_failed", contract::FailureKind::kInfrastructure, txn);
      break;
  }
}

}  // namespace ulysses::coordinator
