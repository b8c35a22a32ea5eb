#include "coordinator/views.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/failure_budget.h"
#include "coordinator/runtime.h"
#include "google/protobuf/util/time_util.h"

namespace ulysses::coordinator {
namespace {

void SetTime(int64_t ms, google::protobuf::Timestamp* ts) {
  if (ms > 0) *ts = google::protobuf::util::TimeUtil::MillisecondsToTimestamp(ms);
}

}  // namespace

std::string CheckpointText(const JobRecord& job) {
  if (!job.last_checkpoint) return "the start of the stage (no committed checkpoint)";
  return absl::StrCat("the checkpoint of stage ", job.last_checkpoint->stage + 1, " of ",
                      job.stages.size(), " at step ", job.last_checkpoint->step);
}

v1::Checkpoint CheckpointToProto(const CheckpointRecord& c) {
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

std::vector<std::string> PlacementWarnings(const AttemptRecord& a, int sp) {
  std::vector<std::string> out;
  if (sp < 1 || a.node_labels.size() != a.worker_ids.size()) return out;
  for (size_t first = 0; first + sp <= a.node_labels.size(); first += sp) {
    std::vector<std::string> labels;
    for (size_t r = first; r < first + sp; ++r) {
      if (std::find(labels.begin(), labels.end(), a.node_labels[r]) == labels.end()) {
        labels.push_back(a.node_labels[r]);
      }
    }
    if (labels.size() > 1) {
      out.push_back(absl::StrCat("SP group ", first / sp, " (ranks ", first, "-", first + sp - 1,
                                 ") spans nodes ", absl::StrJoin(labels, ", "),
                                 ": its all-to-all crosses the network (no node had ", sp,
                                 " free slots)"));
    }
  }
  return out;
}

v1::Attempt AttemptToProto(const AttemptRecord& a, int sp) {
  v1::Attempt p;
  p.set_generation(a.generation);
  p.set_stage(a.stage);
  for (const auto& w : a.worker_ids) p.add_worker_ids(w);
  for (int slot : a.slots) p.add_slots(slot);
  for (const auto& d : a.devices) p.add_devices(d);
  for (const auto& l : a.node_labels) p.add_node_labels(l);
  for (std::string& w : PlacementWarnings(a, sp)) p.add_warnings(std::move(w));
  p.set_master_addr(a.master_addr);
  p.set_master_port(a.master_port);
  SetTime(a.started_ms, p.mutable_started_at());
  SetTime(a.ended_ms, p.mutable_ended_at());
  p.set_outcome(a.outcome);
  p.set_exit_code(a.exit_code);
  p.set_reason(a.reason);
  return p;
}

v1::Job JobToProto(const JobRecord& r, bool full) {
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
      v1::StepProgress* progress = st->mutable_progress();
      progress->set_stage(s.index);
      progress->set_step(s.step);
      progress->set_steps(s.steps);
      progress->set_loss(s.loss);
      progress->set_tokens_per_s(s.tokens_per_s);
      progress->set_seq_len(s.seq_len);
      progress->MergeFrom(s.figures);  // The timing figures, when rank 0 reported them.
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
  if (r.last_checkpoint) *p.mutable_last_checkpoint() = CheckpointToProto(*r.last_checkpoint);
  if (r.state == v1::JOB_STATE_RUNNING || r.state == v1::JOB_STATE_CHECKPOINTING) {
    if (const int64_t since = WorkAtRiskSinceMs(r); since > 0) {
      SetTime(since, p.mutable_work_at_risk_since());
    }
  }
  p.set_loss(r.loss);
  if (full) {
    // Newest first until the budget is spent, then back in generation order.
    std::vector<v1::Attempt> newest;
    size_t bytes = 0;
    for (auto it = r.attempts.rbegin(); it != r.attempts.rend(); ++it) {
      const int sp = it->stage >= 0 && it->stage < static_cast<int>(r.stages.size())
                         ? r.stages[it->stage].sp
                         : 1;
      v1::Attempt a = AttemptToProto(*it, sp);
      bytes += a.ByteSizeLong();
      if (!newest.empty() && bytes > kMaxAttemptsViewBytes) break;
      newest.push_back(std::move(a));
    }
    for (auto it = newest.rbegin(); it != newest.rend(); ++it) *p.add_attempts() = std::move(*it);
  }
  p.set_generation(r.generation);
  p.set_spec_yaml(r.spec_yaml);
  p.set_checkpoint_dir(r.checkpoint_dir);
  p.set_max_failures(r.max_failures);
  p.set_max_preemptions(r.max_preemptions);
  p.set_node_label(r.node_label);
  p.set_infra_failures(r.infra_failures);
  p.set_max_infra_failures(r.max_infra_failures);
  p.set_failure_window_s(r.failure_window_s);
  p.set_counting_failures(CountingFailures(r, /*infra=*/false, NowMs()));
  p.set_counting_infra_failures(CountingFailures(r, /*infra=*/true, NowMs()));
  p.set_preemptible(r.preemptible);
  *p.mutable_goodput() = GoodputToProto(r.goodput, NowMs());
  return p;
}

v1::Worker WorkerToProto(const WorkerRt& w, int64_t now_steady_ms, int64_t now_unix_ms) {
  v1::Worker p;
  p.set_id(w.rec.id);
  p.set_name(w.rec.name);
  p.set_node_label(w.rec.node_label);
  p.set_device(w.rec.device);
  p.set_host(w.rec.host);
  p.set_capacity(w.rec.capacity);
  p.set_state(w.state);
  p.set_draining(w.draining);
  p.set_fabric(w.fabric);
  for (const std::string& d : w.rec.devices) p.add_devices(d);
  for (const auto& [slot, ref] : w.slots) {
    v1::RunningWork* running = p.add_running_ranks();
    *running->mutable_ref() = ref;
    running->set_slot(slot);
  }
  if (p.running_ranks_size() > 0) *p.mutable_running() = p.running_ranks(0);
  SetTime(w.rec.registered_ms, p.mutable_registered_at());
  const int64_t age_ms = std::max<int64_t>(0, now_steady_ms - w.last_seen_steady);
  SetTime(now_unix_ms - age_ms, p.mutable_last_heartbeat_at());
  p.set_heartbeat_age_seconds(age_ms / 1000.0);
  return p;
}

}  // namespace ulysses::coordinator
