// The CPU AdamW kernel (cpu_adamw.h) against the engine's reference loop of tensor ops
// (AdamWConfig::fast_cpu = false) over 20 steps: fp32 parameters, bf16 parameters with fp32
// masters, fp32 and bf16 gradients, decayed matrices and undecayed norm weights, tensors longer
// than a thread's grain and of odd length.
//
// Tolerance: with libtorch 1.13 (CI's Debian build) every parameter, master and moment is equal
// to the bit. With any other libtorch (pip 2.x on GPU machines, whose addcmul_ may round without
// a fused multiply-add) each value is within 8 fp32 ulps of its tensor's largest magnitude
// (|a - b| <= 8 * 2^-23 * max|b|): one-ulp differences in v carry through later steps, and a
// weight near zero is the difference of terms of that magnitude. bf16 parameters are exactly
// their masters rounded, and within one bf16 step of the reference's. The kernel's bf16 rounding
// equals c10's to the bit (NaN: NaN), and its result does not depend on the thread count.
#include "worker/engine/train/cpu_adamw.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "worker/engine/torch_compat.h"
#include "worker/engine/train/optimizer.h"

namespace ulysses::engine::train {
namespace {

constexpr double kUlps = 8;
constexpr double kFp32Eps = 1.0 / (1 << 23);
// CI's libtorch: the kernel reproduces the reference to the bit.
constexpr bool kBitExact = TORCH_VERSION_MAJOR < 2;

// True when a equals b within the stated tolerance (to the bit where kBitExact).
bool Matches(const torch::Tensor& a, const torch::Tensor& b) {
  if (kBitExact) return torch::equal(a, b);
  torch::Tensor x = a.to(torch::kDouble), y = b.to(torch::kDouble);
  const double allowed = y.abs().max().item<double>() * kUlps * kFp32Eps;
  return (x - y).abs().max().item<double>() <= allowed;
}

struct Case {
  std::string name;
  std::vector<int64_t> shape;
};

// Two AdamWs, one per kernel, stepped `steps` times on identical copies of the same tensors.
void CompareOverSteps(torch::Dtype param_dtype, torch::Dtype grad_dtype, int steps) {
  torch::manual_seed(11);
  const std::vector<Case> cases = {
      {"model.layers.0.mlp.up_proj.weight", {301, 257}},  // > 2 grains, odd length: decayed
      {"model.layers.0.input_layernorm.weight", {37}},    // norm: not decayed
      {"lm_head.weight", {5, 3}}};
  NamedParams fast, reference;
  std::vector<torch::Tensor> initial;
  for (const Case& c : cases) {
    torch::Tensor p = (torch::randn(c.shape) * 0.02).to(param_dtype);
    if (c.shape.size() == 1)
      p = (torch::ones(c.shape) + 0.01 * torch::randn(c.shape)).to(param_dtype);
    initial.push_back(p.clone());
    fast.emplace_back(c.name, p.clone());
    reference.emplace_back(c.name, p.clone());
  }
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  AdamW a(cfg);
  cfg.fast_cpu = false;
  AdamW b(cfg);
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> grads;
    for (const Case& c : cases) {
      // Gradients over many magnitudes, some exactly zero.
      torch::Tensor g = torch::randn(c.shape) * std::pow(10.0, step % 5 - 3);
      g.masked_fill_(torch::rand(c.shape) < 0.05, 0);
      grads.push_back(g.to(grad_dtype));
    }
    const double lr = 1e-3 * (1 + step % 3);
    a.Step(fast, grads, lr);
    b.Step(reference, grads, lr);
  }
  auto ref_state = b.StateTensors();
  auto fast_state = a.StateTensors();
  ASSERT_EQ(fast_state.size(), ref_state.size());
  for (size_t i = 0; i < fast_state.size(); ++i) {
    ASSERT_EQ(fast_state[i].first, ref_state[i].first);
    EXPECT_EQ(fast_state[i].second.scalar_type(), torch::kFloat);
    EXPECT_TRUE(Matches(fast_state[i].second, ref_state[i].second)) << fast_state[i].first;
  }
  for (size_t i = 0; i < fast.size(); ++i) {
    const std::string& name = fast[i].first;
    ASSERT_EQ(fast[i].second.scalar_type(), param_dtype);
    if (param_dtype == torch::kFloat) {
      EXPECT_TRUE(Matches(fast[i].second, reference[i].second)) << name;
    } else {
      // The bf16 parameter is exactly its master rounded (the kernel wrote it), and within one
      // bf16 step of the reference's (the masters differ by ulps, which can cross a rounding
      // boundary).
      EXPECT_TRUE(torch::equal(fast[i].second, a.Master(name).to(param_dtype))) << name;
      if (kBitExact) {
        EXPECT_TRUE(torch::equal(fast[i].second, reference[i].second)) << name;
      } else {
        torch::Tensor diff =
            (fast[i].second.to(torch::kFloat) - reference[i].second.to(torch::kFloat)).abs();
        torch::Tensor bf16_ulp =
            reference[i].second.to(torch::kFloat).abs().max() * (1.0 / 128) + 1e-30;
        EXPECT_TRUE((diff <= bf16_ulp).all().item<bool>()) << name;
      }
    }
  }
  // The parameters moved (an update that did nothing would not be compared at all).
  for (size_t i = 0; i < fast.size(); ++i) {
    EXPECT_FALSE(torch::equal(fast[i].second, initial[i])) << fast[i].first;
  }
}

TEST(CpuAdamWTest, Fp32ParamsMatchTheReferenceToFp32Rounding) {
  CompareOverSteps(torch::kFloat, torch::kFloat, 20);
}

TEST(CpuAdamWTest, Bf16ParamsWithMastersMatchTheReference) {
  CompareOverSteps(torch::kBFloat16, torch::kFloat, 20);     // ZeRO's fp32 gradient chunks
  CompareOverSteps(torch::kBFloat16, torch::kBFloat16, 20);  // stage 0's bf16 .grad
}

TEST(CpuAdamWTest, TheKernelUpdatesEveryElement) {
  // One step on known values: after step 1, m_hat = g and v_hat = g^2, so w moves by
  // -lr * g / (|g| + eps) (after the decay).
  torch::Tensor w = torch::full({70000}, 0.5f), m = torch::zeros({70000}),
                v = torch::zeros({70000});
  torch::Tensor g = torch::linspace(-1, 1, 70000).add_(1e-3);
  CpuAdamWStep step;
  step.lr = 1e-2;
  step.weight_decay = 0.1;
  step.eps = 0;
  CpuAdamWUpdate({{w, m, v, g, {}, /*decays=*/true}}, step);
  torch::Tensor want = 0.5f * static_cast<float>(1 - 1e-3) - 1e-2 * g.sign();
  EXPECT_TRUE(torch::allclose(w, want, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(m, 0.1 * g, 1e-6, 0));
}

TEST(CpuAdamWTest, Bf16RoundingEqualsC10ToTheBit) {
  // lr 0, no decay, zero gradient: the target is unchanged and only rounded into the parameter.
  std::vector<float> edge = {0.f,
                             -0.f,
                             1.f,
                             1.00390625f,  // exactly halfway between two bf16 values: ties to even
                             1.01171875f,  // halfway, rounds up to even
                             std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::denorm_min(),
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN()};
  torch::Tensor w = torch::cat({torch::tensor(edge), torch::randn({100003}) * 1e3});
  const int64_t n = w.numel();
  torch::Tensor m = torch::zeros({n}), v = torch::zeros({n}), g = torch::zeros({n});
  torch::Tensor out = torch::empty({n}, torch::kBFloat16);
  CpuAdamWStep step;  // lr 0
  CpuAdamWUpdate({{w, m, v, g, out, false}}, step);
  torch::Tensor want = w.to(torch::kBFloat16);
  // Every number to the bit; the NaN stays a NaN (libtorch's vector copy writes 0xFFFF, its
  // scalar conversion 0x7FC0: the kernel writes the latter).
  torch::Tensor nan = w.isnan();
  ASSERT_EQ(nan.sum().item<int64_t>(), 1);
  EXPECT_TRUE(torch::equal(out.view(torch::kShort).masked_select(~nan),
                           want.view(torch::kShort).masked_select(~nan)));
  EXPECT_EQ(out.view(torch::kShort).masked_select(nan).item<int64_t>(), 0x7fc0);
}

TEST(CpuAdamWTest, ResultDoesNotDependOnTheThreadCount) {
  const int threads = at::get_num_threads();
  torch::manual_seed(5);
  torch::Tensor w0 = torch::randn({200001}), g = torch::randn({200001});
  torch::Tensor out[2];
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    torch::Tensor w = w0.clone(), m = torch::zeros_like(w), v = torch::zeros_like(w);
    CpuAdamWStep step;
    step.lr = 1e-3;
    step.weight_decay = 0.1;
    for (int s = 1; s <= 3; ++s) {
      step.step = s;
      CpuAdamWUpdate({{w, m, v, g, {}, true}}, step);
    }
    out[t - 1] = w;
  }
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(out[0], out[1]));
  EXPECT_FALSE(torch::equal(out[0], w0));
}

TEST(CpuAdamWTest, RefusesWhatItCannotTake) {
  torch::Tensor f = torch::zeros({4});
  EXPECT_TRUE(CpuAdamWApplies({f, f.clone(), f.clone(), f.clone(), {}, false}));
  EXPECT_FALSE(CpuAdamWApplies({f.to(torch::kDouble), f, f, f, {}, false}));  // fp64 target
  EXPECT_FALSE(CpuAdamWApplies({f, f, f, f.to(torch::kHalf), {}, false}));    // fp16 grad
  EXPECT_FALSE(CpuAdamWApplies({f, f, f, f, f.to(torch::kHalf), false}));     // fp16 param
  EXPECT_FALSE(CpuAdamWApplies({f, f, f, torch::zeros({5}), {}, false}));     // numel
  torch::Tensor strided = torch::zeros({4, 2}).select(1, 0);
  EXPECT_FALSE(CpuAdamWApplies({strided, f, f, f, {}, false}));  // not contiguous
}

}  // namespace
}  // namespace ulysses::engine::train
