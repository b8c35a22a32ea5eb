// Model-level tests at sp 1 with a naive causal attention oracle: HF parameter
// names, tiled loss == dense loss (value and grads), activation checkpointing and
// tiled MLP give identical gradients, RoPE rotate_half convention, deterministic init.
#include "worker/engine/model/llama.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tests/testing/tiny_model.h"

namespace ulysses::engine::model {
namespace {

namespace F = torch::nn::functional;

// q [b, s, hq, d], k/v [b, s, hkv, d] -> [b, s, hq, d]; plain masked softmax.
torch::Tensor NaiveCausal(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& /*doc_ids*/) {
  const int64_t hq = q.size(2), hkv = k.size(2), s = q.size(1), d = q.size(3);
  torch::Tensor kk = k.repeat_interleave(hq / hkv, 2).transpose(1, 2);  // [b, hq, s, d]
  torch::Tensor vv = v.repeat_interleave(hq / hkv, 2).transpose(1, 2);
  torch::Tensor qq = q.transpose(1, 2);
  torch::Tensor scores = qq.matmul(kk.transpose(2, 3)) / std::sqrt(static_cast<double>(d));
  torch::Tensor mask = torch::ones({s, s}, torch::kBool).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  return scores.softmax(-1).matmul(vv).transpose(1, 2);  // [b, s, hq, d]
}

LlamaConfig Tiny(bool tied = false) {
  LlamaConfig c = ::ulysses::testing::TinyLlama();
  c.tie_word_embeddings = tied;
  return c;
}

struct Batch {
  torch::Tensor ids, labels, pos;
};

Batch MakeBatch(int64_t s, int64_t vocab) {
  torch::manual_seed(7);
  torch::Tensor tokens = torch::randint(0, vocab, {1, s + 1}, torch::kLong);
  Batch b;
  b.ids = tokens.narrow(1, 0, s);
  b.labels = tokens.narrow(1, 1, s).clone();
  b.labels.index_put_({0, 3}, kIgnoreIndex);
  b.pos = torch::arange(s, torch::kLong);
  return b;
}

std::map<std::string, torch::Tensor> LossAndGrads(const LlamaConfig& c, const MemoryOptions& m,
                                                  double* loss) {
  LlamaForCausalLM model(c, m);
  model->InitWeights(42);
  model->to(torch::kDouble);
  Batch b = MakeBatch(24, c.vocab_size);
  LossOutput out = model->Loss(b.ids, b.pos, b.labels, NaiveCausal);
  out.loss_sum.backward();
  *loss = out.loss_sum.item<double>();
  EXPECT_EQ(out.tokens, 23);
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : model->named_parameters()) grads[p.key()] = p.value().grad().clone();
  return grads;
}

TEST(LlamaTest, ParameterNamesMatchHuggingFace) {
  LlamaForCausalLM model(Tiny(), MemoryOptions{});
  std::set<std::string> names;
  for (auto& p : model->named_parameters()) names.insert(p.key());
  EXPECT_TRUE(names.count("model.embed_tokens.weight"));
  EXPECT_TRUE(names.count("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.0.post_attention_layernorm.weight"));
  EXPECT_TRUE(names.count("model.norm.weight"));
  EXPECT_TRUE(names.count("lm_head.weight"));
  EXPECT_EQ(names.size(), 2u + 2u * 9u + 1u);
  EXPECT_EQ(model->named_parameters()["model.layers.0.self_attn.k_proj.weight"].sizes(),
            torch::IntArrayRef({16, 32}));
  LlamaForCausalLM tied(Tiny(/*tied=*/true), MemoryOptions{});
  EXPECT_EQ(tied->named_parameters().find("lm_head.weight"), nullptr);
}

TEST(LlamaTest, InitIsDeterministic) {
  LlamaForCausalLM a(Tiny(), MemoryOptions{}), b(Tiny(), MemoryOptions{}),
      c(Tiny(), MemoryOptions{});
  a->InitWeights(1);
  b->InitWeights(1);
  c->InitWeights(2);
  auto pa = a->named_parameters(), pb = b->named_parameters(), pc = c->named_parameters();
  EXPECT_TRUE(torch::equal(pa["lm_head.weight"], pb["lm_head.weight"]));
  EXPECT_FALSE(torch::equal(pa["lm_head.weight"], pc["lm_head.weight"]));
  EXPECT_NEAR(pa["model.embed_tokens.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_TRUE(torch::equal(pa["model.norm.weight"], torch::ones({32})));
}

TEST(LlamaTest, RopeRotateHalfAtGlobalPositions) {
  // Position 0 is the identity; a shard's table equals the slice of the full table.
  LlamaConfig config = Tiny();
  config.hidden_size = 16;  // head_dim 4
  auto [cos, sin] = RopeCosSin(torch::arange(8, torch::kLong), config, torch::kDouble, torch::kCPU);
  torch::Tensor x = torch::randn({1, 8, 1, 4}, torch::kDouble);
  torch::Tensor y = ApplyRope(x, cos, sin);
  EXPECT_TRUE(torch::allclose(y.select(1, 0), x.select(1, 0)));
  auto [cos2, sin2] =
      RopeCosSin(torch::arange(4, 8, torch::kLong), config, torch::kDouble, torch::kCPU);
  EXPECT_TRUE(torch::allclose(cos2, cos.narrow(0, 4, 4)));
  // rotate_half: x = [a, b, c, e] at position 1 with freqs (1, 1/100):
  // out[0] = a cos1 - c sin1.
  torch::Tensor one = ApplyRope(x.narrow(1, 1, 1), cos.narrow(0, 1, 1), sin.narrow(0, 1, 1));
  double a = x[0][1][0][0].item<double>(), c = x[0][1][0][2].item<double>();
  EXPECT_NEAR(one[0][0][0][0].item<double>(), a * std::cos(1.0) - c * std::sin(1.0), 1e-12);
}

TEST(LlamaTest, Llama3RopeScalingFrequencies) {
  // head_dim 16, theta 1e4: f_i = 1e4^(-i/8), wavelength w_i = 2 pi / f_i = 6.3, 19.9, 62.8,
  // 198.7, 628.3, 1987, 6283, 19869. With C = 1024, low 1, high 4: w < C/4 = 256 keeps f
  // (i 0..3), w > C/1 = 1024 divides it by the factor 8 (i 5..7), i = 4 is blended.
  LlamaConfig c = Tiny();
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.rope_theta = 10000.0;
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 1024};
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  torch::Tensor f = RopeInverseFrequencies(c);
  ASSERT_EQ(f.sizes(), torch::IntArrayRef({8}));
  const double pi = std::acos(-1.0);
  for (int i = 0; i < 8; ++i) {
    const double plain = std::pow(10000.0, -i / 8.0);
    double want = plain;
    if (i == 4) {
      const double s = (1024.0 / (2 * pi / plain) - 1.0) / (4.0 - 1.0);
      want = (1 - s) * plain / 8.0 + s * plain;
    } else if (i > 4) {
      want = plain / 8.0;
    }
    EXPECT_NEAR(f[i].item<double>(), want, 1e-15 * want) << "i = " << i;
  }
  // The blended one, as printed by scripts/reference_llama.py's own implementation.
  EXPECT_NEAR(f[4].item<double>(), 0.003086760967011274, 1e-17);
  // The tables use them: position 100, dimension 5 and its rotate_half partner 13.
  auto [cos, sin] = RopeCosSin(torch::tensor({100}, torch::kLong), c, torch::kDouble, torch::kCPU);
  EXPECT_NEAR(cos[0][5].item<double>(), std::cos(100 * std::pow(10000.0, -5 / 8.0) / 8.0), 1e-12);
  EXPECT_NEAR(sin[0][13].item<double>(), std::sin(100 * std::pow(10000.0, -5 / 8.0) / 8.0), 1e-12);
  // No scaling: the plain frequencies.
  c.rope_scaling = {};
  EXPECT_NEAR(RopeInverseFrequencies(c)[5].item<double>(), std::pow(10000.0, -5 / 8.0), 1e-15);
  // linear (position interpolation): every frequency divided by the factor.
  c.rope_scaling = {"linear", 4.0, 0, 0, 0};
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  torch::Tensor linear = RopeInverseFrequencies(c);
  for (int i = 0; i < 8; ++i) {
    const double want = std::pow(10000.0, -i / 8.0) / 4.0;
    EXPECT_NEAR(linear[i].item<double>(), want, 1e-15 * want) << "i = " << i;
  }
  // It takes the factor alone: a llama3 number beside it is refused, naming it.
  c.rope_scaling = {"linear", 4.0, 1.0, 0, 0};
  EXPECT_NE(c.Validate().message().find("rope_scaling.low_freq_factor: 1.0 is set but rope_type "
                                        "linear takes only factor"),
            std::string::npos)
      << c.Validate();
}

void ExpectSameGrads(const std::map<std::string, torch::Tensor>& a,
                     const std::map<std::string, torch::Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, g] : a) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(b.at(name).defined());
    EXPECT_LE((g - b.at(name)).abs().max().item<double>(),
              tol * (1 + g.abs().max().item<double>()));
  }
}

TEST(LlamaTest, TiledLossMatchesDense) {
  for (bool tied : {false, true}) {
    double dense_loss = 0, tiled_loss = 0;
    auto dense = LossAndGrads(Tiny(tied), MemoryOptions{}, &dense_loss);
    MemoryOptions m;
    m.tiled_loss = true;
    m.loss_tile_tokens = 5;  // uneven tiles
    auto tiled = LossAndGrads(Tiny(tied), m, &tiled_loss);
    EXPECT_NEAR(dense_loss, tiled_loss, 1e-10 * dense_loss);
    ExpectSameGrads(dense, tiled, 1e-10);
  }
}

// The tiled loss is fused with its gradient: backward scales what the forward computed from each
// tile's logits and reads neither the hidden states nor the weight again (so it recomputes no
// logits). Changing both after the forward leaves the gradients those of the forward's values.
TEST(LlamaTest, TiledLossGradientsComeFromTheForwardsLogits) {
  torch::manual_seed(3);
  auto opt = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor hidden = torch::randn({13, 8}, opt), weight = torch::randn({50, 8}, opt);
  torch::Tensor labels = torch::randint(0, 50, {13}, torch::kLong);
  labels.index_put_({4}, kIgnoreIndex);
  // Reference: the dense loss on fresh leaves, output gradient 0.5.
  torch::Tensor h_ref = hidden.clone().requires_grad_(true),
                w_ref = weight.clone().requires_grad_(true);
  torch::Tensor dense = F::cross_entropy(
      h_ref.matmul(w_ref.t()), labels,
      F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
  (dense * 0.5).backward();
  torch::Tensor h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
  torch::Tensor tiled = TiledCrossEntropySum(h, w, labels, /*tile_tokens=*/4);
  EXPECT_NEAR(tiled.item<double>(), dense.item<double>(), 1e-10 * dense.item<double>());
  {
    torch::NoGradGuard no_grad;
    h.mul_(3.0);
    w.add_(1.0);
  }
  (tiled * 0.5).backward();
  EXPECT_LT((h.grad() - h_ref.grad()).abs().max().item<double>(), 1e-12);
  EXPECT_LT((w.grad() - w_ref.grad()).abs().max().item<double>(), 1e-12);
  // Without grad mode nothing but the loss is computed; the value is the same.
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(TiledCrossEntropySum(hidden, weight, labels, 4).item<double>(), dense.item<double>(),
              1e-10 * dense.item<double>());
}

TEST(LlamaTest, CheckpointingAndTiledMlpGiveSameGradients) {
  double base_loss = 0, ckpt_loss = 0;
  auto base = LossAndGrads(Tiny(), MemoryOptions{}, &base_loss);
  MemoryOptions m;
  m.activation_checkpointing = true;
  m.tiled_mlp = true;
  m.mlp_tile_tokens = 7;
  auto ckpt = LossAndGrads(Tiny(), m, &ckpt_loss);
  EXPECT_NEAR(base_loss, ckpt_loss, 1e-12 * base_loss);
  ExpectSameGrads(base, ckpt, 1e-10);
}

// The speed levers of MemoryOptions change rounding only: fp64 loss and every gradient equal.
TEST(LlamaTest, FusedGateUpAndRmsNormGiveSameGradients) {
  double base_loss = 0, fused_loss = 0;
  MemoryOptions plain;
  plain.fused_rms_norm = false;  // The composite RMSNorm (fused is the default).
  auto base = LossAndGrads(Tiny(), plain, &base_loss);
  MemoryOptions m;
  m.fuse_gate_up = true;
  m.fused_rms_norm = true;  // at::rms_norm on libtorch >= 2.4, the composite one before.
  auto fused = LossAndGrads(Tiny(), m, &fused_loss);
  EXPECT_NEAR(base_loss, fused_loss, 1e-12 * base_loss);
  ExpectSameGrads(base, fused, 1e-10);
  ASSERT_TRUE(fused.count("model.layers.0.mlp.gate_proj.weight"));  // Still two parameters.
  ASSERT_TRUE(fused.count("model.layers.0.mlp.up_proj.weight"));
}

TEST(LlamaTest, AccuracyCountsArgmaxHits) {
  LlamaForCausalLM model(Tiny(), MemoryOptions{});
  model->InitWeights(3);
  Batch b = MakeBatch(16, 64);
  torch::NoGradGuard no_grad;
  torch::Tensor h = model->Hidden(b.ids, b.pos, NaiveCausal);
  torch::Tensor pred = h.matmul(model->HeadWeight().t()).argmax(-1);  // [1, s]
  torch::Tensor labels = pred.clone();
  labels.index_put_({0, 0}, (pred[0][0].item<int64_t>() + 1) % 64);  // one miss
  LossOutput out = model->Loss(b.ids, b.pos, labels, NaiveCausal, labels.ne(kIgnoreIndex));
  EXPECT_EQ(out.accuracy_tokens, 16);
  EXPECT_EQ(out.correct, 15);
}

TEST(LlamaTest, ConfigValidationNamesField) {
  LlamaConfig c = Tiny();
  c.num_key_value_heads = 3;
  absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spec.model.num_key_value_heads: 3"), std::string::npos) << s;
}

}  // namespace
}  // namespace ulysses::engine::model
