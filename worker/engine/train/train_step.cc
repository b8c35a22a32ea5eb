#include "worker/engine/train/train_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/train/guard.h"

namespace ulysses::engine::train {

Trainer::Trainer(model::LlamaForCausalLM model, AttentionCallback attention, Communicator* world,
                 AdamW* optimizer, double grad_clip, torch::Device device, ZeroSharding* zero)
    : model_(std::move(model)),
      attention_(std::move(attention)),
      world_(world),
      optimizer_(optimizer),
      grad_clip_(grad_clip),
      device_(device),
      zero_(zero),
      params_(Params(model_)) {
  // ZeRO >= 2 keeps gradient chunks (zero.h) instead of full fp32 accumulators.
  const bool full_accumulators = zero_ == nullptr || zero_->stage() < 2;
  grad32_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i].second;
    if (IsLowPrecision(p) && full_accumulators) {
      grad32_[i] = torch::zeros(p.sizes(), p.options().dtype(torch::kFloat));
    }
    if (p.scalar_type() == torch::kHalf) scaler_.enabled = true;
  }
  if (scaler_.enabled) scaler_.scale = LossScaler::kInitialScale;
}

int64_t Trainer::accumulator_bytes() const {
  int64_t bytes = 0;
  for (const torch::Tensor& g : grad32_) {
    if (g.defined()) bytes += g.numel() * static_cast<int64_t>(g.element_size());
  }
  return bytes;
}

void LossScaler::Update(bool overflow) {
  if (!enabled) return;
  if (overflow) {
    scale = std::max(scale / 2, 1.0 / (1 << 24));
    good_steps = 0;
  } else if (++good_steps >= kGrowthInterval) {
    scale *= 2;
    good_steps = 0;
  }
}

absl::StatusOr<StepStats> Trainer::Step(const std::vector<LocalShard>& micro_batches, double lr,
                                        int64_t step) {
  if (micro_batches.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, ": no micro-batch to train on"));
  }
  // Gradients start undefined: autograd writes the first micro-batch's fresh (no zero fill).
  for (auto& [name, p] : params_) p.mutable_grad() = torch::Tensor();
  const double scale = scaler_.enabled ? scaler_.scale : 1.0;
  double local_loss = 0;
  int64_t local_tokens = 0;
  if (zero_ != nullptr) RETURN_IF_ERROR(zero_->GatherOuter());  // stage 3; others: no-op
  using Clock = std::chrono::steady_clock;
  double forward_s = 0, backward_s = 0;
  for (size_t micro = 0; micro < micro_batches.size(); ++micro) {
    const LocalShard& shard = micro_batches[micro];
    RETURN_IF_ERROR(Guard(absl::StrCat("step ", step, " micro ", micro), [&] {
      const auto forward_start = Clock::now();
      model::LossOutput out =
          model_->Loss(shard.input_ids.to(device_), shard.position_ids.to(device_),
                       shard.labels.to(device_), attention_, /*accuracy_mask=*/{}, shard.doc_ids);
      const auto backward_start = Clock::now();
      if (scale != 1.0) {
        (out.loss_sum * scale).backward();
      } else {
        out.loss_sum.backward();
      }
      local_loss += out.loss_sum.item<double>();
      forward_s += std::chrono::duration<double>(backward_start - forward_start).count();
      backward_s += std::chrono::duration<double>(Clock::now() - backward_start).count();
      local_tokens += out.tokens;
      // Low-precision gradients go into the fp32 accumulators after every micro-batch.
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) {
        torch::Tensor& p = params_[i].second;
        if (!grad32_[i].defined()) continue;
        if (!p.grad().defined()) {
          if (micro == 0) grad32_[i].zero_();
          continue;
        }
        if (micro == 0) {
          grad32_[i].copy_(p.grad());
        } else {
          grad32_[i].add_(p.grad());
        }
        p.mutable_grad() = torch::Tensor();
      }
      return absl::OkStatus();
    }));
    if (zero_ != nullptr) RETURN_IF_ERROR(zero_->ReduceRemainingGrads());  // stage >= 2
  }
  if (zero_ != nullptr && zero_->stage() >= 2) {
    ASSIGN_OR_RETURN(StepStats sharded, ShardedUpdate(local_loss, local_tokens, lr, scale, step));
    sharded.forward_seconds = forward_s;
    sharded.backward_seconds = backward_s;
    return sharded;
  }
  // Sum grads + (loss, tokens) over the world, then divide the grads by max(tokens, 1) * scale.
  std::vector<torch::Tensor> grads;
  grads.reserve(params_.size() + 1);
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i].second;
    if (grad32_[i].defined()) {
      grads.push_back(grad32_[i]);
    } else {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
  }
  grads.push_back(
      torch::tensor({local_loss, static_cast<double>(local_tokens)}, torch::kDouble).to(device_));
  RETURN_IF_ERROR(world_->AllReduceSum(grads));
  torch::Tensor stats = grads.back().cpu();
  grads.pop_back();
  StepStats out;
  out.loss_scale = scale;
  out.forward_seconds = forward_s;
  out.backward_seconds = backward_s;
  out.tokens = stats[1].item<double>();
  out.loss = stats[0].item<double>() / std::max(1.0, out.tokens);
  RETURN_IF_ERROR(Guard(absl::StrCat("step ", step, " optimizer"), [&] {
    out.grad_norm = DivideAndClipGrads(grads, std::max(1.0, out.tokens) * scale, grad_clip_);
    out.skipped = !std::isfinite(out.loss) || !std::isfinite(out.grad_norm);
    if (!out.skipped && zero_ != nullptr) {
      RETURN_IF_ERROR(zero_->UpdateFromFullGrads(grads, lr));  // stage 1
    } else if (!out.skipped) {
      optimizer_->Step(params_, grads, lr);
    }
    scaler_.Update(out.skipped);
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<StepStats> Trainer::ShardedUpdate(double local_loss, int64_t local_tokens, double lr,
                                                 double scale, int64_t step) {
  std::vector<torch::Tensor> stats_v = {
      torch::tensor({local_loss, static_cast<double>(local_tokens)}, torch::kDouble).to(device_)};
  RETURN_IF_ERROR(world_->AllReduceSum(stats_v));
  torch::Tensor stats = stats_v[0].cpu();
  StepStats out;
  out.loss_scale = scale;
  out.tokens = stats[1].item<double>();
  out.loss = stats[0].item<double>() / std::max(1.0, out.tokens);
  RETURN_IF_ERROR(Guard(absl::StrCat("step ", step, " optimizer"), [&] {
    ASSIGN_OR_RETURN(out.grad_norm,
                     zero_->FinishGrads(std::max(1.0, out.tokens) * scale, grad_clip_));
    out.skipped = !std::isfinite(out.loss) || !std::isfinite(out.grad_norm);
    RETURN_IF_ERROR(zero_->Update(lr, /*apply=*/!out.skipped));
    zero_->ReleaseOuter();
    scaler_.Update(out.skipped);
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace ulysses::engine::train
