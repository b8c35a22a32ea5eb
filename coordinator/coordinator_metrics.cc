#include "coordinator/coordinator_metrics.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/metrics/build_info.h"
#include "common/metrics/catalog.h"

namespace ulysses::coordinator {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

absl::StatusOr<JobSeries> ParseJobSeries(const std::string& field, const std::string& value) {
  for (JobSeries p : {JobSeries::kAll, JobSeries::kNone, JobSeries::kLabels}) {
    if (value == JobSeriesName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": \"", value,
      "\" is not a job-series policy; use all (per-job series), none (cluster-wide only) or "
      "labels (per-job series with a tenant label)"));
}

const char* JobSeriesName(JobSeries policy) {
  switch (policy) {
    case JobSeries::kAll:
      return "all";
    case JobSeries::kNone:
      return "none";
    case JobSeries::kLabels:
      return "labels";
  }
  return "all";
}

std::vector<metrics::FamilySnapshot> ApplyJobSeries(
    std::vector<metrics::FamilySnapshot> families, JobSeries policy,
    const std::map<std::string, std::string>& tenant_of) {
  if (policy == JobSeries::kAll) return families;
  std::vector<metrics::FamilySnapshot> out;
  out.reserve(families.size());
  for (metrics::FamilySnapshot& family : families) {
    const bool had_samples = !family.samples.empty();
    std::vector<metrics::Sample> kept;
    kept.reserve(family.samples.size());
    for (metrics::Sample& sample : family.samples) {
      auto job = std::find_if(sample.labels.begin(), sample.labels.end(),
                              [](const auto& label) { return label.first == "job_id"; });
      if (job == sample.labels.end()) {
        kept.push_back(std::move(sample));
        continue;
      }
      if (policy == JobSeries::kNone) continue;
      auto tenant = tenant_of.find(job->second);
      // Right after job_id, before a histogram's `le` (which stays last).
      sample.labels.insert(job + 1,
                           {"tenant", tenant == tenant_of.end() ? std::string() : tenant->second});
      kept.push_back(std::move(sample));
    }
    if (had_samples && kept.empty()) continue;
    family.samples = std::move(kept);
    out.push_back(std::move(family));
  }
  return out;
}

std::vector<metrics::CallbackSample> JobStateSamples(const std::map<v1::JobState, int>& counts) {
  std::vector<metrics::CallbackSample> out;
  for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
    auto state = static_cast<v1::JobState>(s);
    std::string name = v1::JobState_Name(state).substr(sizeof("JOB_STATE_") - 1);
    auto it = counts.find(state);
    out.push_back({{Lower(name)}, it == counts.end() ? 0.0 : static_cast<double>(it->second)});
  }
  return out;
}

std::vector<metrics::CallbackSample> WorkerStateSamples(
    const std::map<v1::WorkerState, int>& counts) {
  std::vector<metrics::CallbackSample> out;
  for (int s = v1::WORKER_STATE_IDLE; s <= v1::WORKER_STATE_SUSPECT; ++s) {
    auto state = static_cast<v1::WorkerState>(s);
    std::string name = v1::WorkerState_Name(state).substr(sizeof("WORKER_STATE_") - 1);
    auto it = counts.find(state);
    out.push_back({{Lower(name)}, it == counts.end() ? 0.0 : static_cast<double>(it->second)});
  }
  return out;
}

std::unique_ptr<CoordinatorMetrics> CoordinatorMetrics::Register(
    metrics::Registry* registry, std::function<StateCounts(CountsPart)> counts) {
  std::unique_ptr<CoordinatorMetrics> m(new CoordinatorMetrics);
  const bool shared = registry != nullptr;
  if (!shared) {
    m->owned_ = std::make_unique<metrics::Registry>();
    registry = m->owned_.get();
  }
  auto must = [](auto status_or) {
    if (!status_or.ok()) ULOG(ERROR) << "metric registration: " << status_or.status();
    return status_or.ok() ? *status_or : nullptr;
  };
  auto check = [](const absl::Status& s) {
    if (!s.ok()) ULOG(ERROR) << "metric registration: " << s;
  };
  m->gang_wait = must(metrics::RegisterHistogram(registry, "ulysses_gang_wait_seconds"));
  m->scheduling_pass =
      must(metrics::RegisterHistogram(registry, "ulysses_scheduling_pass_seconds"));
  m->wanted_workers = must(metrics::RegisterGauge(registry, "ulysses_wanted_workers"));
  m->restarts = must(metrics::RegisterCounter(registry, "ulysses_job_restarts_total"));
  m->preemptions = must(metrics::RegisterCounter(registry, "ulysses_preemptions_total"));
  m->preemption_lost_gpu_seconds =
      must(metrics::RegisterCounter(registry, "ulysses_preemption_lost_gpu_seconds_total"));
  // Both reasons exist from the start (0), so rate() and increase() see them on a healthy cluster.
  for (const char* reason : {"priority", "worker"}) {
    m->preemptions->WithLabels({reason});
    m->preemption_lost_gpu_seconds->WithLabels({reason});
  }
  m->productive_gpu_seconds =
      must(metrics::RegisterCounter(registry, "ulysses_productive_gpu_seconds_total"));
  m->lost_gpu_seconds = must(metrics::RegisterCounter(registry, "ulysses_lost_gpu_seconds_total"));
  if (m->productive_gpu_seconds) m->productive_gpu_seconds->WithLabels({});
  for (int r = 0; r < kLostReasons && m->lost_gpu_seconds; ++r) {
    m->lost_gpu_seconds->WithLabels({LostReasonName(static_cast<LostReason>(r))});
  }
  m->recovery = must(metrics::RegisterHistogram(registry, "ulysses_recovery_duration_seconds"));
  m->stage_transitions =
      must(metrics::RegisterCounter(registry, "ulysses_stage_transitions_total"));
  m->checkpoint_seconds =
      must(metrics::RegisterHistogram(registry, "ulysses_checkpoint_save_duration_seconds"));
  m->checkpoint_bytes = must(metrics::RegisterGauge(registry, "ulysses_checkpoint_bytes"));
  m->store_writable = must(metrics::RegisterGauge(registry, "ulysses_store_writable"));
  m->heartbeat_timeout =
      must(metrics::RegisterGauge(registry, "ulysses_heartbeat_timeout_seconds"));
  m->heartbeat_interval =
      must(metrics::RegisterGauge(registry, "ulysses_heartbeat_interval_seconds"));
  m->cancel_grace = must(metrics::RegisterGauge(registry, "ulysses_cancel_grace_seconds"));
  m->checkpoint_every = must(metrics::RegisterGauge(registry, "ulysses_checkpoint_every_steps"));
  m->store_write_errors =
      must(metrics::RegisterCounter(registry, "ulysses_store_write_errors_total"));
  m->SetStoreWritable(true);
  m->loss = must(metrics::RegisterGauge(registry, "ulysses_train_loss"));
  m->tokens_per_s = must(metrics::RegisterGauge(registry, "ulysses_train_tokens_per_second"));
  m->step = must(metrics::RegisterGauge(registry, "ulysses_train_step"));
  m->tokens = must(metrics::RegisterCounter(registry, "ulysses_train_tokens_total"));
  m->steps = must(metrics::RegisterGauge(registry, "ulysses_train_steps"));
  m->stage = must(metrics::RegisterGauge(registry, "ulysses_train_stage"));
  m->seq_len = must(metrics::RegisterGauge(registry, "ulysses_train_seq_len"));
  m->group_size = must(metrics::RegisterGauge(registry, "ulysses_train_group_size"));
  m->stage_eta = must(metrics::RegisterGauge(registry, "ulysses_stage_eta_seconds"));
  m->eval_loss = must(metrics::RegisterGauge(registry, "ulysses_eval_loss"));
  m->eval_accuracy = must(metrics::RegisterGauge(registry, "ulysses_eval_accuracy"));
  m->rejected_reports = must(metrics::RegisterCounter(registry, "ulysses_rejected_reports_total"));
  check(metrics::RegisterCallbackGaugeFamily(registry, "ulysses_jobs", [counts] {
    return JobStateSamples(counts(CountsPart::kJobs).jobs_by_state);
  }));
  check(metrics::RegisterCallbackGauge(registry, "ulysses_queue_length", [counts] {
    return static_cast<double>(counts(CountsPart::kQueue).queued_jobs);
  }));
  check(metrics::RegisterCallbackGaugeFamily(registry, "ulysses_workers", [counts] {
    return WorkerStateSamples(counts(CountsPart::kWorkers).workers_by_state);
  }));
  check(metrics::RegisterCallbackGaugeFamily(registry, "ulysses_worker_slots", [counts] {
    const StateCounts c = counts(CountsPart::kWorkers);
    return std::vector<metrics::CallbackSample>{
        {{"busy"}, static_cast<double>(c.busy_slots)},
        {{"free"}, static_cast<double>(c.free_slots)},
        {{"unavailable"}, static_cast<double>(c.unavailable_slots)}};
  }));
  auto per_key = [counts](CountsPart part) {
    StateCounts c = counts(part);
    auto& pairs = part == CountsPart::kHeartbeats       ? c.heartbeat_ages_s
                  : part == CountsPart::kCheckpointAges ? c.checkpoint_ages_s
                                                        : c.goodput_ratios;
    std::vector<metrics::CallbackSample> out;
    for (auto& [key, age] : pairs) out.push_back({{key}, age});
    return out;
  };
  check(
      metrics::RegisterCallbackGaugeFamily(registry, "ulysses_worker_heartbeat_age_seconds",
                                           [per_key] { return per_key(CountsPart::kHeartbeats); }));
  check(metrics::RegisterCallbackGaugeFamily(registry, "ulysses_checkpoint_age_seconds", [per_key] {
    return per_key(CountsPart::kCheckpointAges);
  }));
  check(metrics::RegisterCallbackGaugeFamily(registry, "ulysses_job_goodput_ratio",
                                             [per_key] { return per_key(CountsPart::kGoodput); }));
  if (shared) {
    // build_info belongs to the process; registered once by whoever owns the registry.
    absl::Status s = metrics::RegisterBuildInfo(registry);
    if (!s.ok() && !absl::IsAlreadyExists(s)) ULOG(ERROR) << s;
  }
  return m;
}

void CoordinatorMetrics::ForgetJob(const std::string& job_id) {
  for (metrics::GaugeFamily* f : {checkpoint_bytes, loss, tokens_per_s, step, steps, stage, seq_len,
                                  group_size, stage_eta, checkpoint_every}) {
    if (f) f->Remove({job_id});
  }
  if (tokens) tokens->Remove({job_id});
  for (metrics::GaugeFamily* f : {eval_loss, eval_accuracy}) {
    if (f) f->RemoveIf([&](const std::vector<std::string>& v) { return v[0] == job_id; });
  }
}

void CoordinatorMetrics::SetJobStage(const std::string& job_id, int stage_index, int64_t steps_n,
                                     int64_t seq_len_n, int group) {
  // Stage numbers a person reads are 1-based (docs/CONTRACTS.md, "Stage numbers").
  if (stage) stage->WithLabels({job_id})->Set(stage_index + 1);
  if (steps) steps->WithLabels({job_id})->Set(static_cast<double>(steps_n));
  if (seq_len) seq_len->WithLabels({job_id})->Set(static_cast<double>(seq_len_n));
  if (group_size) group_size->WithLabels({job_id})->Set(group);
}

void CoordinatorMetrics::SetSettings(double heartbeat_timeout_s, double cancel_grace_s) {
  if (heartbeat_timeout) heartbeat_timeout->WithLabels({})->Set(heartbeat_timeout_s);
  if (cancel_grace) cancel_grace->WithLabels({})->Set(cancel_grace_s);
}

void CoordinatorMetrics::SetHeartbeatInterval(double seconds) {
  if (heartbeat_interval) heartbeat_interval->WithLabels({})->Set(seconds);
}

void CoordinatorMetrics::SetEval(const std::string& job_id, int stage_index, double loss_value,
                                 std::optional<double> accuracy) {
  const std::string s = std::to_string(stage_index + 1);  // the 1-based stage label
  if (eval_loss) eval_loss->WithLabels({job_id, s})->Set(loss_value);
  if (eval_accuracy && accuracy.has_value()) eval_accuracy->WithLabels({job_id, s})->Set(*accuracy);
}

void CoordinatorMetrics::CountGoodput(const GoodputDelta& delta) {
  if (productive_gpu_seconds && delta.productive_gpu_s > 0) {
    productive_gpu_seconds->WithLabels({})->Increment(delta.productive_gpu_s);
  }
  for (int r = 0; r < kLostReasons && lost_gpu_seconds; ++r) {
    if (delta.lost_gpu_s[r] > 0) {
      lost_gpu_seconds->WithLabels({LostReasonName(static_cast<LostReason>(r))})
          ->Increment(delta.lost_gpu_s[r]);
    }
  }
}

void CoordinatorMetrics::CountRestart(const std::string& reason) {
  if (restarts) restarts->WithLabels({reason})->Increment();
}

void CoordinatorMetrics::CountRejected(const std::string& reason) {
  if (rejected_reports) rejected_reports->WithLabels({reason})->Increment();
}

void CoordinatorMetrics::SetStoreWritable(bool writable) {
  if (store_writable != nullptr) store_writable->WithLabels({})->Set(writable ? 1 : 0);
}

void CoordinatorMetrics::CountStoreWriteError(const std::string& kind) {
  if (store_write_errors != nullptr) store_write_errors->WithLabels({kind})->Increment();
}

}  // namespace ulysses::coordinator
