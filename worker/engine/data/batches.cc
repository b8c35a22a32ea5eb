#include "worker/engine/data/batches.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ulysses::engine {

int64_t CursorSequenceIndex(const BatchLayout& layout, int64_t cursor, int64_t micro, int64_t row) {
  return cursor + (micro * layout.dp + layout.dp_rank) * layout.micro_batch + row;
}

absl::StatusOr<std::vector<LocalShard>> StepMicroBatches(const TokenDataset& data,
                                                         const BatchLayout& layout,
                                                         int64_t cursor) {
  if (layout.grad_accum < 1 || layout.micro_batch < 1 || layout.dp < 1 || cursor < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StepMicroBatches: grad_accum ", layout.grad_accum, ", micro_batch ", layout.micro_batch,
        ", dp ", layout.dp, " must be >= 1 and cursor ", cursor, " >= 0"));
  }
  std::vector<LocalShard> out;
  out.reserve(static_cast<size_t>(layout.grad_accum));
  for (int64_t micro = 0; micro < layout.grad_accum; ++micro) {
    std::vector<Sample> rows;
    rows.reserve(static_cast<size_t>(layout.micro_batch));
    for (int64_t j = 0; j < layout.micro_batch; ++j) {
      ASSIGN_OR_RETURN(Sample sample,
                       data.Get(CursorSequenceIndex(layout, cursor, micro, j), layout.seq_len));
      rows.push_back(std::move(sample));
    }
    ASSIGN_OR_RETURN(LocalShard shard, ShardSamples(rows, layout.sp_rank, layout.sp));
    out.push_back(std::move(shard));
  }
  return out;
}

}  // namespace ulysses::engine
