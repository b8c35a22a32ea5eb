#include "worker/agent/worker_metrics.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "common/metrics/build_info.h"
#include "common/metrics/catalog.h"
#include "common/spec/model_math.h"
#include "common/status.h"

namespace ulysses::agent {
namespace {

// The `stage` label is the 1-based stage number (docs/CONTRACTS.md, "Stage numbers");
// RankLabels::stage is the protocol's 0-based index.
std::vector<std::string> Values(const RankLabels& l) {
  return {l.job_id, std::to_string(l.stage + 1), std::to_string(l.rank)};
}

std::vector<std::string> With(const RankLabels& l, const std::string& extra) {
  std::vector<std::string> v = Values(l);
  v.push_back(extra);
  return v;
}

constexpr const char* kPhases[] = {"data_wait", "forward", "backward", "optimizer"};
constexpr const char* kMemoryKinds[] = {"allocated", "reserved"};

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Register(metrics::Registry* registry,
                                                                       double peak_flops_per_s) {
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics);
  m->registry_ = registry;
  m->peak_flops_per_s_ = peak_flops_per_s;
  RETURN_IF_ERROR(metrics::RegisterBuildInfo(registry));
  ASSIGN_OR_RETURN(m->step_seconds_, metrics::RegisterGauge(registry, "ulysses_rank_step_seconds"));
  ASSIGN_OR_RETURN(m->phase_seconds_,
                   metrics::RegisterGauge(registry, "ulysses_rank_step_phase_seconds"));
  ASSIGN_OR_RETURN(m->alltoall_seconds_,
                   metrics::RegisterGauge(registry, "ulysses_alltoall_seconds"));
  ASSIGN_OR_RETURN(m->alltoall_bytes_,
                   metrics::RegisterCounter(registry, "ulysses_alltoall_bytes_total"));
  ASSIGN_OR_RETURN(m->memory_peak_,
                   metrics::RegisterGauge(registry, "ulysses_rank_memory_peak_bytes"));
  ASSIGN_OR_RETURN(m->memory_limit_,
                   metrics::RegisterGauge(registry, "ulysses_rank_memory_limit_bytes"));
  ASSIGN_OR_RETURN(m->tokens_per_s_,
                   metrics::RegisterGauge(registry, "ulysses_rank_tokens_per_second"));
  ASSIGN_OR_RETURN(m->mfu_, metrics::RegisterGauge(registry, "ulysses_rank_mfu_ratio"));
  ASSIGN_OR_RETURN(m->grad_norm_, metrics::RegisterGauge(registry, "ulysses_rank_grad_norm"));
  ASSIGN_OR_RETURN(m->lr_, metrics::RegisterGauge(registry, "ulysses_rank_learning_rate"));
  ASSIGN_OR_RETURN(m->steps_, metrics::RegisterCounter(registry, "ulysses_rank_steps_total"));
  ASSIGN_OR_RETURN(m->fabric_, metrics::RegisterGauge(registry, "ulysses_worker_fabric_info"));
  return m;
}

void WorkerMetrics::SetFabric(const std::string& fabric) { fabric_->WithLabels({fabric})->Set(1); }

absl::Status WorkerMetrics::ServeAgentState(std::function<AgentState()> state) {
  RETURN_IF_ERROR(metrics::RegisterCallbackGaugeFamily(
      registry_, "ulysses_worker_agent_slots", [state]() -> std::vector<metrics::CallbackSample> {
        const AgentState s = state();
        return {{{"busy"}, static_cast<double>(s.busy_slots)},
                {{"free"}, static_cast<double>(s.free_slots)}};
      }));
  RETURN_IF_ERROR(metrics::RegisterCallbackGauge(
      registry_, "ulysses_worker_connected", [state] { return state().connected ? 1.0 : 0.0; }));
  const double peak = peak_flops_per_s_;
  return metrics::RegisterCallbackGauge(registry_, "ulysses_worker_peak_flops",
                                        [peak] { return peak; });
}

void WorkerMetrics::OnStep(const RankLabels& l, const contract::StepEvent& e) {
  const std::vector<std::string> v = Values(l);
  steps_->WithLabels(v)->Increment();
  if (e.step_seconds) step_seconds_->WithLabels(v)->Set(*e.step_seconds);
  const std::optional<double>* phases[] = {&e.data_wait_seconds, &e.forward_seconds,
                                           &e.backward_seconds, &e.optimizer_seconds};
  for (size_t i = 0; i < std::size(kPhases); ++i) {
    if (phases[i]->has_value()) phase_seconds_->WithLabels(With(l, kPhases[i]))->Set(**phases[i]);
  }
  if (e.alltoall_seconds) alltoall_seconds_->WithLabels(v)->Set(*e.alltoall_seconds);
  // Created with the first step (0 on ranks that exchange nothing, e.g. sp = 1).
  alltoall_bytes_->WithLabels(v)->Increment(static_cast<double>(e.alltoall_bytes.value_or(0)));
  const std::optional<int64_t>* memory[] = {&e.peak_allocated_bytes, &e.peak_reserved_bytes};
  for (size_t i = 0; i < std::size(kMemoryKinds); ++i) {
    if (memory[i]->has_value()) {
      memory_peak_->WithLabels(With(l, kMemoryKinds[i]))->Set(static_cast<double>(**memory[i]));
    }
  }
  if (e.memory_limit_bytes) {
    memory_limit_->WithLabels(v)->Set(static_cast<double>(*e.memory_limit_bytes));
  }
  if (e.rank_tokens_per_s) tokens_per_s_->WithLabels(v)->Set(*e.rank_tokens_per_s);
  if (e.grad_norm) grad_norm_->WithLabels(v)->Set(*e.grad_norm);
  if (e.lr) lr_->WithLabels(v)->Set(*e.lr);
  if (e.model_flops_per_s) {
    // This rank's share: its model FLOP/s over one device's peak (common/spec/model_math.h).
    if (std::optional<double> mfu =
            spec::MfuOfFlopRate(*e.model_flops_per_s, 1, peak_flops_per_s_)) {
      mfu_->WithLabels(v)->Set(*mfu);
    }
  }
}

void WorkerMetrics::Forget(const RankLabels& l) {
  const std::vector<std::string> v = Values(l);
  auto same_rank = [&v](const std::vector<std::string>& labels) {
    return std::equal(v.begin(), v.end(), labels.begin());
  };
  for (metrics::GaugeFamily* g : {step_seconds_, alltoall_seconds_, memory_limit_, tokens_per_s_,
                                  mfu_, grad_norm_, lr_, phase_seconds_, memory_peak_}) {
    g->RemoveIf(same_rank);
  }
  alltoall_bytes_->RemoveIf(same_rank);
  steps_->RemoveIf(same_rank);
}

}  // namespace ulysses::agent
