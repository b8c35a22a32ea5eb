// The coordinator's metrics: the families it updates as jobs and workers change, and the
// scrape-time gauges computed from its state. Every name comes from the catalogue
// (common/metrics/catalog.h, documented in docs/METRICS.md).
#ifndef ULYSSES_COORDINATOR_COORDINATOR_METRICS_H_
#define ULYSSES_COORDINATOR_COORDINATOR_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"
#include "common/metrics/text_format.h"
#include "coordinator/goodput.h"
#include "ulysses/v1/types.pb.h"

namespace ulysses::coordinator {

// Counts the scrape-time gauges are computed from, taken under the coordinator's lock.
struct StateCounts {
  std::map<v1::JobState, int> jobs_by_state;
  std::map<v1::WorkerState, int> workers_by_state;
  // Slots of the workers not LOST: busy, free (schedulable), unavailable (kWorkers).
  int64_t busy_slots = 0;
  int64_t free_slots = 0;
  int64_t unavailable_slots = 0;
  int queued_jobs = 0;                                            // PENDING, PREEMPTED, RECOVERING.
  std::vector<std::pair<std::string, double>> heartbeat_ages_s;   // Per non-lost worker.
  std::vector<std::pair<std::string, double>> checkpoint_ages_s;  // Per running job.
  std::vector<std::pair<std::string, double>> goodput_ratios;     // Per live job (goodput.h).
};

// Which part of StateCounts a gauge reads, so a scrape takes only what it needs.
enum class CountsPart { kJobs, kWorkers, kQueue, kHeartbeats, kCheckpointAges, kGoodput };

class CoordinatorMetrics {
 public:
  // Registers every family in `registry`; with a null `registry` the families live in a
  // private one (a Coordinator without metrics still counts). `counts(part)` is called
  // at scrape time from the scraping thread (it must be thread-safe and take its own
  // lock); the returned object must not outlive the Coordinator the callback reads.
  // Registration errors are logged, and the failing family stays null (not counted).
  static std::unique_ptr<CoordinatorMetrics> Register(
      metrics::Registry* registry, std::function<StateCounts(CountsPart)> counts);

  // Removes the per-job series of a job that ended.
  void ForgetJob(const std::string& job_id);

  metrics::HistogramFamily* gang_wait = nullptr;
  metrics::HistogramFamily* scheduling_pass = nullptr;
  metrics::GaugeFamily* wanted_workers = nullptr;                 // pool_demand.h WantedWorkers.
  metrics::CounterFamily* restarts = nullptr;                     // {reason}
  metrics::CounterFamily* preemptions = nullptr;                  // {reason: priority | worker}
  metrics::CounterFamily* preemption_lost_gpu_seconds = nullptr;  // {reason}
  metrics::HistogramFamily* recovery = nullptr;
  metrics::CounterFamily* stage_transitions = nullptr;
  metrics::HistogramFamily* checkpoint_seconds = nullptr;
  metrics::GaugeFamily* checkpoint_bytes = nullptr;    // {job_id}
  metrics::GaugeFamily* loss = nullptr;                // {job_id}
  metrics::GaugeFamily* tokens_per_s = nullptr;        // {job_id}
  metrics::GaugeFamily* step = nullptr;                // {job_id}
  metrics::CounterFamily* tokens = nullptr;            // {job_id}
  metrics::CounterFamily* rejected_reports = nullptr;  // {reason}
  metrics::GaugeFamily* store_writable = nullptr;      // 1 writable, 0 read-only.
  metrics::GaugeFamily* heartbeat_timeout = nullptr;   // Settings, no labels.
  metrics::GaugeFamily* heartbeat_interval = nullptr;  // The interval asked of workers now.
  metrics::GaugeFamily* cancel_grace = nullptr;
  metrics::CounterFamily* store_write_errors = nullptr;      // {kind: io | refused}
  metrics::GaugeFamily* steps = nullptr;                     // {job_id}
  metrics::GaugeFamily* stage = nullptr;                     // {job_id}
  metrics::GaugeFamily* seq_len = nullptr;                   // {job_id}
  metrics::GaugeFamily* group_size = nullptr;                // {job_id}
  metrics::GaugeFamily* stage_eta = nullptr;                 // {job_id}
  metrics::GaugeFamily* eval_loss = nullptr;                 // {job_id, stage}
  metrics::GaugeFamily* eval_accuracy = nullptr;             // {job_id, stage}
  metrics::GaugeFamily* checkpoint_every = nullptr;          // {job_id}
  metrics::CounterFamily* productive_gpu_seconds = nullptr;  // Goodput (goodput.h).
  metrics::CounterFamily* lost_gpu_seconds = nullptr;        // {reason}

  // Null-safe helpers.
  // What one goodput call classified (ulysses_productive/lost_gpu_seconds_total).
  void CountGoodput(const GoodputDelta& delta);
  void CountRestart(const std::string& reason);
  void CountRejected(const std::string& reason);
  void SetStoreWritable(bool writable);
  void CountStoreWriteError(const std::string& kind);
  // The shape of the job's current stage (its index, steps, seq_len and ranks).
  void SetJobStage(const std::string& job_id, int stage, int64_t steps, int64_t seq_len,
                   int group_size);
  // The settings the alerts read (heartbeat_timeout_s, cancel_grace_s).
  void SetSettings(double heartbeat_timeout_s, double cancel_grace_s);
  // ulysses_heartbeat_interval_seconds (set by the tick: max_heartbeats_per_s).
  void SetHeartbeatInterval(double seconds);
  // A stage's evaluation; `accuracy` only when the evaluation measured it.
  void SetEval(const std::string& job_id, int stage, double loss, std::optional<double> accuracy);

 private:
  std::unique_ptr<metrics::Registry> owned_;
};

// metrics.job_series: what the coordinator's /metrics says about single jobs (docs/METRICS.md
// "Per-job series"). The listener has no authentication, so whoever reaches it sees what this
// lets through.
//   kAll     every series labelled job_id, as recorded (the default);
//   kNone    no series labelled job_id: only cluster-wide figures (jobs by state, workers,
//            the queue, goodput and restarts by reason);
//   kLabels  every job_id series also carries tenant="<the job's tenant>", so a per-tenant
//            proxy in front of Prometheus (prom-label-proxy) can show each tenant only its own.
enum class JobSeries { kAll, kNone, kLabels };
// "all", "none" or "labels"; InvalidArgument naming `field`, the value and the choices.
absl::StatusOr<JobSeries> ParseJobSeries(const std::string& field, const std::string& value);
const char* JobSeriesName(JobSeries policy);
// Applies `policy` to a scrape (Registry::Collect()). `tenant_of` maps a live job's id to its
// tenant (kLabels); a job_id it does not know gets tenant="" (a series of a job that just
// ended). A family the policy leaves without samples is dropped.
std::vector<metrics::FamilySnapshot> ApplyJobSeries(
    std::vector<metrics::FamilySnapshot> families, JobSeries policy,
    const std::map<std::string, std::string>& tenant_of);

// The samples of the ulysses_jobs and ulysses_workers gauges: one per state (lower-case
// name without prefix), zero for states with no member.
std::vector<metrics::CallbackSample> JobStateSamples(const std::map<v1::JobState, int>& counts);
std::vector<metrics::CallbackSample> WorkerStateSamples(
    const std::map<v1::WorkerState, int>& counts);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_COORDINATOR_METRICS_H_
