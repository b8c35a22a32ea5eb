// CausalAttention (blockwise, flash-style CPU kernel) against the naive masked-softmax reference,
// forward and gradients, plus a peak-memory check in a fresh child process.
#include "worker/engine/attention/attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/testing/rank_processes.h"

namespace ulysses::engine {
namespace {

struct Grads {
  torch::Tensor out, dq, dk, dv;
};

// out and d(sum(out * w))/d{q,k,v} for one implementation.
template <typename Fn>
Grads RunAndGrad(Fn fn, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                 const torch::Tensor& w) {
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true),
       v1 = v.clone().requires_grad_(true);
  torch::Tensor out = fn(q1, k1, v1);
  (out * w).sum().backward();
  return {out.detach(), q1.grad(), k1.grad(), v1.grad()};
}

double MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// (dtype, s, hq, hkv, block)
class CausalAttentionVsNaive
    : public ::testing::TestWithParam<
          std::tuple<torch::ScalarType, int64_t, int64_t, int64_t, int64_t>> {};

TEST_P(CausalAttentionVsNaive, ForwardAndGradientsMatch) {
  auto [dtype, s, hq, hkv, block] = GetParam();
  torch::manual_seed(1234 + s + block);
  const int64_t b = 2, d = 8;
  auto opt = torch::TensorOptions().dtype(dtype);
  auto q = torch::randn({b, s, hq, d}, opt), k = torch::randn({b, s, hkv, d}, opt),
       v = torch::randn({b, s, hkv, d}, opt), w = torch::randn({b, s, hq, d}, opt);
  AttentionOptions ao;
  ao.block_size = block;
  Grads got = RunAndGrad([&](auto& a, auto& bb, auto& c) { return CausalAttention(a, bb, c, ao); },
                         q, k, v, w);
  Grads want = RunAndGrad([](auto& a, auto& bb, auto& c) { return NaiveCausalAttention(a, bb, c); },
                          q, k, v, w);
  const double tol = dtype == torch::kDouble ? 1e-10 : 1e-5;
  ASSERT_EQ(got.out.sizes(), q.sizes());
  EXPECT_LT(MaxDiff(got.out, want.out), tol);
  EXPECT_LT(MaxDiff(got.dq, want.dq), tol);
  EXPECT_LT(MaxDiff(got.dk, want.dk), tol);
  EXPECT_LT(MaxDiff(got.dv, want.dv), tol);
  // The gradients are not trivially zero (with s == 1 softmax is constant, so dk is exactly 0).
  EXPECT_GT(want.dv.abs().max().item<double>(), 1e-3);
  if (s > 1) EXPECT_GT(want.dk.abs().max().item<double>(), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, CausalAttentionVsNaive,
    ::testing::Values(
        // fp64 within 1e-10: s not divisible by the block, GQA 8q/2kv, blocks 16..512
        std::make_tuple(torch::kDouble, 37, 8, 2, 16),
        std::make_tuple(torch::kDouble, 100, 8, 2, 32),
        std::make_tuple(torch::kDouble, 129, 8, 2, 64),
        std::make_tuple(torch::kDouble, 200, 8, 2, 512),
        std::make_tuple(torch::kDouble, 64, 4, 4, 16), std::make_tuple(torch::kDouble, 1, 2, 1, 16),
        // fp32 within 1e-5
        std::make_tuple(torch::kFloat, 37, 8, 2, 16), std::make_tuple(torch::kFloat, 150, 8, 2, 64),
        std::make_tuple(torch::kFloat, 300, 4, 4, 128),
        std::make_tuple(torch::kFloat, 77, 8, 2, 512)));

// Document ids [b, s] from per-row document lengths (each row sums to s).
torch::Tensor DocIds(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<torch::Tensor> out;
  for (const auto& lengths : rows) {
    std::vector<int64_t> ids;
    for (size_t d = 0; d < lengths.size(); ++d) ids.insert(ids.end(), lengths[d], d);
    out.push_back(torch::tensor(ids, torch::kLong));
  }
  return torch::stack(out);
}

// block, per-row document lengths of a [2, 70] batch.
class DocumentAttentionVsNaive
    : public ::testing::TestWithParam<std::tuple<int64_t, std::vector<std::vector<int64_t>>>> {};

TEST_P(DocumentAttentionVsNaive, ForwardAndGradientsMatchTheMaskedReference) {
  auto [block, rows] = GetParam();
  torch::manual_seed(77 + block);
  const int64_t b = 2, s = 70, hq = 4, hkv = 2, d = 8;
  auto opt = torch::TensorOptions().dtype(torch::kDouble);
  auto q = torch::randn({b, s, hq, d}, opt), k = torch::randn({b, s, hkv, d}, opt),
       v = torch::randn({b, s, hkv, d}, opt), w = torch::randn({b, s, hq, d}, opt);
  torch::Tensor docs = DocIds(rows);
  AttentionOptions ao;
  ao.block_size = block;
  Grads got = RunAndGrad(
      [&](auto& a, auto& bb, auto& c) { return CausalAttention(a, bb, c, ao, docs); }, q, k, v, w);
  Grads want = RunAndGrad(
      [&](auto& a, auto& bb, auto& c) { return NaiveCausalAttention(a, bb, c, docs); }, q, k, v, w);
  EXPECT_LT(MaxDiff(got.out, want.out), 1e-10);
  EXPECT_LT(MaxDiff(got.dq, want.dq), 1e-10);
  EXPECT_LT(MaxDiff(got.dk, want.dk), 1e-10);
  EXPECT_LT(MaxDiff(got.dv, want.dv), 1e-10);
  // The document mask matters: plain causal attention differs.
  EXPECT_GT(MaxDiff(want.out, NaiveCausalAttention(q, k, v)), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DocumentAttentionVsNaive,
    ::testing::Values(
        std::make_tuple(16, std::vector<std::vector<int64_t>>{{10, 30, 30}, {70}}),
        std::make_tuple(8, std::vector<std::vector<int64_t>>{{1, 1, 20, 48}, {35, 35}}),
        std::make_tuple(32, std::vector<std::vector<int64_t>>{{32, 32, 6}, {5, 5, 5, 55}}),
        std::make_tuple(512, std::vector<std::vector<int64_t>>{{17, 53}, {69, 1}})));

TEST(DocumentAttentionTest, PackedDocumentsEqualEachDocumentAlone) {
  torch::manual_seed(5);
  const std::vector<int64_t> lengths = {13, 40, 11};
  const int64_t s = 64, hq = 4, hkv = 4, d = 8;
  auto opt = torch::TensorOptions().dtype(torch::kDouble);
  auto q = torch::randn({1, s, hq, d}, opt), k = torch::randn({1, s, hkv, d}, opt),
       v = torch::randn({1, s, hkv, d}, opt);
  AttentionOptions ao;
  ao.block_size = 16;
  torch::Tensor packed = CausalAttention(q, k, v, ao, DocIds({lengths}));
  int64_t at = 0;
  for (int64_t n : lengths) {
    torch::Tensor alone = CausalAttention(q.narrow(1, at, n), k.narrow(1, at, n),
                                          v.narrow(1, at, n), ao);  // [1, n, hq, d]
    EXPECT_LT(MaxDiff(packed.narrow(1, at, n), alone), 1e-12) << "document at " << at;
    at += n;
  }
}

// Skipping is observable: NaN values in document 0 never reach document 1 when its tiles are
// skipped (a masked tile would still multiply 0 * NaN = NaN), forward and backward.
TEST(DocumentAttentionTest, SkipsTilesOfOtherDocumentsForwardAndBackward) {
  torch::manual_seed(6);
  const int64_t s = 128, h = 2, d = 8;
  auto opt = torch::TensorOptions().dtype(torch::kDouble);
  auto q = torch::randn({1, s, h, d}, opt), k = torch::randn({1, s, h, d}, opt),
       v = torch::randn({1, s, h, d}, opt);
  v.narrow(1, 0, 64).fill_(std::numeric_limits<double>::quiet_NaN());  // document 0
  AttentionOptions ao;
  ao.block_size = 32;  // documents [0, 64) and [64, 128) cover whole tiles
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true),
       v1 = v.clone().requires_grad_(true);
  torch::Tensor out = CausalAttention(q1, k1, v1, ao, DocIds({{64, 64}}));
  EXPECT_TRUE(out.narrow(1, 64, 64).isfinite().all().item<bool>());
  EXPECT_FALSE(out.narrow(1, 0, 64).isfinite().all().item<bool>());
  out.narrow(1, 64, 64).sum().backward();
  // Document 1's gradients never touch document 0's tiles (document 0's own rows are NaN:
  // 0 * NaN in dO V^T).
  EXPECT_TRUE(q1.grad().narrow(1, 64, 64).isfinite().all().item<bool>());
  EXPECT_TRUE(k1.grad().narrow(1, 64, 64).isfinite().all().item<bool>());
  EXPECT_TRUE(v1.grad().narrow(1, 64, 64).isfinite().all().item<bool>());
  // Without documents the NaN reaches every later query.
  EXPECT_FALSE(CausalAttention(q, k, v, ao).narrow(1, 64, 64).isfinite().all().item<bool>());
}

TEST(DocumentAttentionTest, RejectsDecreasingOrMisshapenDocIds) {
  auto q = torch::randn({1, 4, 2, 8});
  EXPECT_THROW(CausalAttention(q, q, q, AttentionOptions{}, torch::tensor({{0, 1, 0, 1}})),
               c10::Error);
  EXPECT_THROW(CausalAttention(q, q, q, AttentionOptions{}, torch::tensor({{0, 1, 1}})),
               c10::Error);
}

TEST(CausalAttentionTest, RejectsHeadsThatDoNotGroup) {
  auto q = torch::randn({1, 4, 6, 8}), k = torch::randn({1, 4, 4, 8});
  try {
    CausalAttention(q, k, k, AttentionOptions{});
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("query heads 6 must be a multiple of kv heads 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(CausalAttentionTest, Bfloat16IsComputedInFloat) {
  torch::manual_seed(7);
  auto q = torch::randn({1, 40, 2, 8}), k = torch::randn({1, 40, 1, 8}),
       v = torch::randn({1, 40, 1, 8});
  AttentionOptions ao;
  ao.block_size = 16;
  auto out =
      CausalAttention(q.to(torch::kBFloat16), k.to(torch::kBFloat16), v.to(torch::kBFloat16), ao);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_LT(MaxDiff(out.to(torch::kFloat), NaiveCausalAttention(q, k, v)), 5e-2);
}

int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  }
  return -1;
}

// Child: forward+backward at s=8192 must not grow peak RSS by anything like an [s, s] fp32 buffer
// (256 MiB); then the naive reference does, which shows the measurement can fail.
int MemoryChild(const testing::ChildEnv& env) {
  const int64_t s = 8192, ss_bytes = s * s * 4;
  torch::manual_seed(3);
  auto q = torch::randn({1, s, 1, 32}), k = torch::randn({1, s, 1, 32}),
       v = torch::randn({1, s, 1, 32});
  auto qr = q.clone().requires_grad_(true), kr = k.clone().requires_grad_(true),
       vr = v.clone().requires_grad_(true);
  const int64_t before = PeakRssBytes();
  {
    AttentionOptions ao;  // block 512
    CausalAttention(qr, kr, vr, ao).sum().backward();
  }
  const int64_t blockwise_growth = PeakRssBytes() - before;
  std::cerr << "blockwise s=8192: peak RSS growth " << blockwise_growth / 1048576.0 << " MiB\n";
  CHILD_CHECK(env, blockwise_growth < ss_bytes / 4,
              "blockwise attention grew peak RSS by " << blockwise_growth << " bytes");
  const int64_t before_naive = PeakRssBytes();
  { auto o = NaiveCausalAttention(q, k, v); }
  const int64_t naive_growth = PeakRssBytes() - before_naive;
  std::cerr << "naive s=8192: peak RSS growth " << naive_growth / 1048576.0 << " MiB\n";
  CHILD_CHECK(env, naive_growth >= ss_bytes, "naive grew only " << naive_growth << " bytes");
  return 0;
}

TEST(CausalAttentionTest, Seq8192NeverAllocatesAnSxSBuffer) {
  auto results = testing::RunChildren("memory", 1, std::chrono::seconds(240));
  EXPECT_EQ(results[0].exit_code, 0);
}

int Dispatch(const testing::ChildEnv& env) {
  if (env.scenario == "memory") return MemoryChild(env);
  return 3;
}

}  // namespace
}  // namespace ulysses::engine

ULYSSES_RANK_CHILD_MAIN(ulysses::engine::Dispatch);
