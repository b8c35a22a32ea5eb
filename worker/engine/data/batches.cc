#include "worker/engine/data/batches.h"

#include "common/status.h"

namespace ulysses::engine {

absl::StatusOr<std::vector<LocalShard>> StepMicroBatches(const TokenDataset& data,
                                                         const BatchLayout& layout,
                                                         int64_t step_in_stage) {
  std::vector<LocalShard> out;
  out.reserve(static_cast<size_t>(layout.grad_accum));
  for (int64_t micro = 0; micro < layout.grad_accum; ++micro) {
    const int64_t index =
        TrainSequenceIndex(step_in_stage, micro, layout.dp_rank, layout.dp, layout.grad_accum);
    ASSIGN_OR_RETURN(Sample sample, data.Get(index, layout.seq_len));
    ASSIGN_OR_RETURN(LocalShard shard, ShardSamples({sample}, layout.sp_rank, layout.sp));
    out.push_back(std::move(shard));
  }
  return out;
}

}  // namespace ulysses::engine
