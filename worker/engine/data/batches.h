// What one rank trains on at each optimizer step: the micro-batches of its SP shard.
//
// A stage reads its training sequences as one stream: the data cursor counts the global
// sequences consumed so far in the stage (global batch G = grad_accum x dp x micro_batch per
// step). A step whose cursor is c reads, for micro-batch m in [0, grad_accum) and row j in
// [0, micro_batch), the global sequence c + (m * dp + dp_rank) * micro_batch + j and keeps this
// rank's SP shard of it. So:
//  - DP replicas read disjoint sequences, and a step covers [c, c + G) exactly once;
//  - the sequences of a step depend only on (c, G): micro-batch 4, grad_accum 4 x micro-batch 1
//    and dp 4 x micro-batch 1 train on the same four sequences;
//  - a resumed run continues at the checkpointed cursor (engine.cc stores it as extra.data_cursor),
//    so it reads exactly what an uninterrupted run would, also after a layout change.
// Pure function of its inputs; thread-safe.
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
  int64_t micro_batch = 1;  // sequences per micro-batch (the b of [b, s/p])
  // Global sequences per optimizer step.
  int64_t GlobalBatch() const { return grad_accum * dp * micro_batch; }
};

// Global index of row j of micro-batch `micro` of replica dp_rank, for a step starting at cursor.
int64_t CursorSequenceIndex(const BatchLayout& layout, int64_t cursor, int64_t micro, int64_t row);

// This rank's micro-batches of the optimizer step whose first global sequence is `cursor`
// (grad_accum of them, in order, each [micro_batch, seq_len / sp]).
absl::StatusOr<std::vector<LocalShard>> StepMicroBatches(const TokenDataset& data,
                                                         const BatchLayout& layout, int64_t cursor);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_DATA_BATCHES_H_
