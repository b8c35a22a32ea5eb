#include "worker/engine/train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"
#include "worker/engine/data/sharding.h"
#include "worker/engine/train/guard.h"

namespace ulysses::engine::train {

absl::StatusOr<int64_t> ValidationSequences(const spec::JobSpec& spec, const TokenDataset& val,
                                            int64_t seq_len, int64_t max_sequences) {
  int64_t n = val.NumSequences(seq_len);
  if (max_sequences > 0 && n > max_sequences) n = max_sequences;
  if (n < 0) n = spec.data.synthetic ? spec.data.synthetic->validation_sequences : 0;
  if (n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec::fields::PathOf(&spec::DataSpec::validation), ": no validation window of seq_len ",
        seq_len, " (the file is too short; give a longer file or a shorter seq_len)"));
  }
  return n;
}

absl::StatusOr<EvalResult> Evaluate(model::LlamaForCausalLM& model,
                                    const AttentionCallback& attention, const ParallelRuntime& rt,
                                    const TokenDataset& val, int64_t num_sequences, int64_t seq_len,
                                    bool report_accuracy) {
  double loss_sum = 0;
  int64_t tokens = 0, correct = 0, acc_tokens = 0;
  torch::NoGradGuard no_grad;
  // Every replica runs the same number of forward passes, ceil(n / dp): a forward may hold
  // collectives over the whole world (ZeRO-3 gathers each layer's weights), so a replica that
  // stopped early would leave its peers waiting in a gather while it waits in the final sum.
  // A replica whose share is short re-evaluates sequence 0 as padding and counts nothing of it.
  const int64_t rounds = (num_sequences + rt.dp - 1) / rt.dp;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t i = round * rt.dp + rt.groups.dp_rank;
    const bool counted = i < num_sequences;
    ASSIGN_OR_RETURN(Sample sample, val.Get(counted ? i : 0, seq_len));
    ASSIGN_OR_RETURN(LocalShard shard, ShardSamples({sample}, rt.groups.sp_rank, rt.sp));
    RETURN_IF_ERROR(Guard("eval forward", [&] {
      torch::Tensor ids = shard.input_ids.to(rt.device), labels = shard.labels.to(rt.device);
      model::LossOutput out = model->Loss(ids, shard.position_ids.to(rt.device), labels, attention,
                                          labels.ne(model::kIgnoreIndex), shard.doc_ids);
      if (!counted) return absl::OkStatus();  // padding: the collectives ran, nothing counts
      loss_sum += out.loss_sum.item<double>();
      tokens += out.tokens;
      correct += out.correct;
      acc_tokens += out.accuracy_tokens;
      return absl::OkStatus();
    }));
  }
  // Global sums over the world of (loss_sum, tokens, correct, acc_tokens).
  std::vector<torch::Tensor> sums = {
      torch::tensor({loss_sum, static_cast<double>(tokens), static_cast<double>(correct),
                     static_cast<double>(acc_tokens)},
                    torch::kDouble)
          .to(rt.device)};
  RETURN_IF_ERROR(rt.groups.world->AllReduceSum(sums));
  torch::Tensor s = sums[0].cpu();
  EvalResult r;
  r.tokens = static_cast<int64_t>(std::llround(s[1].item<double>()));
  r.loss = s[0].item<double>() / std::max<double>(1.0, s[1].item<double>());
  r.has_accuracy = report_accuracy && s[3].item<double>() > 0;
  r.accuracy = s[2].item<double>() / std::max<double>(1.0, s[3].item<double>());
  return r;
}

}  // namespace ulysses::engine::train
