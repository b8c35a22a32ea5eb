#include "worker/engine/train/train_step.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/train/guard.h"

namespace ulysses::engine::train {

Trainer::Trainer(model::LlamaForCausalLM model, AttentionCallback attention, Communicator* world,
                 AdamW* optimizer, double grad_clip, torch::Device device)
    : model_(std::move(model)),
      attention_(std::move(attention)),
      world_(world),
      optimizer_(optimizer),
      grad_clip_(grad_clip),
      device_(device),
      params_(Params(model_)) {}

absl::StatusOr<StepStats> Trainer::Step(const std::vector<LocalShard>& micro_batches, double lr,
                                        int64_t step) {
  for (auto& [name, p] : params_) {
    if (p.grad().defined()) p.grad().zero_();
  }
  double local_loss = 0;
  int64_t local_tokens = 0;
  for (size_t micro = 0; micro < micro_batches.size(); ++micro) {
    const LocalShard& shard = micro_batches[micro];
    RETURN_IF_ERROR(Guard(absl::StrCat("step ", step, " micro ", micro), [&] {
      model::LossOutput out =
          model_->Loss(shard.input_ids.to(device_), shard.position_ids.to(device_),
                       shard.labels.to(device_), attention_);
      out.loss_sum.backward();
      local_loss += out.loss_sum.item<double>();
      local_tokens += out.tokens;
      return absl::OkStatus();
    }));
  }
  // Sum grads + (loss, tokens) over the world; then scale grads by 1/max(tokens, 1).
  std::vector<torch::Tensor> reduce;
  for (auto& [name, p] : params_) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    reduce.push_back(p.grad());
  }
  reduce.push_back(
      torch::tensor({local_loss, static_cast<double>(local_tokens)}, torch::kDouble).to(device_));
  RETURN_IF_ERROR(world_->AllReduceSum(reduce));
  torch::Tensor stats = reduce.back().cpu();
  StepStats out;
  out.tokens = stats[1].item<double>();
  out.loss = stats[0].item<double>() / std::max(1.0, out.tokens);
  RETURN_IF_ERROR(Guard(absl::StrCat("step ", step, " optimizer"), [&] {
    {
      torch::NoGradGuard no_grad;
      for (auto& [name, p] : params_) p.grad().div_(std::max(1.0, out.tokens));
    }
    out.grad_norm = ClipGradNorm(params_, grad_clip_);
    optimizer_->Step(params_, lr);
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace ulysses::engine::train
