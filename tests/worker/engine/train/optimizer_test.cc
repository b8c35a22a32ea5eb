// AdamW against a hand-computed update, the LR schedule's shape, and grad clipping.
#include "worker/engine/train/optimizer.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace ulysses::engine::train {
namespace {

TEST(AdamWTest, FirstStepMatchesClosedForm) {
  // After one step m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps) (+ decay).
  torch::Tensor w = torch::tensor({{1.0, -2.0}}, torch::kDouble);
  torch::Tensor n = torch::tensor({3.0}, torch::kDouble);
  w.mutable_grad() = torch::tensor({{0.5, -0.25}}, torch::kDouble);
  n.mutable_grad() = torch::tensor({2.0}, torch::kDouble);
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  cfg.eps = 0;
  AdamW adam(cfg);
  adam.Step({{"model.layers.0.mlp.up_proj.weight", w}, {"model.norm.weight", n}}, 0.01);
  // matrix: decayed then stepped: 1*(1-0.001) - 0.01, -2*(1-0.001) + 0.01
  EXPECT_NEAR(w[0][0].item<double>(), 0.999 - 0.01, 1e-12);
  EXPECT_NEAR(w[0][1].item<double>(), -1.998 + 0.01, 1e-12);
  // norm weight: no decay.
  EXPECT_NEAR(n[0].item<double>(), 3.0 - 0.01, 1e-12);
  EXPECT_EQ(adam.step_count(), 1);
  EXPECT_EQ(adam.StateTensors().size(), 4u);
}

TEST(AdamWTest, StateRoundTrips) {
  torch::Tensor a = torch::ones({2, 2}, torch::kDouble), b = a.clone();
  a.mutable_grad() = torch::full({2, 2}, 0.3, torch::kDouble);
  b.mutable_grad() = a.grad().clone();
  AdamW x(AdamWConfig{}), y(AdamWConfig{});
  x.Step({{"w", a}}, 0.1);
  std::map<std::string, torch::Tensor> saved;
  for (auto& [k, v] : x.StateTensors()) saved[k] = v.clone();
  y.Step({{"w", b}}, 0.1);  // same first step
  AdamW z(AdamWConfig{});
  ASSERT_TRUE(z.LoadState({{"w", b}}, saved, x.step_count()).ok());
  x.Step({{"w", a}}, 0.1);
  z.Step({{"w", b}}, 0.1);
  EXPECT_TRUE(torch::equal(a, b));
  saved.erase("optim/exp_avg/w");
  absl::Status s = z.LoadState({{"w", b}}, saved, 1);
  EXPECT_NE(s.message().find("optim/exp_avg/w is missing"), std::string::npos) << s;
}

TEST(ScheduleTest, WarmupThenDecay) {
  EXPECT_NEAR(ScheduledLr("cosine", 1.0, 0.1, 4, 20, 0), 0.25, 1e-12);
  EXPECT_NEAR(ScheduledLr("cosine", 1.0, 0.1, 4, 20, 3), 1.0, 1e-12);
  EXPECT_NEAR(ScheduledLr("cosine", 1.0, 0.1, 4, 20, 4), 1.0, 1e-12);
  EXPECT_NEAR(ScheduledLr("cosine", 1.0, 0.1, 4, 20, 19), 0.1, 1e-12);
  EXPECT_NEAR(ScheduledLr("linear", 1.0, 0.1, 0, 11, 5), 0.55, 1e-12);
  EXPECT_NEAR(ScheduledLr("constant", 2.0, 0.1, 0, 10, 7), 2.0, 1e-12);
  EXPECT_LT(ScheduledLr("cosine", 1.0, 0.1, 0, 10, 6), ScheduledLr("cosine", 1.0, 0.1, 0, 10, 5));
}

TEST(ClipTest, ScalesToClip) {
  torch::Tensor a = torch::zeros({2}, torch::kDouble);
  a.mutable_grad() = torch::tensor({3.0, 4.0}, torch::kDouble);
  EXPECT_NEAR(ClipGradNorm({{"a", a}}, 1.0), 5.0, 1e-12);
  EXPECT_NEAR(a.grad().norm().item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(ClipGradNorm({{"a", a}}, 0.0), 1.0, 1e-6);  // 0 disables
}

// The folded divide-and-clip (one norm pass, one multiply) equals dividing, then measuring in
// fp64, then clipping, for fp64, fp32 and bf16 gradients.
TEST(ClipTest, FoldedDivideAndClipEqualsTheTwoPassReference) {
  torch::manual_seed(3);
  for (double clip : {0.0, 1e9, 0.5}) {
    std::vector<torch::Tensor> grads = {
        torch::randn({7, 5}, torch::kDouble) * 300, torch::randn({11}, torch::kFloat) * 300,
        torch::randn({4, 3}, torch::kBFloat16) * 300, torch::Tensor()};
    std::vector<torch::Tensor> reference;
    for (const auto& g : grads) reference.push_back(g.defined() ? g.clone() : g);
    const double divisor = 640.0;
    double squares = 0;
    for (auto& g : reference) {
      if (!g.defined()) continue;
      squares += (g.to(torch::kDouble) / divisor).pow(2).sum().item<double>();  // Exact in fp64.
      g.div_(divisor);
    }
    const double want_norm = std::sqrt(squares);
    if (clip > 0 && want_norm > clip) {
      for (auto& g : reference) {
        if (g.defined()) g.mul_(clip / (want_norm + 1e-6));
      }
    }
    const double norm = DivideAndClipGrads(grads, divisor, clip);
    EXPECT_NEAR(norm, want_norm, 1e-6 * want_norm) << "clip " << clip;
    // The clip coefficient comes from one norm over every tensor, the fp32 one measured in fp32
    // (_foreach_norm keeps the dtype): once clipping applies, fp64 values agree to fp32 precision.
    const double fp64_rtol = clip > 0 && want_norm > clip ? 1e-6 : 1e-12;
    EXPECT_TRUE(torch::allclose(grads[0], reference[0], fp64_rtol, 0)) << "clip " << clip;
    EXPECT_TRUE(torch::allclose(grads[1], reference[1], 1e-6, 0)) << "clip " << clip;
    EXPECT_TRUE(
        torch::allclose(grads[2].to(torch::kFloat), reference[2].to(torch::kFloat), 1e-2, 0))
        << "clip " << clip;
    EXPECT_FALSE(grads[3].defined());
  }
  // A non-finite gradient: the norm says so and the grads are only divided.
  std::vector<torch::Tensor> bad = {torch::tensor({std::numeric_limits<double>::infinity(), 2.0})};
  EXPECT_FALSE(std::isfinite(DivideAndClipGrads(bad, 2.0, 1.0)));
  EXPECT_EQ(bad[0][1].item<double>(), 1.0);
}

}  // namespace
}  // namespace ulysses::engine::train
