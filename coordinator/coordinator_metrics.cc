#include "coordinator/coordinator_metrics.h"

#include <cctype>
#include <utility>

#include "common/logging.h"
#include "common/metrics/build_info.h"

namespace ulysses::coordinator {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

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
  for (int s = v1::WORKER_STATE_IDLE; s <= v1::WORKER_STATE_LOST; ++s) {
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
  m->gang_wait = must(
      registry->AddHistogram("ulysses_gang_wait_seconds",
                             "Time a job waited in the queue until its whole group was placed.", {},
                             metrics::ExponentialBuckets(0.5, 2, 12)));
  m->restarts = must(registry->AddCounter(
      "ulysses_job_restarts_total", "Group restarts after a failure, by reason.", {"reason"}));
  m->preemptions = must(registry->AddCounter(
      "ulysses_preemptions_total",
      "Attempts preempted (ranks checkpointed and exited 75), by reason: priority (the "
      "coordinator made room for a higher-priority job) or worker (a worker got SIGTERM).",
      {"reason"}));
  m->preemption_lost_gpu_seconds = must(registry->AddCounter(
      "ulysses_preemption_lost_gpu_seconds_total",
      "Work lost to preemptions: world size x seconds from the last committed checkpoint (or "
      "the attempt's start) to the preemption, by reason.",
      {"reason"}));
  m->recovery =
      must(registry->AddHistogram("ulysses_recovery_duration_seconds",
                                  "Time from a group breaking (RECOVERING) until it runs again.",
                                  {}, metrics::ExponentialBuckets(0.5, 2, 12)));
  m->stage_transitions = must(registry->AddCounter(
      "ulysses_stage_transitions_total", "Stages completed (moves to the next stage or success)."));
  m->checkpoint_seconds = must(registry->AddHistogram("ulysses_checkpoint_save_duration_seconds",
                                                      "Wall time of committed checkpoint saves.",
                                                      {}, metrics::ExponentialBuckets(0.5, 2, 12)));
  m->checkpoint_bytes =
      must(registry->AddGauge("ulysses_checkpoint_bytes",
                              "Size of the last committed checkpoint per live job.", {"job_id"}));
  m->store_writable = must(registry->AddGauge(
      "ulysses_store_writable",
      "1 while the coordinator's state store accepts writes, 0 while it is read-only after an "
      "I/O error (the coordinator is NOT_SERVING until a probe write succeeds).",
      {}));
  m->store_write_errors = must(registry->AddCounter(
      "ulysses_store_write_errors_total",
      "State store writes that failed: kind=io (read-only until a probe write succeeds) or "
      "kind=refused (the data was refused; only that request failed).",
      {"kind"}));
  m->SetStoreWritable(true);
  m->loss = must(registry->AddGauge("ulysses_train_loss",
                                    "Last reported training loss per live job.", {"job_id"}));
  m->tokens_per_s = must(registry->AddGauge("ulysses_train_tokens_per_second",
                                            "Last reported throughput per live job.", {"job_id"}));
  m->step = must(registry->AddGauge(
      "ulysses_train_step", "Last reported step of the current stage per live job.", {"job_id"}));
  m->tokens = must(registry->AddCounter(
      "ulysses_train_tokens_total",
      "Tokens trained per live job since the coordinator started (reported throughput "
      "integrated between rank-0 progress reports).",
      {"job_id"}));
  m->rejected_reports = must(registry->AddCounter(
      "ulysses_rejected_reports_total",
      "Worker session messages rejected (dropped, answered with an error Ack), by reason.",
      {"reason"}));
  check(registry->AddCallbackGaugeFamily("ulysses_jobs", "Jobs by state.", {"state"}, [counts] {
    return JobStateSamples(counts(CountsPart::kJobs).jobs_by_state);
  }));
  check(registry->AddCallbackGauge(
      "ulysses_queue_length", "Jobs waiting for placement (PENDING, PREEMPTED, RECOVERING).",
      [counts] { return static_cast<double>(counts(CountsPart::kQueue).queued_jobs); }));
  check(registry->AddCallbackGaugeFamily(
      "ulysses_workers", "Workers by state.", {"state"},
      [counts] { return WorkerStateSamples(counts(CountsPart::kWorkers).workers_by_state); }));
  check(registry->AddCallbackGaugeFamily(
      "ulysses_worker_heartbeat_age_seconds",
      "Seconds since the last message from each non-lost worker.", {"worker"}, [counts] {
        std::vector<metrics::CallbackSample> out;
        for (auto& [worker, age] : counts(CountsPart::kHeartbeats).heartbeat_ages_s) {
          out.push_back({{worker}, age});
        }
        return out;
      }));
  if (shared) {
    // build_info belongs to the process; registered once by whoever owns the registry.
    absl::Status s = metrics::RegisterBuildInfo(registry);
    if (!s.ok() && !absl::IsAlreadyExists(s)) ULOG(ERROR) << s;
  }
  return m;
}

void CoordinatorMetrics::ForgetJob(const std::string& job_id) {
  for (metrics::GaugeFamily* f : {checkpoint_bytes, loss, tokens_per_s, step}) {
    if (f) f->Remove({job_id});
  }
  if (tokens) tokens->Remove({job_id});
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
