#include "worker/engine/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/engine/torch_compat.h"
#include "worker/engine/train/cpu_adamw.h"

namespace ulysses::engine::train {
namespace {

torch::ScalarType StateType(const torch::Tensor& p) {
  return (p.scalar_type() == torch::kHalf || p.scalar_type() == torch::kBFloat16) ? torch::kFloat
                                                                                  : p.scalar_type();
}

}  // namespace

bool DecaysWeight(const std::string& name, const torch::Tensor& param) { return param.dim() >= 2; }

bool IsLowPrecision(const torch::Tensor& t) {
  return t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
}

bool AdamW::Decays(const std::string& name, const torch::Tensor& target) const {
  auto it = decays_.find(name);
  return it != decays_.end() ? it->second : DecaysWeight(name, target);
}

void AdamW::Step(const NamedParams& params, const std::vector<torch::Tensor>& grads, double lr) {
  torch::NoGradGuard no_grad;
  ++step_count_;
  // The tensor each update is applied to: the parameter itself, or its fp32 master.
  std::vector<torch::Tensor> targets(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    if (i >= grads.size() || !grads[i].defined()) continue;
    torch::ScalarType st = StateType(p);
    torch::Tensor& m = exp_avg_[name];
    torch::Tensor& v = exp_avg_sq_[name];
    if (!m.defined()) m = torch::zeros(p.sizes(), p.options().dtype(st));
    if (!v.defined()) v = torch::zeros(p.sizes(), p.options().dtype(st));
    targets[i] = p;
    if (IsLowPrecision(p)) {
      torch::Tensor& master = master_[name];
      if (!master.defined()) master = p.detach().to(torch::kFloat).clone();
      targets[i] = master;
    }
  }
  // Entries the CPU kernel updates leave `targets` (written: it rounded the parameter too).
  std::vector<bool> written(params.size(), false);
  std::vector<torch::Tensor> remaining = targets;
  if (config_.fast_cpu) CpuStep(params, grads, remaining, written, lr);
  if (!FusedStep(params, grads, remaining, lr)) {
    const double bc1 = 1.0 - std::pow(config_.beta1, static_cast<double>(step_count_));
    const double bc2 = 1.0 - std::pow(config_.beta2, static_cast<double>(step_count_));
    for (size_t i = 0; i < params.size(); ++i) {
      if (!remaining[i].defined()) continue;
      const std::string& name = params[i].first;
      torch::Tensor& w = remaining[i];
      torch::Tensor& m = exp_avg_[name];
      torch::Tensor& v = exp_avg_sq_[name];
      torch::Tensor g = grads[i].to(m.scalar_type());
      if (Decays(name, w) && config_.weight_decay != 0) {
        w.mul_(1.0 - lr * config_.weight_decay);
      }
      m.mul_(config_.beta1).add_(g, 1.0 - config_.beta1);
      v.mul_(config_.beta2).addcmul_(g, g, 1.0 - config_.beta2);
      torch::Tensor denom = (v / bc2).sqrt_().add_(config_.eps);
      w.addcdiv_(m, denom, -lr / bc1);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    // Round each master to its low-precision parameter.
    if (targets[i].defined() && !written[i] && !targets[i].is_same(params[i].second)) {
      params[i].second.copy_(targets[i]);
    }
  }
}

bool AdamW::FusedStep(const NamedParams& params, const std::vector<torch::Tensor>& grads,
                      const std::vector<torch::Tensor>& targets, double lr) {
#if ULYSSES_TORCH_HAS_FUSED_ADAMW
  // One multi-tensor kernel per weight-decay group, for fp32 CUDA targets only (the fused kernel
  // needs params, grads and moments of one dtype and device); anything else takes the loop.
  std::vector<torch::Tensor> w[2], g[2], m[2], v[2];
  for (size_t i = 0; i < params.size(); ++i) {
    if (!targets[i].defined()) continue;
    const torch::Tensor& t = targets[i];
    if (!t.is_cuda() || t.scalar_type() != torch::kFloat) return false;
    const int group = Decays(params[i].first, t) && config_.weight_decay != 0 ? 1 : 0;
    w[group].push_back(t);
    g[group].push_back(grads[i].to(torch::kFloat));
    m[group].push_back(exp_avg_[params[i].first]);
    v[group].push_back(exp_avg_sq_[params[i].first]);
  }
  for (int group = 0; group < 2; ++group) {
    if (w[group].empty()) continue;
    // The kernel reads the (already incremented) step count for bias correction.
    torch::Tensor step = torch::full({}, static_cast<double>(step_count_),
                                     w[group][0].options().dtype(torch::kFloat));
    std::vector<torch::Tensor> steps(w[group].size(), step);
    at::_fused_adamw_(w[group], g[group], m[group], v[group], /*max_exp_avg_sqs=*/{}, steps, lr,
                      config_.beta1, config_.beta2, group == 1 ? config_.weight_decay : 0.0,
                      config_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  return true;
#else
  return false;
#endif
}

void AdamW::CpuStep(const NamedParams& params, const std::vector<torch::Tensor>& grads,
                    std::vector<torch::Tensor>& targets, std::vector<bool>& written, double lr) {
  std::vector<CpuAdamWTensors> batch;
  std::vector<size_t> index;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!targets[i].defined()) continue;
    const std::string& name = params[i].first;
    CpuAdamWTensors t;
    t.target = targets[i];
    t.exp_avg = exp_avg_[name];
    t.exp_avg_sq = exp_avg_sq_[name];
    t.grad = grads[i];
    const bool own_master = !targets[i].is_same(params[i].second);
    if (own_master && params[i].second.scalar_type() == torch::kBFloat16)
      t.param = params[i].second;
    t.decays = Decays(name, targets[i]);
    // An fp16 parameter (or any the kernel cannot write) keeps the caller's rounding copy.
    if (own_master && !t.param.defined()) continue;
    if (!CpuAdamWApplies(t)) continue;
    batch.push_back(std::move(t));
    index.push_back(i);
  }
  if (batch.empty()) return;
  CpuAdamWStep step;
  step.lr = lr;
  step.beta1 = config_.beta1;
  step.beta2 = config_.beta2;
  step.eps = config_.eps;
  step.weight_decay = config_.weight_decay;
  step.step = step_count_;
  CpuAdamWUpdate(batch, step);
  for (size_t i : index) {
    written[i] = true;
    targets[i] = torch::Tensor();
  }
}

void AdamW::Step(const NamedParams& params, double lr) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& [name, p] : params) grads.push_back(p.grad());
  Step(params, grads, lr);
}

torch::Tensor AdamW::Master(const std::string& name) const {
  auto it = master_.find(name);
  return it == master_.end() ? torch::Tensor() : it->second;
}

std::vector<std::pair<std::string, torch::Tensor>> AdamW::StateTensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, t] : exp_avg_) out.emplace_back("optim/exp_avg/" + name, t);
  for (const auto& [name, t] : exp_avg_sq_) out.emplace_back("optim/exp_avg_sq/" + name, t);
  for (const auto& [name, t] : master_) out.emplace_back(kMasterPrefix + name, t);
  return out;
}

absl::Status AdamW::LoadState(const NamedParams& params,
                              const std::map<std::string, torch::Tensor>& tensors,
                              int64_t step_count) {
  exp_avg_.clear();
  exp_avg_sq_.clear();
  master_.clear();
  step_count_ = step_count;
  if (step_count == 0) return absl::OkStatus();
  for (const auto& [name, p] : params) {
    if (IsLowPrecision(p)) {
      auto it = tensors.find(kMasterPrefix + name);
      if (it != tensors.end()) {
        if (it->second.sizes() != p.sizes()) {
          return absl::InvalidArgumentError(
              absl::StrCat("checkpoint: ", kMasterPrefix, name, " has shape ",
                           c10::str(it->second.sizes()), ", parameter has ", c10::str(p.sizes())));
        }
        // One copy on the parameter's device (not a transfer and then a clone of it).
        master_[name] = it->second.to(p.device(), torch::kFloat, /*non_blocking=*/false,
                                      /*copy=*/true);
      }
    }
    for (auto [prefix, dst] : {std::make_pair("optim/exp_avg/", &exp_avg_),
                               std::make_pair("optim/exp_avg_sq/", &exp_avg_sq_)}) {
      auto it = tensors.find(prefix + name);
      if (it == tensors.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint: optimizer state ", prefix, name, " is missing"));
      }
      if (it->second.sizes() != p.sizes()) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", prefix, name, " has shape ",
                                                       c10::str(it->second.sizes()),
                                                       ", parameter has ", c10::str(p.sizes())));
      }
      (*dst)[name] = it->second.to(p.device(), StateType(p), /*non_blocking=*/false, /*copy=*/true);
    }
  }
  return absl::OkStatus();
}

double ScheduledLr(const std::string& schedule, double peak, double min_lr_ratio, int64_t warmup,
                   int64_t steps, int64_t t) {
  if (warmup > 0 && t < warmup) return peak * static_cast<double>(t + 1) / warmup;
  if (schedule == "constant") return peak;
  const double floor = peak * min_lr_ratio;
  const int64_t decay_steps = std::max<int64_t>(1, steps - warmup - 1);
  const double progress =
      std::clamp(static_cast<double>(t - warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
  if (schedule == "linear") return peak - (peak - floor) * progress;
  return floor + (peak - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));  // cosine
}

torch::Tensor SquaredGradNormSum(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> wide, squares;
  for (const torch::Tensor& g : grads) {
    if (!g.defined()) continue;
    if (g.scalar_type() == torch::kFloat || g.scalar_type() == torch::kDouble) {
      wide.push_back(g);
    } else {  // fp16/bf16: the norm in fp32, which their range cannot overflow.
      squares.push_back(at::linalg_vector_norm(g, 2, c10::nullopt, false, torch::kFloat)
                            .to(torch::kDouble)
                            .square());
    }
  }
  if (!wide.empty()) {
    // One multi-tensor kernel per dtype and device for every per-tensor norm.
    for (const torch::Tensor& n : at::_foreach_norm(wide, 2)) {
      squares.push_back(n.to(torch::kDouble).square());
    }
  }
  if (squares.empty()) return torch::zeros({1}, torch::kDouble);
  return torch::stack(squares).sum().reshape({1});
}

double GlobalGradNorm(const std::vector<torch::Tensor>& grads) {
  return std::sqrt(SquaredGradNormSum(grads).item<double>());  // One host sync.
}

double DivideAndClipGrads(const std::vector<torch::Tensor>& grads, double divisor, double clip) {
  torch::NoGradGuard no_grad;
  const double norm = GlobalGradNorm(grads) / divisor;
  double coefficient = 1.0 / divisor;
  if (clip > 0 && std::isfinite(norm) && norm > clip) coefficient *= clip / (norm + 1e-6);
  std::vector<torch::Tensor> defined;
  for (const torch::Tensor& g : grads) {
    if (g.defined()) defined.push_back(g);
  }
  if (!defined.empty() && coefficient != 1.0) at::_foreach_mul_(defined, coefficient);
  return norm;
}

double ClipGradNorm(const std::vector<torch::Tensor>& grads, double clip) {
  return DivideAndClipGrads(grads, 1.0, clip);
}

double ClipGradNorm(const NamedParams& params, double clip) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& [name, p] : params) grads.push_back(p.grad());
  return ClipGradNorm(grads, clip);
}

}  // namespace ulysses::engine::train
