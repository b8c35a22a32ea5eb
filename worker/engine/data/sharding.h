// Turns samples into one rank's Ulysses shard, and picks which sequence each
// data-parallel replica reads. Pure functions, thread-safe.
//
// Labels are shifted on the FULL sequence before slicing, so the label at each
// shard boundary (the first token of the next shard) is kept; position ids are
// global. See /work/shared/reference/ulysses.md "Labels, positions, loss".
#ifndef ULYSSES_WORKER_ENGINE_DATA_SHARDING_H_
#define ULYSSES_WORKER_ENGINE_DATA_SHARDING_H_

#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "worker/engine/data/dataset.h"

namespace ulysses::engine {

inline constexpr int64_t kIgnoreIndex = -100;

struct LocalShard {
  torch::Tensor input_ids;     // [b, s/p] int64
  torch::Tensor labels;        // [b, s/p] int64, -100 = ignored (masked by target_mask)
  torch::Tensor position_ids;  // [b, s/p] int64: the samples' positions (global sp_rank*s/p + i
                               // for one document; restarting per document when packed)
  torch::Tensor doc_ids;       // [b, s] int64 document layout of the FULL sequence (every SP
                               // rank holds all of it); undefined when no sample is packed
};

// samples: b >= 1 Samples of equal seq_len s; requires s % sp_size == 0 and
// 0 <= sp_rank < sp_size (else InvalidArgument naming the numbers). Samples without
// position_ids/doc_ids count as one document at positions 0..s-1.
absl::StatusOr<LocalShard> ShardSamples(const std::vector<Sample>& samples, int64_t sp_rank,
                                        int64_t sp_size);

// Global sequence index read by DP replica dp_rank at (step_in_stage, micro) with one sequence
// per micro-batch: ((step_in_stage * grad_accum + micro) * dp_size + dp_rank). Over steps [0, n)
// it covers [0, n * grad_accum * dp_size) exactly once. (batches.h generalises it to
// micro-batches of several sequences and a data cursor.)
int64_t TrainSequenceIndex(int64_t step_in_stage, int64_t micro, int64_t dp_rank, int64_t dp_size,
                           int64_t grad_accum);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_DATA_SHARDING_H_
