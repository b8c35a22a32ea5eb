#include "worker/engine/model/llama.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/spec/job_spec_fields.h"
#include "worker/engine/attention/kept_attention.h"
#include "worker/engine/model/torch_dtype.h"
#include "worker/engine/torch_compat.h"

namespace ulysses::engine::model {
namespace {

namespace F = torch::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Holds the recompute closure of a Checkpoint call until backward.
struct CheckpointClosure : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  CheckpointOptions options;
};

void Call(const std::function<void()>& f) {
  if (f) f();
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x,
                               c10::intrusive_ptr<CheckpointClosure> closure) {
    if (closure->options.offload_input) {
      // The input leaves the device until backward (ctx keeps only the host copy).
      ctx->saved_data["host_input"] = OffloadToHost(x);
      ctx->saved_data["device"] = x.device();
    } else {
      ctx->save_for_backward({x});
    }
    ctx->saved_data["closure"] = c10::IValue::make_capsule(closure);
    torch::NoGradGuard no_grad;
    Call(closure->options.before_run);
    torch::Tensor y;
    if (closure->options.keep_attention) {
      auto kept = c10::make_intrusive<KeptAttention>();
      {
        KeepAttentionScope record(kept.get(), KeepMode::kRecord);
        y = closure->fn(x);
      }
      ctx->saved_data["kept"] = c10::IValue::make_capsule(kept);
    } else {
      y = closure->fn(x);
    }
    Call(closure->options.after_run);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto closure = c10::static_intrusive_pointer_cast<CheckpointClosure>(
        ctx->saved_data["closure"].toCapsule());
    torch::Tensor saved_x;
    if (closure->options.offload_input) {
      saved_x = ReloadToDevice(ctx->saved_data["host_input"].toTensor(),
                               ctx->saved_data["device"].toDevice());
    } else {
      saved_x = ctx->get_saved_variables()[0];
    }
    torch::Tensor x = saved_x.detach().requires_grad_(true);
    torch::Tensor y;
    Call(closure->options.before_run);
    {
      torch::AutoGradMode enable(true);
      if (closure->options.keep_attention) {
        auto kept =
            c10::static_intrusive_pointer_cast<KeptAttention>(ctx->saved_data["kept"].toCapsule());
        {
          KeepAttentionScope replay(kept.get(), KeepMode::kReplay);
          y = closure->fn(x);
        }
        TORCH_CHECK(kept->empty(), "kept attention: the recompute left ", kept->size(),
                    " kept attention outputs unused (the layer's forward must be deterministic)");
        ctx->saved_data.erase("kept");  // the replay's autograd nodes hold what they need
      } else {
        y = closure->fn(x);
      }
    }
    // Reentrant backward: parameter grads accumulate into their .grad.
    torch::autograd::backward({y}, {grad_outputs[0]});
    Call(closure->options.after_backward);
    Call(closure->options.after_run);
    return {x.grad(), torch::Tensor()};
  }
};

// Cross-entropy sum over tiles of rows, fused with its gradient (a chunked linear-cross-entropy):
// each tile's logits [t, V] are made once, in the dtype, upcast to fp32 for that tile only, and
// turned into the loss and, when a gradient is wanted, into dlogits = softmax - onehot and the
// tile's grad_hidden and grad_weight contributions right away. Backward only scales the saved
// gradients by the loss's output gradient (a scalar): no logits are recomputed and no [n, V]
// tensor exists at any time.
class TiledCrossEntropyFunction : public torch::autograd::Function<TiledCrossEntropyFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor hidden, torch::Tensor weight,
                               torch::Tensor labels, int64_t tile, bool with_grad) {
    const int64_t n = hidden.size(0);
    torch::Tensor total = torch::zeros({}, hidden.options().dtype(AccumType(hidden)));
    torch::Tensor grad_hidden, grad_weight;
    if (with_grad) {
      grad_hidden = torch::empty(hidden.sizes(), hidden.options());  // [n, H], contiguous
      grad_weight = torch::zeros_like(weight);  // [V, H], accumulated in the weight's dtype
    }
    for (int64_t start = 0; start < n; start += tile) {
      const int64_t len = std::min(tile, n - start);
      torch::Tensor h = hidden.narrow(0, start, len);       // [t, H]
      torch::Tensor y = labels.narrow(0, start, len);       // [t]
      torch::Tensor logits = Upcast(h.matmul(weight.t()));  // [t, V], fp32 for this tile only
      torch::Tensor valid = y.ne(kIgnoreIndex).to(logits.scalar_type());  // [t]
      torch::Tensor idx = y.clamp_min(0).unsqueeze(1);                    // [t, 1]
      torch::Tensor picked = logits.gather(1, idx).squeeze(1);            // [t]
      torch::Tensor lse = logits.logsumexp(1);                            // [t]
      total += ((lse - picked) * valid).sum();
      if (!with_grad) continue;
      // dlogits = (softmax - onehot) * valid, in place over the tile's logits: [t, V]
      torch::Tensor dlogits = logits.sub_(lse.unsqueeze(1)).exp_();
      dlogits.scatter_add_(1, idx, torch::full({len, 1}, -1.0, dlogits.options()));
      dlogits.mul_(valid.unsqueeze(1));
      dlogits = dlogits.to(hidden.scalar_type());
      torch::Tensor gh = grad_hidden.narrow(0, start, len);  // rows of a contiguous [n, H]
      torch::mm_out(gh, dlogits, weight);                    // [t, V] x [V, H] -> [t, H]
      grad_weight.addmm_(dlogits.t(), h);                    // += [V, t] x [t, H]
    }
    if (with_grad) ctx->save_for_backward({grad_hidden, grad_weight});
    ctx->saved_data["with_grad"] = with_grad;
    return total.to(hidden.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(ctx->saved_data["with_grad"].toBool(),
                "TiledCrossEntropySum: backward of a call made without gradients");
    auto saved = ctx->get_saved_variables();
    torch::Tensor g = grad_outputs[0];  // scalar: d(objective)/d(loss_sum)
    return {saved[0] * g.to(saved[0].scalar_type()), saved[1] * g.to(saved[1].scalar_type()),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

 private:
  static torch::ScalarType AccumType(const torch::Tensor& t) {
    return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  }
  static torch::Tensor Upcast(const torch::Tensor& t) { return t.to(AccumType(t)); }
};

}  // namespace

absl::StatusOr<torch::Dtype> ParseDtype(const std::string& name) {
  if (name.empty()) return torch::kFloat;
  const DtypeInfo* d = FindDtype(name);
  if (d != nullptr && d->weight) return TorchType(*d);
  return absl::InvalidArgumentError(absl::StrCat(spec::fields::PathOf(&spec::ModelSpec::dtype),
                                                 ": '", name, "' is not a dtype (use ",
                                                 WeightDtypeList(), ")"));
}

torch::Tensor RopeInverseFrequencies(const LlamaConfig& c) {
  const int64_t d = c.HeadDim();
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  // [d/2]: theta^(-2i/d)
  torch::Tensor inv_freq =
      1.0 / torch::pow(c.rope_theta, torch::arange(0, d, 2, opts) / static_cast<double>(d));
  const spec::RopeScaling& r = c.rope_scaling;
  if (r.rope_type == spec::kRopeNone) return inv_freq;
  if (r.rope_type == spec::kRopeLinear) return inv_freq / r.factor;  // position interpolation
  TORCH_CHECK(r.rope_type == spec::kRopeLlama3, spec::fields::ShapePathOf("rope_scaling.rope_type"),
              ": '", r.rope_type, "' is not implemented (use none, llama3 or linear)");
  // llama3: by wavelength against the original context C, keep the high frequencies
  // (wavelength < C / high_freq_factor), divide the low ones (> C / low_freq_factor) by
  // factor, and interpolate linearly in C / wavelength between the two.
  const double context = static_cast<double>(r.original_max_position_embeddings);
  constexpr double kPi = 3.14159265358979323846;
  torch::Tensor wavelength = 2.0 * kPi / inv_freq;  // [d/2]
  torch::Tensor turns = context / wavelength;       // rotations within C
  torch::Tensor mix = ((turns - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor))
                          .clamp(0.0, 1.0);  // 0: low .. 1: high
  return inv_freq / r.factor * (1.0 - mix) + inv_freq * mix;
}

std::pair<torch::Tensor, torch::Tensor> RopeCosSin(const torch::Tensor& position_ids,
                                                   const LlamaConfig& config, torch::Dtype dtype,
                                                   torch::Device device) {
  // Computed in fp64 from global positions, so every shard sees identical values.
  torch::Tensor inv_freq = RopeInverseFrequencies(config);              // [d/2]
  torch::Tensor pos = position_ids.to(torch::kCPU).to(torch::kDouble);  // [s/p] or [b, s/p]
  torch::Tensor freqs = pos.unsqueeze(-1) * inv_freq;                   // [.., s/p, d/2]
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);                   // [.., s/p, d]
  return {emb.cos().to(device, dtype), emb.sin().to(device, dtype)};
}

torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor x1 = x.narrow(-1, 0, half);
  torch::Tensor x2 = x.narrow(-1, half, half);
  torch::Tensor rotated = torch::cat({-x2, x1}, -1);  // rotate_half
  // [s/p, d] -> [1, s/p, 1, d]; per-row tables [b, s/p, d] -> [b, s/p, 1, d]
  torch::Tensor c = cos.dim() == 2 ? cos.unsqueeze(0).unsqueeze(2) : cos.unsqueeze(2);
  torch::Tensor s = sin.dim() == 2 ? sin.unsqueeze(0).unsqueeze(2) : sin.unsqueeze(2);
  return x * c + rotated * s;
}

torch::Tensor Checkpoint(std::function<torch::Tensor(const torch::Tensor&)> fn,
                         const torch::Tensor& x, const CheckpointOptions& options) {
  if (!torch::GradMode::is_enabled()) {
    Call(options.before_run);
    torch::Tensor y = fn(x);
    Call(options.after_run);
    return y;
  }
  auto closure = c10::make_intrusive<CheckpointClosure>();
  closure->fn = std::move(fn);
  closure->options = options;
  return CheckpointFunction::apply(x, closure);
}

torch::Tensor OffloadToHost(const torch::Tensor& x) {
  const bool device = !x.is_cpu();
  torch::Tensor host = torch::empty(
      x.sizes(), x.options().device(torch::kCPU).pinned_memory(device).requires_grad(false));
  host.copy_(x.detach(), /*non_blocking=*/device);
  return host;
}

torch::Tensor ReloadToDevice(const torch::Tensor& host, torch::Device device) {
  return host.to(device, /*non_blocking=*/host.is_pinned());
}

torch::Tensor TiledCrossEntropySum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, int64_t tile_tokens) {
  const bool with_grad =
      torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  return TiledCrossEntropyFunction::apply(hidden, weight, labels, std::max<int64_t>(1, tile_tokens),
                                          with_grad);
}

torch::Tensor InitialParameter(const std::string& name, c10::IntArrayRef shape, uint64_t seed) {
  if (shape.size() == 1) return torch::ones(shape, torch::kFloat);  // RMSNorm weights
  // FNV-1a of the name, mixed with the seed (splitmix64): one generator per parameter.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (h | 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  at::Generator gen = at::detail::createCPUGenerator(z ^ (z >> 31));
  torch::Tensor init = torch::empty(shape, torch::kFloat);
  init.normal_(0.0, 0.02, gen);
  return init;
}

LinearNoBiasImpl::LinearNoBiasImpl(int64_t in, int64_t out) {
  weight = register_parameter("weight", torch::empty({out, in}));
}

torch::Tensor LinearNoBiasImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(x, weight);
}

TokenEmbeddingImpl::TokenEmbeddingImpl(int64_t vocab, int64_t hidden) {
  weight = register_parameter("weight", torch::empty({vocab, hidden}));
}

torch::Tensor TokenEmbeddingImpl::forward(const torch::Tensor& ids) {
  return torch::embedding(weight, ids);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool fused) : eps_(eps), fused_(fused) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
#if ULYSSES_TORCH_AT_LEAST(2, 4)
  if (fused_) return at::rms_norm(x, {x.size(-1)}, weight, eps_);
#endif
  torch::ScalarType in = x.scalar_type();
  torch::Tensor xf = in == torch::kDouble ? x : x.to(torch::kFloat);
  torch::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * torch::rsqrt(var + eps_)).to(in);
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c) : config_(c) {
  const int64_t d = c.HeadDim();
  auto lin = [](int64_t in, int64_t out) { return LinearNoBias(in, out); };
  q_proj = register_module("q_proj", lin(c.hidden_size, c.num_attention_heads * d));
  k_proj = register_module("k_proj", lin(c.hidden_size, c.num_key_value_heads * d));
  v_proj = register_module("v_proj", lin(c.hidden_size, c.num_key_value_heads * d));
  o_proj = register_module("o_proj", lin(c.num_attention_heads * d, c.hidden_size));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                          const torch::Tensor& sin, const AttentionFn& attention,
                                          const torch::Tensor& doc_ids) {
  const int64_t b = x.size(0), s = x.size(1), d = config_.HeadDim();
  const int64_t hq = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  // [b, s/p, H] -> [b, s/p, hq, d] / [b, s/p, hkv, d]
  torch::Tensor q = q_proj(x).view({b, s, hq, d});
  torch::Tensor k = k_proj(x).view({b, s, hkv, d});
  torch::Tensor v = v_proj(x).view({b, s, hkv, d});
  q = ApplyRope(q, cos, sin);
  k = ApplyRope(k, cos, sin);
  torch::Tensor o = attention(q, k, v, doc_ids);  // [b, s/p, hq, d]
  // [b, s/p, hq, d] -> [b, s/p, hq*d]
  return o_proj(o.reshape({b, s, hq * d}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c, const MemoryOptions& memory)
    : memory_(memory), hidden_size_(c.hidden_size) {
  auto lin = [](int64_t in, int64_t out) { return LinearNoBias(in, out); };
  gate_proj = register_module("gate_proj", lin(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", lin(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", lin(c.intermediate_size, c.hidden_size));
}

torch::Tensor LlamaMLPImpl::Dense(const torch::Tensor& x) {
  return down_proj(F::silu(gate_proj(x)) * up_proj(x));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  if (!memory_.tiled_mlp && memory_.fuse_gate_up) {
    // One GEMM: [b, s/p, H] x [H, 2I] -> [b, s/p, 2I], split into gate and up [b, s/p, I] each.
    torch::Tensor w = torch::cat({gate_proj->weight, up_proj->weight}, 0);  // [2I, H]
    std::vector<torch::Tensor> gate_up = F::linear(x, w).chunk(2, -1);
    return down_proj(F::silu(gate_up[0]) * gate_up[1]);
  }
  if (!memory_.tiled_mlp) return Dense(x);
  // Tiles along the local sequence: [b, s/p, H] -> n x [b, t, H]; each tile recomputed in backward.
  const int64_t tile = memory_.mlp_tile_tokens > 0 ? memory_.mlp_tile_tokens : hidden_size_;
  const int64_t s = x.size(1);
  if (s <= tile) return Checkpoint([this](const torch::Tensor& t) { return Dense(t); }, x);
  std::vector<torch::Tensor> outs;
  for (int64_t start = 0; start < s; start += tile) {
    torch::Tensor part = x.narrow(1, start, std::min(tile, s - start));
    outs.push_back(Checkpoint([this](const torch::Tensor& t) { return Dense(t); }, part));
  }
  return torch::cat(outs, 1);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, const MemoryOptions& memory) {
  self_attn = register_module("self_attn", LlamaAttention(c));
  mlp = register_module("mlp", LlamaMLP(c, memory));
  input_layernorm = register_module("input_layernorm",
                                    RMSNorm(c.hidden_size, c.rms_norm_eps, memory.fused_rms_norm));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, memory.fused_rms_norm));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                             const torch::Tensor& sin, const AttentionFn& attention,
                                             const torch::Tensor& doc_ids) {
  torch::Tensor h = x + self_attn(input_layernorm(x), cos, sin, attention, doc_ids);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c, const MemoryOptions& memory)
    : config_(c), memory_(memory) {
  embed_tokens = register_module("embed_tokens", TokenEmbedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c, memory));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, memory.fused_rms_norm));
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& input_ids,
                                      const torch::Tensor& position_ids,
                                      const AttentionFn& attention, const torch::Tensor& doc_ids) {
  torch::Tensor h = embed_tokens(input_ids);  // [b, s/p] -> [b, s/p, H]
  auto [cos, sin] = RopeCosSin(position_ids, config_, h.scalar_type(), h.device());
  for (size_t i = 0; i < layers->size(); ++i) {
    auto layer = layers->ptr<LlamaDecoderLayerImpl>(i);
    if (memory_.activation_checkpointing || !hooks_.empty()) {
      torch::Tensor c = cos, s = sin, docs = doc_ids;
      AttentionFn attn = attention;
      CheckpointOptions opts;
      opts.offload_input = memory_.offload_activations;
      opts.keep_attention = memory_.keep_attention_outputs;
      const int64_t index = static_cast<int64_t>(i);
      if (hooks_.before_use) opts.before_run = [f = hooks_.before_use, index] { f(index); };
      if (hooks_.after_use) opts.after_run = [f = hooks_.after_use, index] { f(index); };
      if (hooks_.after_backward) {
        opts.after_backward = [f = hooks_.after_backward, index] { f(index); };
      }
      h = Checkpoint([layer, c, s, attn,
                      docs](const torch::Tensor& x) { return layer->forward(x, c, s, attn, docs); },
                     h, opts);
    } else {
      h = layer->forward(h, cos, sin, attention, doc_ids);
    }
  }
  return norm(h);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c, const MemoryOptions& memory)
    : config_(c), memory_(memory) {
  model = register_module("model", LlamaModel(c, memory));
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", LinearNoBias(c.hidden_size, c.vocab_size));
  }
}

void LlamaForCausalLMImpl::InitWeights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    item.value().copy_(InitialParameter(item.key(), item.value().sizes(), seed));
  }
}

torch::Tensor LlamaForCausalLMImpl::HeadWeight() const {
  return config_.tie_word_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

torch::Tensor LlamaForCausalLMImpl::Hidden(const torch::Tensor& input_ids,
                                           const torch::Tensor& position_ids,
                                           const AttentionFn& attention,
                                           const torch::Tensor& doc_ids) {
  return model(input_ids, position_ids, attention, doc_ids);
}

LossOutput LlamaForCausalLMImpl::Loss(const torch::Tensor& input_ids,
                                      const torch::Tensor& position_ids,
                                      const torch::Tensor& labels, const AttentionFn& attention,
                                      const torch::Tensor& accuracy_mask,
                                      const torch::Tensor& doc_ids) {
  torch::Tensor h = Hidden(input_ids, position_ids, attention, doc_ids);  // [b, s/p, H]
  const int64_t hidden = h.size(-1);
  torch::Tensor flat_h = h.reshape({-1, hidden});                // [b*s/p, H]
  torch::Tensor flat_y = labels.reshape({-1}).to(torch::kLong);  // [b*s/p]
  torch::Tensor w = HeadWeight();
  LossOutput out;
  out.tokens = flat_y.ne(kIgnoreIndex).sum().item<int64_t>();
  const int64_t n = flat_h.size(0);
  const int64_t tile = memory_.tiled_loss ? std::max<int64_t>(1, memory_.loss_tile_tokens) : n;
  if (memory_.tiled_loss) {
    out.loss_sum = TiledCrossEntropySum(flat_h, w, flat_y, tile);
  } else {
    torch::Tensor logits = flat_h.matmul(w.t());  // [b*s/p, V]
    if (logits.scalar_type() != torch::kDouble) logits = logits.to(torch::kFloat);
    out.loss_sum = F::cross_entropy(
        logits, flat_y,
        F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
  }
  if (accuracy_mask.defined()) {
    torch::NoGradGuard no_grad;
    torch::Tensor mask = accuracy_mask.reshape({-1}).to(torch::kBool) & flat_y.ne(kIgnoreIndex);
    int64_t correct = 0;
    for (int64_t start = 0; start < std::max<int64_t>(n, 1) && n > 0; start += tile) {
      const int64_t len = std::min(tile, n - start);
      torch::Tensor pred = flat_h.narrow(0, start, len).matmul(w.t()).argmax(1);  // [t]
      torch::Tensor m = mask.narrow(0, start, len);
      correct += (pred.eq(flat_y.narrow(0, start, len)) & m).sum().item<int64_t>();
    }
    out.correct = correct;
    out.accuracy_tokens = mask.sum().item<int64_t>();
  }
  return out;
}

}  // namespace ulysses::engine::model
