// What one rank trains on at each optimizer step: the micro-batches of its SP shard.
//
// Step t of a stage reads, for each micro-batch m in [0, grad_accum), the global sequence
// TrainSequenceIndex(t, m, dp_rank, dp, grad_accum) and keeps this rank's SP shard of it. The
// order depends only on (t, m, layout), so a resumed run reads exactly what an uninterrupted one
// would, and DP replicas read disjoint sequences. Pure function of its inputs; thread-safe.
#ifndef ULYSSES_WORKER_ENGINE_DATA_BATCHES_H_
#define ULYSSES_WORKER_ENGINE_DATA_BATCHES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/data/sharding.h"

namespace ulysses::engine {

struct BatchLayout {
  int64_t seq_len = 0;
  int64_t sp_rank = 0, sp = 1;
  int64_t dp_rank = 0, dp = 1;
  int64_t grad_accum = 1;
};

// This rank's micro-batches of optimizer step `step_in_stage` (grad_accum of them, in order).
absl::StatusOr<std::vector<LocalShard>> StepMicroBatches(const TokenDataset& data,
                                                         const BatchLayout& layout,
                                                         int64_t step_in_stage);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_DATA_BATCHES_H_
