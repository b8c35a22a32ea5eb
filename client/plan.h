// Offline per-stage resource plan of a TrainJob: tokens per rank, Ulysses
// all-to-all volume and a rough per-rank memory estimate (formulas in
// docs/JOBSPEC.md, "Plan"). Pure arithmetic on a validated JobSpec.
#ifndef ULYSSES_CLIENT_PLAN_H_
#define ULYSSES_CLIENT_PLAN_H_

#include <cstdint>
#include <vector>

#include "common/spec/job_spec.h"

namespace ulysses::client {

struct StagePlan {
  int64_t seq_len = 0;  // N
  int64_t steps = 0;
  int64_t sp = 1;  // P
  int64_t dp = 1;
  int64_t world = 1;               // P * dp
  int64_t tokens_per_rank = 0;     // N / P
  int64_t kv_heads_exchanged = 0;  // spec::UlyssesKvHeadsExchanged: Hkv, or P when replicated
  // The remaining fields are 0 when the shape is unknown (init_from without shape fields).
  double a2a_elements = 0;       // Forward all-to-all elements per layer per rank.
  double a2a_bytes = 0;          // a2a_elements * dtype size.
  double activation_bytes = 0;   // Rough peak activation memory per rank.
  double model_state_bytes = 0;  // Weights + grads + AdamW state per rank (ZeRO 0).
};

// Parameters of the model (embeddings, decoder layers, final norm, lm_head).
double ParameterCount(const spec::ModelSpec& model);
int64_t DtypeBytes(const std::string& dtype);
std::vector<StagePlan> PlanJob(const spec::JobSpec& spec);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_PLAN_H_
