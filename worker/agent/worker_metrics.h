// The worker agent's per-rank metrics (served on ulysses-worker --metrics-listen): the
// figures of the rank it runs, from that rank's step events (common/contract/rank_event.h),
// labelled {job_id, stage, rank}. Every name comes from the catalogue
// (common/metrics/catalog.h; docs/METRICS.md). An agent runs one rank at a time, and the
// series of an attempt are removed when it ends, so a scrape holds at most one label set.
//
// Thread-safe (the families are).
#ifndef ULYSSES_WORKER_AGENT_WORKER_METRICS_H_
#define ULYSSES_WORKER_AGENT_WORKER_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/contract/rank_event.h"
#include "common/metrics/metrics.h"

namespace ulysses::agent {

// The agent's own state, read at scrape time (so an idle worker reports it too).
struct AgentState {
  int64_t busy_slots = 0;  // running a rank
  int64_t free_slots = 0;
  bool connected = false;  // holds a session with the coordinator
};

struct RankLabels {
  std::string job_id;
  int64_t stage = 0;
  int64_t rank = 0;
};

class WorkerMetrics {
 public:
  // Registers the worker's families (and ulysses_build_info) in `registry`, which must
  // outlive this object. `peak_flops_per_s`: the device's dense peak for the MFU gauge
  // (0 = unknown: no ulysses_rank_mfu_ratio series).
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Register(metrics::Registry* registry,
                                                                 double peak_flops_per_s);

  // One step of the rank: sets the gauges from the event's per-rank figures (those it
  // carries) and counts the step.
  void OnStep(const RankLabels& labels, const contract::StepEvent& step);
  // The attempt ended: removes its series.
  void Forget(const RankLabels& labels);
  // ulysses_worker_fabric_info{fabric} = 1 (worker/agent/fabric.h FabricName), set once.
  void SetFabric(const std::string& fabric);
  // ulysses_worker_agent_slots{state}, ulysses_worker_connected and ulysses_worker_peak_flops,
  // computed from `state()` at each scrape (called from the scraping thread without a registry
  // lock; it must be thread-safe). Once.
  absl::Status ServeAgentState(std::function<AgentState()> state);

 private:
  WorkerMetrics() = default;
  metrics::Registry* registry_ = nullptr;
  double peak_flops_per_s_ = 0;
  metrics::GaugeFamily* step_seconds_ = nullptr;
  metrics::GaugeFamily* phase_seconds_ = nullptr;
  metrics::GaugeFamily* alltoall_seconds_ = nullptr;
  metrics::CounterFamily* alltoall_bytes_ = nullptr;
  metrics::GaugeFamily* memory_peak_ = nullptr;
  metrics::GaugeFamily* memory_limit_ = nullptr;
  metrics::GaugeFamily* tokens_per_s_ = nullptr;
  metrics::GaugeFamily* mfu_ = nullptr;
  metrics::GaugeFamily* grad_norm_ = nullptr;
  metrics::GaugeFamily* lr_ = nullptr;
  metrics::CounterFamily* steps_ = nullptr;
  metrics::GaugeFamily* fabric_ = nullptr;
};

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_WORKER_METRICS_H_
