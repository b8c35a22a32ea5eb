#include "client/plan.h"

#include <algorithm>

namespace ulysses::client {

int64_t DtypeBytes(const std::string& dtype) {
  if (dtype == "float64") {
    return 8;
  }
  if (dtype == "bfloat16" || dtype == "float16") {
    return 2;
  }
  return 4;
}

double ParameterCount(const spec::ModelSpec& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double d = static_cast<double>(m.head_dim());
  const double hq = static_cast<double>(m.num_attention_heads);
  const double hkv = static_cast<double>(m.num_key_value_heads);
  const double inter = static_cast<double>(m.intermediate_size);
  const double vocab = static_cast<double>(m.vocab_size);
  // q, k, v, o projections; gate, up, down; two RMSNorm weights.
  const double per_layer = h * hq * d + 2 * h * hkv * d + hq * d * h + 3 * h * inter + 2 * h;
  const double embeddings = vocab * h * (m.tie_word_embeddings ? 1 : 2);
  return embeddings + static_cast<double>(m.num_hidden_layers) * per_layer + h;
}

namespace {

// Rough peak activation bytes per rank for one micro-batch of N tokens on P ranks.
double ActivationBytes(const spec::JobSpec& s, const StagePlan& p) {
  const spec::ModelSpec& m = s.model;
  const double b = static_cast<double>(DtypeBytes(m.dtype));
  const double n = static_cast<double>(p.tokens_per_rank);
  const double big_n = static_cast<double>(p.seq_len);
  const double h = static_cast<double>(m.hidden_size);
  const double inter = static_cast<double>(m.intermediate_size);
  const double layers = static_cast<double>(m.num_hidden_layers);
  const double d = static_cast<double>(m.head_dim());
  const double local_q = static_cast<double>(m.num_attention_heads) / p.sp;
  const double local_kv = static_cast<double>(p.kv_heads_exchanged) / p.sp;
  // Saved between forward and backward: one hidden state per layer with checkpointing
  // (none on the device when offloaded), else every layer's intermediates (~8H + 3I).
  double saved = 0;
  if (s.memory.activation_checkpointing) {
    saved = s.parallelism.offload_activations ? 0 : layers * n * h * b;
  } else {
    saved = layers * n * (8 * h + 3 * inter) * b;
  }
  // One layer's working set during (re)computation, doubled for its gradients:
  // attention over the full sequence for the local heads, and the MLP over a tile
  // (about H tokens with tiled_mlp, as in ALST) or the whole shard.
  const double attention = 2 * big_n * (2 * local_q + 2 * local_kv) * d * b;
  const double mlp_tokens = s.memory.tiled_mlp ? std::min(n, h) : n;
  const double mlp = 2 * mlp_tokens * (3 * inter + h) * b;
  // Logits and their gradient in fp32, per tile with tiled_loss.
  const double loss_tokens =
      s.memory.tiled_loss ? std::min(n, static_cast<double>(s.memory.loss_tile_tokens)) : n;
  const double logits = 2 * loss_tokens * static_cast<double>(m.vocab_size) * 4;
  return saved + attention + mlp + logits;
}

}  // namespace

std::vector<StagePlan> PlanJob(const spec::JobSpec& s) {
  const spec::ModelSpec& m = s.model;
  const bool shape_known = m.hidden_size > 0 && m.num_attention_heads > 0 &&
                           m.num_key_value_heads > 0 && m.vocab_size > 0;
  const double params = shape_known ? ParameterCount(m) : 0;
  const double b = static_cast<double>(DtypeBytes(m.dtype));
  std::vector<StagePlan> plans;
  for (size_t i = 0; i < s.stages.size(); ++i) {
    StagePlan p;
    p.seq_len = s.stages[i].seq_len;
    p.steps = s.stages[i].steps;
    p.sp = std::max<int64_t>(1, s.StageSp(i));
    p.dp = std::max<int64_t>(1, s.StageDp(i));
    p.world = p.sp * p.dp;
    p.tokens_per_rank = p.seq_len / p.sp;
    p.kv_heads_exchanged = spec::UlyssesKvHeadsExchanged(m.num_key_value_heads, p.sp);
    if (shape_known) {
      // q, k, v in (scatter heads) and the attention output back: (2 Hq + 2 Hkv') D N/P.
      // SP 1 holds the whole sequence and exchanges nothing.
      p.a2a_elements =
          p.sp == 1
              ? 0
              : static_cast<double>(2 * m.num_attention_heads + 2 * p.kv_heads_exchanged) *
                    static_cast<double>(m.head_dim()) * static_cast<double>(p.tokens_per_rank);
      p.a2a_bytes = p.a2a_elements * b;
      p.activation_bytes = ActivationBytes(s, p);
      const double adam = s.parallelism.offload_optimizer ? 0 : 8;  // fp32 m and v
      p.model_state_bytes = params * (2 * b + adam);
    }
    plans.push_back(p);
  }
  return plans;
}

}  // namespace ulysses::client
