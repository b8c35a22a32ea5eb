#include "common/metrics/catalog.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ulysses {
namespace metrics {
namespace {

using Labels = std::vector<std::string>;
const std::vector<std::string> kCoordinator = {kCoordinatorBinary};
const std::vector<std::string> kWorker = {kWorkerBinary};
const std::vector<std::string> kBoth = {kCoordinatorBinary, kWorkerBinary};
const Labels kJob = {"job_id"};
const Labels kRank = {"job_id", "stage", "rank"};

MetricDef Counter(std::string name, Labels labels, std::vector<std::string> binaries,
                  std::string help) {
  return {std::move(name), MetricType::kCounter, std::move(labels),
          std::move(help), std::move(binaries),  {}};
}
MetricDef Gauge(std::string name, Labels labels, std::vector<std::string> binaries,
                std::string help) {
  return {std::move(name), MetricType::kGauge,  std::move(labels),
          std::move(help), std::move(binaries), {}};
}
MetricDef Histogram(std::string name, Labels labels, std::vector<std::string> binaries,
                    std::vector<double> buckets, std::string help) {
  return {std::move(name), MetricType::kHistogram, std::move(labels),
          std::move(help), std::move(binaries),    std::move(buckets)};
}

std::vector<MetricDef> BuildCatalog() {
  const std::vector<double> waits = ExponentialBuckets(0.5, 2, 12);  // 0.5 s .. 1024 s
  std::vector<MetricDef> c = {
      // --- Both binaries -------------------------------------------------------------------
      Gauge("ulysses_build_info", {"version", "git_sha"}, kBoth,
            "Build metadata of this Ulysses binary (value is always 1)."),
      // --- Coordinator: control plane ------------------------------------------------------
      Gauge("ulysses_jobs", {"state"}, kCoordinator, "Jobs by state."),
      Gauge("ulysses_queue_length", {}, kCoordinator,
            "Jobs waiting for placement (PENDING, PREEMPTED, RECOVERING)."),
      Gauge("ulysses_wanted_workers", {}, kCoordinator,
            "Workers the pool wants: busy workers plus the workers the queued gangs need, and at "
            "least the highest busy pool ordinal + 1 (scale-in removes only idle workers); set by "
            "every scheduling pass. KEDA scales the worker StatefulSet on it."),
      Histogram("ulysses_gang_wait_seconds", {}, kCoordinator, waits,
                "Time a job waited in the queue until its whole group was placed."),
      Histogram("ulysses_scheduling_pass_seconds", {}, kCoordinator,
                ExponentialBuckets(0.0005, 2, 14),
                "Duration of one scheduling pass over every queued job and worker (held under "
                "the coordinator's lock)."),
      Counter("ulysses_job_restarts_total", {"reason"}, kCoordinator,
              "Group restarts after a failure, by reason."),
      Counter("ulysses_preemptions_total", {"reason"}, kCoordinator,
              "Attempts preempted (ranks checkpointed and exited 75), by reason: priority (the "
              "coordinator made room for a higher-priority job) or worker (a worker got SIGTERM)."),
      Counter("ulysses_preemption_lost_gpu_seconds_total", {"reason"}, kCoordinator,
              "Work lost to preemptions: world size x seconds from the last committed checkpoint "
              "(or the attempt's start) to the preemption, by reason."),
      Histogram("ulysses_recovery_duration_seconds", {}, kCoordinator, waits,
                "Time from a group breaking (RECOVERING) until it runs again."),
      Counter("ulysses_productive_gpu_seconds_total", {}, kCoordinator,
              "Goodput: GPU-seconds (ranks x seconds) of training steps that reached a committed "
              "checkpoint, over every job."),
      Counter("ulysses_lost_gpu_seconds_total", {"reason"}, kCoordinator,
              "GPU-seconds allocated to jobs that did not end in a committed checkpoint, by "
              "reason: failure, preemption, restart (launch to first step, exit after the last "
              "commit), checkpoint_stall (training blocked by saves) or cancelled."),
      Gauge("ulysses_job_goodput_ratio", kJob, kCoordinator,
            "A live job's productive over allocated GPU-seconds, 0..1, over all its attempts; "
            "computed at scrape time."),
      Counter("ulysses_stage_transitions_total", {}, kCoordinator,
              "Stages completed (moves to the next stage or success)."),
      Histogram("ulysses_checkpoint_save_duration_seconds", {}, kCoordinator, waits,
                "Wall time of committed checkpoint saves."),
      Gauge("ulysses_checkpoint_bytes", kJob, kCoordinator,
            "Size of the last committed checkpoint per live job."),
      Gauge("ulysses_worker_heartbeat_age_seconds", {"worker"}, kCoordinator,
            "Seconds since the last message from each non-lost worker."),
      Gauge("ulysses_workers", {"state"}, kCoordinator, "Workers by state."),
      Gauge("ulysses_worker_slots", {"state"}, kCoordinator,
            "Slots (ranks: GPUs) of the registered workers that are not lost, by state: busy, "
            "free (schedulable now), unavailable (suspect, disconnected or draining)."),
      // Settings the alerts compare against (deploy/k8s/prometheus/ulysses-rules.yml).
      Gauge("ulysses_heartbeat_timeout_seconds", {}, kCoordinator,
            "The coordinator's heartbeat_timeout_s: a worker silent this long is lost."),
      Gauge("ulysses_heartbeat_interval_seconds", {}, kCoordinator,
            "The heartbeat interval the coordinator asks of workers now: heartbeat_interval_s, "
            "longer on a large cluster (max_heartbeats_per_s)."),
      Gauge("ulysses_cancel_grace_seconds", {}, kCoordinator,
            "The coordinator's cancel_grace_s: how long a cancelled or preempted job's ranks "
            "get to finish their step and checkpoint."),
      Counter("ulysses_rejected_reports_total", {"reason"}, kCoordinator,
              "Worker session messages rejected (dropped, answered with an error Ack), by "
              "reason."),
      Gauge("ulysses_store_writable", {}, kCoordinator,
            "1 while the coordinator's state store accepts writes, 0 while it is read-only after "
            "an I/O error (the coordinator is NOT_SERVING until a probe write succeeds)."),
      Counter("ulysses_store_write_errors_total", {"kind"}, kCoordinator,
              "State store writes that failed: kind=io (read-only until a probe write succeeds) "
              "or kind=refused (the data was refused; only that request failed)."),
      Histogram("ulysses_rpc_duration_seconds", {"method"}, kCoordinator,
                ExponentialBuckets(0.0005, 2, 14),
                "Server-side handling time of coordinator RPCs."),
      // --- Coordinator: per live job (removed when the job ends) ---------------------------
      Gauge("ulysses_train_loss", kJob, kCoordinator, "Last reported training loss per live job."),
      Gauge("ulysses_train_tokens_per_second", kJob, kCoordinator,
            "Last reported throughput per live job."),
      Gauge("ulysses_train_step", kJob, kCoordinator,
            "Last reported step of the current stage per live job."),
      Counter("ulysses_train_tokens_total", kJob, kCoordinator,
              "Tokens trained per live job since the coordinator started (reported throughput "
              "integrated between rank-0 progress reports)."),
      Gauge("ulysses_train_steps", kJob, kCoordinator,
            "Optimizer steps of the job's current stage (ulysses_train_step counts up to it)."),
      Gauge("ulysses_train_stage", kJob, kCoordinator,
            "Number of the job's current stage, counted from 1."),
      Gauge("ulysses_train_seq_len", kJob, kCoordinator,
            "Global sequence length of the job's current stage."),
      Gauge("ulysses_train_group_size", kJob, kCoordinator,
            "Ranks in the job's current group (sp_degree x dp_degree of the stage)."),
      Gauge("ulysses_stage_eta_seconds", kJob, kCoordinator,
            "Estimated seconds until the current stage's last step, from the step rate between "
            "the last two progress reports."),
      Gauge("ulysses_checkpoint_every_steps", kJob, kCoordinator,
            "The live job's checkpoint.every_steps (0: it checkpoints at stage ends only); "
            "under every_steps: auto, the steps of the interval the coordinator sent."),
      Gauge("ulysses_checkpoint_age_seconds", kJob, kCoordinator,
            "Seconds since the running job's last committed checkpoint (since its start when it "
            "has none): the training a preemption or failure would lose now."),
      Gauge("ulysses_eval_loss", {"job_id", "stage"}, kCoordinator,
            "Latest evaluation loss of each stage of a live job."),
      Gauge("ulysses_eval_accuracy", {"job_id", "stage"}, kCoordinator,
            "Latest retrieval (needle) accuracy of each stage of a live job, 0..1 (only for "
            "evaluations that measure it)."),
      // --- Worker: the rank it runs (removed when the attempt ends) ------------------------
      Gauge("ulysses_rank_step_seconds", kRank, kWorker,
            "Wall time of the rank's last optimizer step."),
      Gauge("ulysses_rank_step_phase_seconds", {"job_id", "stage", "rank", "phase"}, kWorker,
            "The rank's last step split by phase: data_wait, forward, backward, optimizer "
            "(forward and backward include their all-to-alls)."),
      Gauge("ulysses_alltoall_seconds", kRank, kWorker,
            "Seconds of the rank's last step spent in sequence all-to-alls (forward and "
            "backward)."),
      Counter("ulysses_alltoall_bytes_total", kRank, kWorker,
              "All-to-all payload bytes the rank sent to other ranks during the attempt."),
      Gauge("ulysses_rank_memory_peak_bytes", {"job_id", "stage", "rank", "kind"}, kWorker,
            "Peak memory of the rank so far: kind=allocated (CUDA tensors; the resident set on "
            "CPU) and kind=reserved (CUDA caching allocator; the resident set on CPU)."),
      Gauge("ulysses_rank_memory_limit_bytes", kRank, kWorker,
            "Memory the rank can use: the GPU's total memory, or the cgroup limit / physical "
            "memory on CPU."),
      Gauge("ulysses_rank_tokens_per_second", kRank, kWorker,
            "Tokens the rank trained per second in its last step."),
      Gauge("ulysses_rank_mfu_ratio", kRank, kWorker,
            "Model FLOPs utilisation of the rank's last step, 0..1 (needs ulysses-worker "
            "--peak-flops)."),
      Gauge("ulysses_rank_grad_norm", kRank, kWorker,
            "Global gradient norm of the rank's last step, before clipping (the same on every "
            "rank of the group)."),
      Gauge("ulysses_rank_learning_rate", kRank, kWorker,
            "Learning rate the rank's last step applied (warmup and schedule included)."),
      Counter("ulysses_rank_steps_total", kRank, kWorker,
              "Optimizer steps the rank finished during the attempt."),
      Gauge("ulysses_worker_agent_slots", {"state"}, kWorker,
            "This worker's slots (ranks: GPUs) by state: busy (running a rank) or free; "
            "exported idle or not, their sum is the worker's --devices."),
      Gauge("ulysses_worker_connected", {}, kWorker,
            "1 while the worker holds a session with the coordinator, 0 while it reconnects."),
      Gauge("ulysses_worker_peak_flops", {}, kWorker,
            "Dense peak FLOP/s of one slot's device that MFU divides by (--peak-flops, else the "
            "GPU model's bf16 peak); 0 = unknown, no ulysses_rank_mfu_ratio series."),
      Gauge("ulysses_worker_fabric_info", {"fabric"}, kWorker,
            "1 for the transport the worker's GPUs have to other nodes, as detected at start "
            "(fabric=sockets, efa, tcpxo or ib; docs/DEPLOY.md \"Fabric between nodes\")."),
  };
  std::sort(c.begin(), c.end(),
            [](const MetricDef& a, const MetricDef& b) { return a.name < b.name; });
  return c;
}

absl::StatusOr<const MetricDef*> FindTyped(absl::string_view name, MetricType type) {
  absl::StatusOr<const MetricDef*> def = FindMetric(name);
  if (!def.ok()) return def.status();
  if ((*def)->type != type) {
    return absl::FailedPreconditionError(
        absl::StrCat("metric ", name, " is a ", MetricTypeName((*def)->type),
                     " in common/metrics/catalog.cc, registered as a ", MetricTypeName(type)));
  }
  return def;
}

}  // namespace

const std::vector<MetricDef>& Catalog() {
  static const std::vector<MetricDef>* catalog = new std::vector<MetricDef>(BuildCatalog());
  return *catalog;
}

absl::StatusOr<const MetricDef*> FindMetric(absl::string_view name) {
  for (const MetricDef& def : Catalog()) {
    if (def.name == name) return &def;
  }
  return absl::NotFoundError(absl::StrCat(
      "metric ", name,
      " is not in the catalogue: add it to common/metrics/catalog.cc and docs/METRICS.md"));
}

std::string CatalogJson() {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const MetricDef& def : Catalog()) {
    out.push_back({{"name", def.name},
                   {"type", std::string(MetricTypeName(def.type))},
                   {"labels", def.labels},
                   {"binaries", def.binaries},
                   {"help", def.help}});
  }
  return out.dump(1);
}

absl::StatusOr<CounterFamily*> RegisterCounter(Registry* registry, absl::string_view name) {
  absl::StatusOr<const MetricDef*> def = FindTyped(name, MetricType::kCounter);
  if (!def.ok()) return def.status();
  return registry->AddCounter((*def)->name, (*def)->help, (*def)->labels);
}

absl::StatusOr<GaugeFamily*> RegisterGauge(Registry* registry, absl::string_view name) {
  absl::StatusOr<const MetricDef*> def = FindTyped(name, MetricType::kGauge);
  if (!def.ok()) return def.status();
  return registry->AddGauge((*def)->name, (*def)->help, (*def)->labels);
}

absl::StatusOr<HistogramFamily*> RegisterHistogram(Registry* registry, absl::string_view name) {
  absl::StatusOr<const MetricDef*> def = FindTyped(name, MetricType::kHistogram);
  if (!def.ok()) return def.status();
  return registry->AddHistogram((*def)->name, (*def)->help, (*def)->labels, (*def)->buckets);
}

absl::Status RegisterCallbackGauge(Registry* registry, absl::string_view name,
                                   std::function<double()> fn) {
  absl::StatusOr<const MetricDef*> def = FindTyped(name, MetricType::kGauge);
  if (!def.ok()) return def.status();
  if (!(*def)->labels.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "metric ", name, " has labels in the catalogue: use RegisterCallbackGaugeFamily"));
  }
  return registry->AddCallbackGauge((*def)->name, (*def)->help, std::move(fn));
}

absl::Status RegisterCallbackGaugeFamily(Registry* registry, absl::string_view name,
                                         std::function<std::vector<CallbackSample>()> fn) {
  absl::StatusOr<const MetricDef*> def = FindTyped(name, MetricType::kGauge);
  if (!def.ok()) return def.status();
  return registry->AddCallbackGaugeFamily((*def)->name, (*def)->help, (*def)->labels,
                                          std::move(fn));
}

}  // namespace metrics
}  // namespace ulysses
