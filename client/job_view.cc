#include "client/job_view.h"

#include <algorithm>
#include <ctime>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/goodput_view.h"
#include "common/spec/job_spec_parser.h"
#include "ulysses/v1/enum_names.h"

namespace ulysses::client {
namespace {

namespace v1 = ::ulysses::v1;
using nlohmann::json;

std::string StripPrefix(const std::string& name, const std::string& prefix) {
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

std::string TimeString(const google::protobuf::Timestamp& ts) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return "";
  const time_t secs = static_cast<time_t>(ts.seconds());
  tm utc;
  gmtime_r(&secs, &utc);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

json TimeJson(const google::protobuf::Timestamp& ts) {
  std::string s = TimeString(ts);
  return s.empty() ? json(nullptr) : json(s);
}

std::string Duration(double seconds) {
  if (seconds < 0) return "-";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

// The 1-based stage number a person reads for the 0-based `index` (docs/CONTRACTS.md
// "Stage numbers"): text and JSON alike.
int StageNumber(int index) { return index + 1; }

// The job's current stage number, 1..stages (a SUCCEEDED job's is its last).
int CurrentStageNumber(const v1::Job& job) {
  return std::max(1, std::min(job.stage_index() + 1, job.stages_size()));
}

// The global step a checkpoint directory is named by ("step-00000080": 80; CHECKPOINTS.md);
// nullopt for another name.
std::optional<int64_t> GlobalStepOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() <= 5 || base.compare(0, 5, "step-") != 0) return std::nullopt;
  int64_t n = 0;
  for (size_t i = 5; i < base.size(); ++i) {
    if (base[i] < '0' || base[i] > '9' || n > (INT64_MAX - 9) / 10) return std::nullopt;
    n = n * 10 + (base[i] - '0');
  }
  return n;
}

// "stage 2 of 3, step 20 (global step 80)": where a checkpoint was taken.
std::string CheckpointWhere(const v1::Checkpoint& c, int stages) {
  const std::optional<int64_t> global = GlobalStepOf(c.path());
  return absl::StrCat("stage ", StageNumber(c.stage()), " of ", stages, ", step ", c.step(),
                      global ? absl::StrCat(" (global step ", *global, ")") : std::string());
}

const v1::StageStatus* CurrentStage(const v1::Job& job) {
  if (job.stages_size() == 0) return nullptr;
  const int index = std::min(job.stage_index(), job.stages_size() - 1);
  return &job.stages(std::max(index, 0));
}

json CheckpointJson(const v1::Checkpoint& c) {
  const std::optional<int64_t> global = GlobalStepOf(c.path());
  return json{{"path", c.path()},
              {"stage", StageNumber(c.stage())},
              {"step", c.step()},
              {"global_step", global ? json(*global) : json(nullptr)},
              {"bytes", c.bytes()},
              {"seconds", c.seconds()},
              {"generation", c.generation()},
              {"committed_at", TimeJson(c.committed_at())}};
}

// Where each rank ran: worker, slot, device and node (the last three when known).
json PlacementJson(const v1::Attempt& a) {
  json out = json::array();
  for (int r = 0; r < a.worker_ids_size(); ++r) {
    out.push_back(json{{"rank", r},
                       {"worker", a.worker_ids(r)},
                       {"slot", r < a.slots_size() ? a.slots(r) : 0},
                       {"device", r < a.devices_size() ? a.devices(r) : ""},
                       {"node", r < a.node_labels_size() ? a.node_labels(r) : ""}});
  }
  return out;
}

// The attempt ended with a rank's exit code: not while it runs, nor when it was cancelled,
// lost or aborted (its ranks were stopped, not exited on their own).
bool AttemptExited(const v1::Attempt& a) {
  return a.has_ended_at() && (a.outcome() == v1::ATTEMPT_OUTCOME_SUCCEEDED ||
                              a.outcome() == v1::ATTEMPT_OUTCOME_FAILED ||
                              a.outcome() == v1::ATTEMPT_OUTCOME_BAD_INPUT ||
                              a.outcome() == v1::ATTEMPT_OUTCOME_PREEMPTED);
}

json ConditionJson(const v1::JobCondition& c) {
  return json{{"type", c.type()},
              {"status", c.status()},
              {"reason", c.reason()},
              {"message", c.message()},
              {"stage", StageNumber(c.stage())},
              {"last_transition_time", TimeJson(c.last_transition_time())}};
}

// "Unschedulable (ClusterTooSmall): stage 3 of 3 needs 4 slots ..." / "... no longer holds".
std::string ConditionText(const v1::JobCondition& c) {
  return c.status() ? absl::StrCat(c.type(), " (", c.reason(), "): ", c.message())
                    : absl::StrCat(c.type(), ": no longer holds");
}

json AttemptJson(const v1::Attempt& a) {
  return json{
      {"generation", a.generation()},
      {"stage", StageNumber(a.stage())},
      {"world_size", a.worker_ids_size()},
      {"worker_ids", std::vector<std::string>(a.worker_ids().begin(), a.worker_ids().end())},
      {"placement", PlacementJson(a)},
      {"warnings", std::vector<std::string>(a.warnings().begin(), a.warnings().end())},
      {"master", absl::StrCat(a.master_addr(), ":", a.master_port())},
      {"outcome", OutcomeName(a.outcome())},
      {"exit_code", AttemptExited(a) ? json(a.exit_code()) : json(nullptr)},
      {"reason", a.reason()},
      {"started_at", TimeJson(a.started_at())},
      {"ended_at", TimeJson(a.ended_at())}};
}

// The optional timing figures of a step (StepProgress 7..11), as JSON values.
std::vector<std::pair<const char*, std::optional<json>>> StepFigures(const v1::StepProgress& p) {
  auto number = [](bool has, double v) { return has ? std::optional<json>(v) : std::nullopt; };
  return {
      {"mfu", number(p.has_mfu(), p.mfu())},
      {"step_seconds", number(p.has_step_seconds(), p.step_seconds())},
      {"median_step_seconds", number(p.has_median_step_seconds(), p.median_step_seconds())},
      {"slowest_rank", p.has_slowest_rank() ? std::optional<json>(p.slowest_rank()) : std::nullopt},
      {"slowest_step_seconds", number(p.has_slowest_step_seconds(), p.slowest_step_seconds())},
  };
}

// The work a failure now would lose, in seconds: for a running job since the coordinator's
// work_at_risk_since (the rule ulysses_checkpoint_age_seconds follows), otherwise since the last
// committed checkpoint; std::nullopt without either.
std::optional<double> CheckpointAgeSeconds(const v1::Job& job, int64_t now_unix_ms) {
  const google::protobuf::Timestamp* since = nullptr;
  if (job.has_work_at_risk_since()) {
    since = &job.work_at_risk_since();  // a running job: the coordinator's rule (the metric's)
  } else if (job.has_last_checkpoint() && !job.last_checkpoint().path().empty() &&
             job.last_checkpoint().has_committed_at()) {
    since = &job.last_checkpoint().committed_at();
  } else {
    return std::nullopt;
  }
  const int64_t since_ms = since->seconds() * 1000 + since->nanos() / 1'000'000;
  return std::max<int64_t>(0, now_unix_ms - since_ms) / 1000.0;
}

}  // namespace

json JobEventJson(const v1::JobEvent& e) {
  json j{{"sequence", e.sequence()}, {"time", TimeJson(e.time())}};
  switch (e.kind_case()) {
    case v1::JobEvent::kStateChange:
      j["type"] = "state_change";
      j["from"] = e.state_change().from() == v1::JOB_STATE_UNSPECIFIED
                      ? json(nullptr)  // The job's first state: it was submitted.
                      : json(JobStateName(e.state_change().from()));
      j["to"] = JobStateName(e.state_change().to());
      j["reason"] = e.state_change().reason();
      break;
    case v1::JobEvent::kProgress:
      j["type"] = "progress";
      j["stage"] = StageNumber(e.progress().stage());
      j["step"] = e.progress().step();
      j["steps"] = e.progress().steps();
      j["loss"] = e.progress().loss();
      j["tokens_per_s"] = e.progress().tokens_per_s();
      for (const auto& [key, value] : StepFigures(e.progress())) {
        if (value.has_value()) j[key] = *value;
      }
      break;
    case v1::JobEvent::kCheckpoint:
      j["type"] = "checkpoint";
      j["checkpoint"] = CheckpointJson(e.checkpoint());
      break;
    case v1::JobEvent::kEval:
      j["type"] = "eval";
      j["stage"] = StageNumber(e.eval().stage());
      j["step"] = e.eval().step();
      j["seq_len"] = e.eval().seq_len();
      j["loss"] = e.eval().loss();
      // Only an evaluation that measures accuracy has one (the needle task).
      j["accuracy"] = e.eval().has_accuracy() ? json(e.eval().accuracy()) : json(nullptr);
      break;
    case v1::JobEvent::kCondition:
      j["type"] = "condition";
      j["condition"] = ConditionJson(e.condition());
      break;
    case v1::JobEvent::kReason:
      j["type"] = "reason";
      j["reason"] = e.reason();
      break;
    case v1::JobEvent::kAttemptStarted:
      j["type"] = "attempt_started";
      j["attempt"] = AttemptJson(e.attempt_started());
      break;
    case v1::JobEvent::kAttemptEnded:
      j["type"] = "attempt_ended";
      j["attempt"] = AttemptJson(e.attempt_ended());
      break;
    case v1::JobEvent::kSnapshot:
      j["type"] = "snapshot";
      break;
    default:
      j["type"] = "unknown";
  }
  return j;
}

namespace {

// `stages`: the job's stage count ("stage 2 of 3").
std::string EventText(const v1::JobEvent& e, int stages) {
  switch (e.kind_case()) {
    case v1::JobEvent::kStateChange:
      return absl::StrCat(e.state_change().from() == v1::JOB_STATE_UNSPECIFIED
                              ? std::string("submitted")
                              : JobStateName(e.state_change().from()),
                          " -> ", JobStateName(e.state_change().to()),
                          e.state_change().reason().empty() ? "" : ": ", e.state_change().reason());
    case v1::JobEvent::kCheckpoint:
      return absl::StrCat("checkpoint ", CheckpointWhere(e.checkpoint(), stages), ": ",
                          e.checkpoint().path());
    case v1::JobEvent::kEval:
      return absl::StrCat(
          absl::StrFormat("eval stage %d of %d step %d seq %d loss %.4f",
                          StageNumber(e.eval().stage()), stages, e.eval().step(),
                          e.eval().seq_len(), e.eval().loss()),
          e.eval().has_accuracy() ? absl::StrFormat(" accuracy %.3f", e.eval().accuracy()) : "");
    case v1::JobEvent::kCondition:
      return absl::StrCat(e.condition().status() ? "warning: " : "", ConditionText(e.condition()));
    case v1::JobEvent::kReason:
      return absl::StrCat("waiting: ", e.reason());
    case v1::JobEvent::kAttemptStarted:
      return absl::StrCat("attempt gen ", e.attempt_started().generation(), " of stage ",
                          StageNumber(e.attempt_started().stage()), " of ", stages, " started on ",
                          absl::StrJoin(e.attempt_started().worker_ids(), ","),
                          e.attempt_started().warnings_size() == 0 ? "" : "; warning: ",
                          absl::StrJoin(e.attempt_started().warnings(), "; warning: "));
    case v1::JobEvent::kAttemptEnded:
      return absl::StrCat("attempt gen ", e.attempt_ended().generation(), " ended ",
                          OutcomeName(e.attempt_ended().outcome()),
                          e.attempt_ended().reason().empty() ? "" : ": ",
                          e.attempt_ended().reason());
    case v1::JobEvent::kProgress:
      return absl::StrFormat("stage %d of %d step %d/%d loss %.4f",
                             StageNumber(e.progress().stage()), stages, e.progress().step(),
                             e.progress().steps(), e.progress().loss());
    default:
      return "";
  }
}

}  // namespace

std::string JobStateName(v1::JobState state) {
  return StripPrefix(v1::JobState_Name(state), "JOB_STATE_");
}
std::string StageStateName(v1::StageState state) {
  return StripPrefix(v1::StageState_Name(state), "STAGE_STATE_");
}
std::string OutcomeName(v1::AttemptOutcome outcome) {
  return StripPrefix(v1::AttemptOutcome_Name(outcome), "ATTEMPT_OUTCOME_");
}
std::string WorkerStateName(v1::WorkerState state) {
  return StripPrefix(v1::WorkerState_Name(state), "WORKER_STATE_");
}
std::string WorkerStateLabel(const v1::Worker& w) {
  const std::string state = WorkerStateName(w.state());
  return w.draining() ? state + ",DRAINING" : state;
}
bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

json JobSummaryJson(const v1::Job& job) {
  const v1::StageStatus* stage = CurrentStage(job);
  json j{{"id", job.id()},
         {"name", job.name()},
         {"state", JobStateName(job.state())},
         {"reason", job.reason()},
         {"stage", CurrentStageNumber(job)},
         {"stages_total", job.stages_size()},
         {"seq_len", stage ? stage->seq_len() : 0},
         {"step", stage ? stage->progress().step() : 0},
         {"steps", stage ? stage->steps() : 0},
         {"restarts", job.restarts()},
         {"preemptions", job.preemptions()},
         {"failures", job.failures()},
         {"generation", job.generation()},
         {"priority", job.priority()},
         {"loss", job.loss()},
         {"created_at", TimeJson(job.created_at())},
         {"finished_at", TimeJson(job.finished_at())}};
  j["last_checkpoint"] = job.has_last_checkpoint() && !job.last_checkpoint().path().empty()
                             ? CheckpointJson(job.last_checkpoint())
                             : json(nullptr);
  j["goodput"] = GoodputJson(job.goodput());
  json conditions = json::array();
  for (const v1::JobCondition& c : job.conditions()) conditions.push_back(ConditionJson(c));
  j["conditions"] = conditions;
  return j;
}

namespace {

// The job's spec, from the canonical YAML GetJob returns with include_spec (nullopt when the
// coordinator sent none or it does not parse: the view then leaves the training fields out).
std::optional<spec::JobSpec> JobSpecOf(const v1::Job& job) {
  if (job.spec_yaml().empty()) return std::nullopt;
  absl::StatusOr<spec::JobSpec> s = spec::ParseJobSpec(job.spec_yaml());
  if (!s.ok()) return std::nullopt;
  return *std::move(s);
}

json EvalJson(const spec::EvalSpec& e) { return json(spec::AllFieldsJson(e)); }

// "every 200 steps and at the stage end, 64 sequences" / "at the stage end, all sequences".
std::string EvalText(const spec::EvalSpec& e) {
  return absl::StrCat(
      e.every_steps > 0 ? absl::StrCat("every ", e.every_steps, " steps and ") : "",
      "at the stage end, ",
      e.max_sequences > 0 ? absl::StrCat("at most ", e.max_sequences) : std::string("all"),
      " validation sequences");
}

std::string DataText(const spec::DataSpec& d) {
  if (d.synthetic) {
    return absl::StrCat("synthetic ", d.synthetic->generator, " (",
                        d.synthetic->validation_sequences, " validation sequences)");
  }
  std::string text = absl::StrCat(d.format, " ", d.train);
  if (!d.validation.empty()) absl::StrAppend(&text, " (validation ", d.validation, ")");
  if (d.format == "indexed") {
    absl::StrAppend(&text, d.packing ? ", documents packed" : ", one document per sequence");
  }
  return text;
}

// Sequences per optimizer step of stage i: micro_batch_size x grad_accum_steps x dp.
int64_t GlobalBatch(const spec::JobSpec& s, size_t i) {
  return s.optimizer.micro_batch_size * s.optimizer.grad_accum_steps * s.StageDp(i);
}

// spec.checkpoint.every_steps: auto's interval (Job.checkpoint_interval): what and why.
std::string IntervalText(const v1::CheckpointInterval& i) {
  std::string every;
  if (i.every_steps() > 0) absl::StrAppend(&every, "every ", i.every_steps(), " step(s)");
  if (i.every_seconds() > 0) {
    absl::StrAppend(&every, every.empty() ? "" : ", ",
                    absl::StrFormat("every %.1f s", i.every_seconds()));
  }
  return absl::StrCat(every.empty() ? "stage ends only" : every, " (auto, version ", i.version(),
                      ")");
}
std::string IntervalWhy(const v1::CheckpointInterval& i) {
  const std::string mtbf = absl::StrFormat("MTBF %.0f s for %d GPU(s) (%s)", i.mtbf_seconds(),
                                           i.group_gpus(), i.mtbf_source());
  if (i.cost_source() == "none") {
    return absl::StrCat("C not measured yet: every step until the first checkpoint; ", mtbf);
  }
  std::string why = absl::StrFormat("T = sqrt(2 x C x MTBF) = %.1f s; C %.3f s (%s); %s",
                                    i.interval_seconds(), i.cost_seconds(), i.cost_source(), mtbf);
  if (i.step_seconds() > 0) {
    absl::StrAppend(&why, absl::StrFormat("; step %.3f s", i.step_seconds()));
  } else {
    absl::StrAppend(&why, "; no step time yet (sent in seconds)");
  }
  return why;
}
json IntervalJson(const v1::CheckpointInterval& i) {
  return {{"version", i.version()},
          {"every_steps", i.every_steps()},
          {"every_seconds", i.every_seconds()},
          {"interval_seconds", i.interval_seconds()},
          {"cost_seconds", i.cost_seconds()},
          {"cost_source", i.cost_source()},
          {"mtbf_seconds", i.mtbf_seconds()},
          {"mtbf_source", i.mtbf_source()},
          {"step_seconds", i.step_seconds()},
          {"group_gpus", i.group_gpus()},
          {"reason", i.reason()}};
}

}  // namespace

json JobDetailJson(const v1::Job& job) {
  json j = JobSummaryJson(job);
  j["checkpoint_dir"] = job.checkpoint_dir();
  if (job.has_checkpoint_interval())
    j["checkpoint_interval"] = IntervalJson(job.checkpoint_interval());
  j["max_failures"] = job.max_failures();
  j["max_preemptions"] = job.max_preemptions();
  j["infra_failures"] = job.infra_failures();
  j["max_infra_failures"] = job.max_infra_failures();
  j["failure_window_s"] = job.failure_window_s();
  j["counting_failures"] = job.counting_failures();
  j["counting_infra_failures"] = job.counting_infra_failures();
  j["preemptible"] = job.preemptible();
  json stages = json::array();
  for (const auto& s : job.stages()) {
    stages.push_back(
        json{{"stage", StageNumber(s.index())},
             {"state", StageStateName(s.state())},
             {"seq_len", s.seq_len()},
             {"steps", s.steps()},
             {"step", s.progress().step()},
             {"sp", s.sp()},
             {"dp", s.dp()},
             {"world_size", s.sp() * std::max(1, s.dp())},
             {"loss", s.progress().loss()},
             {"tokens_per_s", s.progress().tokens_per_s()},
             {"eval_loss", s.eval().loss()},
             {"eval_accuracy", s.eval().has_accuracy() ? json(s.eval().accuracy()) : json(nullptr)},
             {"eval_seq_len", s.eval().seq_len()},
             {"attempts", s.attempts()},
             {"started_at", TimeJson(s.started_at())},
             {"finished_at", TimeJson(s.finished_at())}});
  }
  if (std::optional<spec::JobSpec> sp = JobSpecOf(job)) {
    j["data"] = json(spec::AllFieldsJson(sp->data));
    j["batch"] = json{{"micro_batch_size", sp->optimizer.micro_batch_size},
                      {"grad_accum_steps", sp->optimizer.grad_accum_steps}};
    j["eval"] = EvalJson(sp->eval);
    for (size_t i = 0; i < sp->stages.size() && i < stages.size(); ++i) {
      stages[i]["global_batch"] = GlobalBatch(*sp, i);
      stages[i]["eval_spec"] = EvalJson(sp->StageEval(i));
    }
  }
  j["stages"] = stages;
  json attempts = json::array();
  for (const auto& a : job.attempts()) attempts.push_back(AttemptJson(a));
  j["attempts"] = attempts;
  json events = json::array();
  json checkpoints = json::array();
  for (const auto& e : job.events()) {
    events.push_back(JobEventJson(e));
    if (e.has_checkpoint()) checkpoints.push_back(CheckpointJson(e.checkpoint()));
  }
  j["events"] = events;
  j["checkpoints"] = checkpoints;
  return j;
}

json WorkerJson(const v1::Worker& w) {
  json j{{"id", w.id()},
         {"name", w.name()},
         {"state", WorkerStateName(w.state())},
         {"draining", w.draining()},
         {"device", w.device()},
         {"devices", std::vector<std::string>(w.devices().begin(), w.devices().end())},
         {"capacity", w.capacity()},
         {"node", w.node_label()},
         {"fabric", w.fabric() == v1::FABRIC_UNSPECIFIED ? "" : v1::FabricName(w.fabric())},
         {"host", w.host()},
         {"heartbeat_age_seconds", w.heartbeat_age_seconds()}};
  if (w.has_running() && !w.running().ref().job_id().empty()) {
    j["running"] = json{{"job_id", w.running().ref().job_id()},
                        {"generation", w.running().ref().generation()},
                        {"stage", StageNumber(w.running().ref().stage())},
                        {"rank", w.running().ref().rank()},
                        {"pid", w.running().pid()}};
  } else {
    j["running"] = nullptr;
  }
  json ranks = json::array();
  for (const v1::RunningWork& r : w.running_ranks()) {
    ranks.push_back(json{{"job_id", r.ref().job_id()},
                         {"generation", r.ref().generation()},
                         {"stage", StageNumber(r.ref().stage())},
                         {"rank", r.ref().rank()},
                         {"slot", r.slot()},
                         {"pid", r.pid()}});
  }
  j["running_ranks"] = ranks;
  return j;
}

void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

// The job's reason, and each condition that holds and the reason does not already say.
std::string ReasonWithConditions(const v1::Job& job) {
  std::string out = job.reason();
  for (const v1::JobCondition& c : job.conditions()) {
    if (!c.status() || out.find(c.message()) != std::string::npos) continue;
    absl::StrAppend(&out, out.empty() ? "" : "; ", ConditionText(c));
  }
  return out;
}

void PrintJobsTable(const std::vector<v1::Job>& jobs, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "STAGE", "SEQ_LEN", "STEP", "LOSS", "RESTARTS", "PREEMPT", "REASON"}};
  for (const auto& job : jobs) {
    const v1::StageStatus* stage = CurrentStage(job);
    rows.push_back({job.id(), job.name(), JobStateName(job.state()),
                    absl::StrCat(CurrentStageNumber(job), "/", job.stages_size()),
                    stage ? absl::StrCat(stage->seq_len()) : "-",
                    stage ? absl::StrCat(stage->progress().step(), "/", stage->steps()) : "-",
                    job.loss() > 0 ? absl::StrFormat("%.4f", job.loss()) : "-",
                    absl::StrCat(job.restarts()), absl::StrCat(job.preemptions()),
                    ReasonWithConditions(job)});
  }
  PrintTable(rows, out);
}

bool ShownInTop(const v1::Job& job, bool include_ended) {
  if (job.state() == v1::JOB_STATE_UNSPECIFIED) return false;
  return include_ended || !IsTerminal(job.state());
}

std::vector<std::vector<std::string>> TopTable(const std::vector<v1::Job>& jobs,
                                               int64_t now_unix_ms, bool include_ended) {
  std::vector<std::vector<std::string>> rows = {{"JOB", "NAME", "STATE", "STAGE", "SEQ_LEN", "STEP",
                                                 "LOSS", "TOK/S", "MFU", "SLOWEST", "CKPT_AGE",
                                                 "GOODPUT"}};
  for (const v1::Job& job : jobs) {
    if (!ShownInTop(job, include_ended)) continue;
    const v1::StageStatus* stage = CurrentStage(job);
    const bool progress = stage != nullptr && stage->has_progress();
    const v1::StepProgress p = progress ? stage->progress() : v1::StepProgress();
    const std::optional<double> age = CheckpointAgeSeconds(job, now_unix_ms);
    rows.push_back({job.id(), job.name(), JobStateName(job.state()),
                    absl::StrCat(CurrentStageNumber(job), "/", job.stages_size()),
                    stage ? absl::StrCat(stage->seq_len()) : "-",
                    stage ? absl::StrCat(p.step(), "/", stage->steps()) : "-",
                    progress ? absl::StrFormat("%.4f", p.loss()) : "-",
                    progress ? absl::StrFormat("%.0f", p.tokens_per_s()) : "-",
                    progress && p.has_mfu() ? absl::StrFormat("%.1f%%", p.mfu() * 100) : "-",
                    progress && p.has_slowest_rank()
                        ? absl::StrFormat("r%d %.3fs", p.slowest_rank(), p.slowest_step_seconds())
                        : "-",
                    age.has_value() ? Duration(*age) : "-", GoodputCell(job.goodput())});
  }
  return rows;
}

json TopJson(const std::vector<v1::Job>& jobs, int64_t now_unix_ms, bool include_ended) {
  json list = json::array();
  for (const v1::Job& job : jobs) {
    if (!ShownInTop(job, include_ended)) continue;
    const v1::StageStatus* stage = CurrentStage(job);
    const v1::StepProgress p =
        stage != nullptr && stage->has_progress() ? stage->progress() : v1::StepProgress();
    json j{{"id", job.id()},
           {"name", job.name()},
           {"state", JobStateName(job.state())},
           {"stage", stage ? StageNumber(stage->index()) : CurrentStageNumber(job)},
           {"stages_total", job.stages_size()},
           {"seq_len", stage ? stage->seq_len() : 0},
           {"step", p.step()},
           {"steps", stage ? stage->steps() : 0},
           {"loss", p.loss()},
           {"tokens_per_s", p.tokens_per_s()}};
    for (const auto& [key, value] : StepFigures(p)) j[key] = value.value_or(json(nullptr));
    const std::optional<double> age = CheckpointAgeSeconds(job, now_unix_ms);
    j["checkpoint_age_seconds"] = age.has_value() ? json(*age) : json(nullptr);
    j["goodput_ratio"] =
        job.goodput().allocated_gpu_seconds() > 0 ? json(job.goodput().ratio()) : json(nullptr);
    list.push_back(std::move(j));
  }
  return list;
}

void PrintWorkersTable(const std::vector<v1::Worker>& workers, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "ID", "STATE", "SLOTS", "DEVICES", "NODE", "HOST", "RUNNING", "HEARTBEAT"}};
  for (const auto& w : workers) {
    // One entry per running rank ("job-000001 g3 s0 r1@2": rank 1 on slot 2).
    std::vector<std::string> running;
    for (const v1::RunningWork& r : w.running_ranks()) {
      const auto& ref = r.ref();
      running.push_back(absl::StrCat(ref.job_id(), " g", ref.generation(), " s",
                                     StageNumber(ref.stage()), " r", ref.rank(),
                                     w.capacity() > 1 ? absl::StrCat("@", r.slot()) : ""));
    }
    if (running.empty() && w.has_running() && !w.running().ref().job_id().empty()) {
      const auto& ref = w.running().ref();
      running.push_back(absl::StrCat(ref.job_id(), " g", ref.generation(), " s",
                                     StageNumber(ref.stage()), " r", ref.rank()));
    }
    const int capacity = std::max(1, w.capacity());
    std::string devices = w.devices_size() > 0 ? absl::StrJoin(w.devices(), ",") : w.device();
    rows.push_back(
        {w.name(), w.id(), WorkerStateLabel(w),
         absl::StrCat(capacity - static_cast<int>(running.size()), "/", capacity, " free"), devices,
         w.node_label(), w.host(), running.empty() ? "-" : absl::StrJoin(running, "; "),
         absl::StrFormat("%.1fs ago", w.heartbeat_age_seconds())});
  }
  PrintTable(rows, out);
}

void PrintJobDescription(const v1::Job& job, std::ostream& out) {
  out << "Job:          " << job.id() << " (" << job.name() << ")\n";
  out << "State:        " << JobStateName(job.state())
      << (job.reason().empty() ? "" : "  (" + job.reason() + ")") << "\n";
  for (const v1::JobCondition& c : job.conditions()) {
    if (c.status()) out << "Condition:    " << ConditionText(c) << "\n";
  }
  out << "Priority:     " << job.priority() << "\n";
  out << "Created:      " << TimeString(job.created_at()) << "\n";
  if (!TimeString(job.finished_at()).empty()) {
    out << "Finished:     " << TimeString(job.finished_at()) << "\n";
  }
  out << "Generation:   " << job.generation() << "\n";
  out << "Restarts:     " << job.restarts() << "   Preemptions: " << job.preemptions()
      << "   Failures: " << job.failures() << " application, " << job.infra_failures()
      << " infrastructure\n";
  out << "Budgets:      " << job.counting_failures() << " of max_failures " << job.max_failures()
      << ", " << job.counting_infra_failures() << " of max_infra_failures "
      << job.max_infra_failures() << " counting (since the last new checkpoint"
      << (job.failure_window_s() > 0 ? absl::StrCat(", within ", job.failure_window_s(), "s") : "")
      << ")" << (job.preemptible() ? "" : "; not preemptible") << "\n";
  out << "Goodput:      " << GoodputText(job.goodput()) << "\n";
  out << "Checkpoints:  " << job.checkpoint_dir() << "\n";
  if (job.has_checkpoint_interval()) {
    out << "Ckpt every:   " << IntervalText(job.checkpoint_interval()) << "\n";
    out << "  why:        " << IntervalWhy(job.checkpoint_interval()) << "\n";
  }
  if (job.has_last_checkpoint() && !job.last_checkpoint().path().empty()) {
    out << "Last ckpt:    " << CheckpointWhere(job.last_checkpoint(), job.stages_size()) << "  "
        << job.last_checkpoint().path() << "\n";
  }
  const std::optional<spec::JobSpec> sp = JobSpecOf(job);
  if (sp) {
    out << "Data:         " << DataText(sp->data) << "\n";
    out << "Batch:        micro_batch_size " << sp->optimizer.micro_batch_size
        << " x grad_accum_steps " << sp->optimizer.grad_accum_steps
        << " x dp sequences per step (BATCH below)\n";
    out << "Eval:         " << EvalText(sp->eval) << "\n";
    for (size_t i = 0; i < sp->stages.size(); ++i) {
      if (sp->stages[i].eval)
        out << "  stage " << i + 1 << ":     " << EvalText(*sp->stages[i].eval) << "\n";
    }
  }
  out << "\nStages:\n";
  std::vector<std::vector<std::string>> rows = {{"  #", "STATE", "SEQ_LEN", "SP", "DP", "BATCH",
                                                 "STEP", "LOSS", "EVAL_LOSS", "ACCURACY",
                                                 "ATTEMPTS"}};
  for (const auto& s : job.stages()) {
    const size_t i = static_cast<size_t>(std::max(0, s.index()));
    rows.push_back({absl::StrCat("  ", StageNumber(s.index())), StageStateName(s.state()),
                    absl::StrCat(s.seq_len()), absl::StrCat(s.sp()), absl::StrCat(s.dp()),
                    sp && i < sp->stages.size() ? absl::StrCat(GlobalBatch(*sp, i)) : "-",
                    absl::StrCat(s.progress().step(), "/", s.steps()),
                    s.has_progress() ? absl::StrFormat("%.4f", s.progress().loss()) : "-",
                    s.has_eval() ? absl::StrFormat("%.4f", s.eval().loss()) : "-",
                    s.has_eval() && s.eval().has_accuracy()
                        ? absl::StrFormat("%.3f", s.eval().accuracy())
                        : "-",
                    absl::StrCat(s.attempts())});
  }
  PrintTable(rows, out);
  out << "\nAttempts:\n";
  rows = {{"  GEN", "STAGE", "WORKERS", "OUTCOME", "EXIT", "STARTED", "ENDED", "REASON"}};
  for (const auto& a : job.attempts()) {
    rows.push_back({absl::StrCat("  ", a.generation()), absl::StrCat(StageNumber(a.stage())),
                    absl::StrJoin(a.worker_ids(), ","), OutcomeName(a.outcome()),
                    AttemptExited(a) ? absl::StrCat(a.exit_code()) : "-",
                    TimeString(a.started_at()), TimeString(a.ended_at()), a.reason()});
  }
  PrintTable(rows, out);
  if (job.attempts_size() > 0) {
    // Where each rank of the newest attempt runs (ran), and why the placement is poor.
    const v1::Attempt& a = job.attempts(job.attempts_size() - 1);
    out << "\nPlacement (generation " << a.generation() << "):\n";
    rows = {{"  RANK", "WORKER", "SLOT", "DEVICE", "NODE"}};
    for (const json& p : PlacementJson(a)) {
      rows.push_back({absl::StrCat("  ", p["rank"].get<int>()), p["worker"].get<std::string>(),
                      absl::StrCat(p["slot"].get<int>()),
                      p["device"].get<std::string>().empty() ? "-" : p["device"].get<std::string>(),
                      p["node"].get<std::string>().empty() ? "-" : p["node"].get<std::string>()});
    }
    PrintTable(rows, out);
    for (const std::string& w : a.warnings()) out << "  Warning: " << w << "\n";
  }
  out << "\nEvents:\n";
  for (const auto& e : job.events()) {
    if (e.has_progress()) continue;  // Progress is summarised in the stage table.
    out << "  " << TimeString(e.time()) << "  " << EventText(e, job.stages_size()) << "\n";
  }
}

void WatchView::OnEvent(const v1::JobEvent& event) {
  if (event.has_snapshot()) {
    job_ = event.snapshot();
    has_snapshot_ = true;
    if (!tty_) {
      out_ << job_.id() << " " << job_.name() << ": " << JobStateName(job_.state())
           << (job_.reason().empty() ? "" : " (" + job_.reason() + ")") << "\n";
      for (const v1::JobCondition& c : job_.conditions()) {
        if (c.status()) out_ << "warning: " << ConditionText(c) << "\n";
      }
    }
  } else if (event.has_progress()) {
    const auto& p = event.progress();
    if (p.stage() >= 0 && p.stage() < job_.stages_size()) {
      v1::StageStatus* s = job_.mutable_stages(p.stage());
      *s->mutable_progress() = p;
      if (p.steps() > 0) s->set_steps(p.steps());
      if (s->state() == v1::STAGE_STATE_PENDING) s->set_state(v1::STAGE_STATE_RUNNING);
      job_.set_stage_index(p.stage());
      job_.set_loss(p.loss());
      auto it = first_progress_.find(p.stage());
      if (it == first_progress_.end()) {
        first_progress_[p.stage()] = {std::chrono::steady_clock::now(), p.step()};
      }
      if (!tty_) out_ << StageLine(*s) << "\n";
    }
  } else if (event.has_state_change()) {
    job_.set_state(event.state_change().to());
    job_.set_reason(event.state_change().reason());
    if (!tty_) out_ << "state " << EventText(event, job_.stages_size()) << "\n";
  } else if (event.has_reason()) {
    job_.set_reason(event.reason());
    if (!tty_) out_ << EventText(event, job_.stages_size()) << "\n";
  } else if (event.has_condition()) {
    job_.clear_conditions();
    if (event.condition().status()) *job_.add_conditions() = event.condition();
    if (!tty_) out_ << EventText(event, job_.stages_size()) << "\n";
  } else if (event.has_eval()) {
    const auto& e = event.eval();
    if (e.stage() >= 0 && e.stage() < job_.stages_size()) {
      *job_.mutable_stages(e.stage())->mutable_eval() = e;
    }
    if (!tty_) out_ << EventText(event, job_.stages_size()) << "\n";
  } else if (event.has_checkpoint()) {
    *job_.mutable_last_checkpoint() = event.checkpoint();
    if (!tty_) out_ << EventText(event, job_.stages_size()) << "\n";
  } else if (event.has_attempt_started() || event.has_attempt_ended()) {
    if (event.has_attempt_ended()) {
      const auto& a = event.attempt_ended();
      if (a.outcome() == v1::ATTEMPT_OUTCOME_SUCCEEDED && a.stage() < job_.stages_size()) {
        v1::StageStatus* s = job_.mutable_stages(a.stage());
        s->set_state(v1::STAGE_STATE_COMPLETED);
        s->mutable_progress()->set_step(s->steps());
      }
    } else if (event.attempt_started().stage() < job_.stages_size()) {
      job_.set_stage_index(event.attempt_started().stage());
      job_.mutable_stages(event.attempt_started().stage())->set_state(v1::STAGE_STATE_RUNNING);
    }
    if (!tty_) out_ << EventText(event, job_.stages_size()) << "\n";
  }
  if (tty_) Redraw();
  out_.flush();
}

std::string WatchView::StageLine(const v1::StageStatus& s) {
  const int64_t steps = std::max<int64_t>(s.steps(), 1);
  const int64_t step = std::min<int64_t>(s.progress().step(), steps);
  std::string eta = "-";
  auto it = first_progress_.find(s.index());
  if (s.state() == v1::STAGE_STATE_COMPLETED) {
    eta = "done";
  } else if (it != first_progress_.end() && step > it->second.second) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.first).count();
    eta = Duration(elapsed / static_cast<double>(step - it->second.second) *
                   static_cast<double>(steps - step));
  }
  std::string line = absl::StrFormat("stage %d/%d seq %6d sp %d", s.index() + 1, job_.stages_size(),
                                     s.seq_len(), s.sp());
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * step / steps);
    line += absl::StrCat(" [", std::string(filled, '#'), std::string(kWidth - filled, '.'), "]");
  }
  line += absl::StrFormat(" step %d/%d", step, s.steps());
  const v1::StepProgress& p = s.progress();
  if (p.loss() > 0) line += absl::StrFormat(" loss %.4f", p.loss());
  if (p.tokens_per_s() > 0) line += absl::StrFormat(" tok/s %.0f", p.tokens_per_s());
  line += " ETA " + eta;
  if (s.has_eval()) line += absl::StrFormat(" eval_loss %.4f", s.eval().loss());
  if (s.has_eval() && s.eval().has_accuracy()) {
    line += absl::StrFormat(" acc %.3f", s.eval().accuracy());
  }
  return line;
}

void WatchView::Redraw() {
  if (!has_snapshot_) return;
  std::string block;
  if (drawn_lines_ > 0) block += absl::StrCat("\033[", drawn_lines_, "F");  // Up, column 0.
  int lines = 0;
  block += absl::StrCat("\033[2K", job_.id(), " ", job_.name(), ": ", JobStateName(job_.state()),
                        job_.reason().empty() ? "" : " (" + job_.reason() + ")", "\n");
  ++lines;
  for (const v1::JobCondition& c : job_.conditions()) {
    if (!c.status()) continue;
    block += absl::StrCat("\033[2K  warning: ", ConditionText(c), "\n");
    ++lines;
  }
  for (const auto& s : job_.stages()) {
    block += absl::StrCat("\033[2K  ", StageLine(s), "\n");
    ++lines;
  }
  block += "\033[J";  // Lines a shorter block left from the last draw.
  drawn_lines_ = lines;
  out_ << block;
}

v1::JobState WatchView::Finish() {
  out_ << job_.id() << " finished: " << JobStateName(job_.state())
       << (job_.reason().empty() ? "" : " (" + job_.reason() + ")") << "\n";
  out_.flush();
  return job_.state();
}

}  // namespace ulysses::client
