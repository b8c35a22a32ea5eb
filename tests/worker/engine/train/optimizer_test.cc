// AdamW against a hand-computed update, the LR schedule's shape, and grad clipping.
#include "worker/engine/train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace ulysses::engine::train
