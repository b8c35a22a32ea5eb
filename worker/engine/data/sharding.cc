#include "worker/engine/data/sharding.h"

#include "absl/strings/str_cat.h"

namespace ulysses::engine {

absl::StatusOr<LocalShard> ShardSamples(const std::vector<Sample>& samples, int64_t sp_rank,
                                        int64_t sp_size) {
  if (samples.empty()) return absl::InvalidArgumentError("ShardSamples: no samples");
  if (sp_size < 1 || sp_rank < 0 || sp_rank >= sp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardSamples: sp_rank ", sp_rank, " not in [0, sp_size=", sp_size, ")"));
  }
  const int64_t s = samples[0].tokens.size(0) - 1;
  if (s < 1) return absl::InvalidArgumentError("ShardSamples: samples need at least 2 tokens");
  if (s % sp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length ", s, " is not divisible by sp_degree ", sp_size,
                     "; use a seq_len that is a multiple of ", sp_size));
  }
  std::vector<torch::Tensor> inputs, labels, positions, docs;
  bool packed = false;
  for (const Sample& sample : samples) packed = packed || sample.doc_ids.defined();
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& sample = samples[i];
    if (sample.tokens.dim() != 1 || sample.tokens.size(0) != s + 1) {
      return absl::InvalidArgumentError(absl::StrCat("ShardSamples: sample ", i, " has ",
                                                     sample.tokens.numel(), " tokens, expected ",
                                                     s + 1, " (all samples need equal seq_len)"));
    }
    torch::Tensor tokens = sample.tokens.to(torch::kInt64);
    inputs.push_back(tokens.slice(0, 0, s));                  // [s + 1] -> [s]
    torch::Tensor label = tokens.slice(0, 1, s + 1).clone();  // shifted on the full sequence
    if (sample.target_mask.defined()) {
      if (sample.target_mask.numel() != s) {
        return absl::InvalidArgumentError(
            absl::StrCat("ShardSamples: sample ", i, " target_mask has ",
                         sample.target_mask.numel(), " entries, expected ", s));
      }
      label.masked_fill_(sample.target_mask.to(torch::kBool).logical_not(), kIgnoreIndex);
    }
    labels.push_back(label);
    for (const torch::Tensor* t : {&sample.position_ids, &sample.doc_ids}) {
      if (t->defined() && (t->dim() != 1 || t->numel() != s)) {
        return absl::InvalidArgumentError(absl::StrCat("ShardSamples: sample ", i,
                                                       " position_ids/doc_ids have ", t->numel(),
                                                       " entries, expected ", s));
      }
    }
    positions.push_back(sample.position_ids.defined() ? sample.position_ids.to(torch::kInt64)
                                                      : torch::arange(s, torch::kInt64));
    if (packed) {
      docs.push_back(sample.doc_ids.defined() ? sample.doc_ids.to(torch::kInt64)
                                              : torch::zeros({s}, torch::kInt64));
    }
  }
  const int64_t local = s / sp_size;
  const int64_t begin = sp_rank * local;
  LocalShard shard;
  // [b, s] -> [b, s/p]: this rank's contiguous slice of the sequence axis.
  shard.input_ids = torch::stack(inputs).slice(1, begin, begin + local).contiguous();
  shard.labels = torch::stack(labels).slice(1, begin, begin + local).contiguous();
  shard.position_ids = torch::stack(positions).slice(1, begin, begin + local).contiguous();
  if (packed) shard.doc_ids = torch::stack(docs);  // [b, s]: the whole layout on every rank
  return shard;
}

int64_t TrainSequenceIndex(int64_t step_in_stage, int64_t micro, int64_t dp_rank, int64_t dp_size,
                           int64_t grad_accum) {
  return (step_in_stage * grad_accum + micro) * dp_size + dp_rank;
}

}  // namespace ulysses::engine
