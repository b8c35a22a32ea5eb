// Kept attention (selective checkpointing): a call recorded without grad and replayed with grad
// gives the output and gradients of the plain call, without running the forward kernel again;
// a replay that does not match its record is an error; the fused-op path CUDA takes runs on CPU
// with an op of this test's own (cuDNN's schema and output layout) against the naive reference,
// without its forward, freeing its output with the graph; the fused-op binding fills libtorch
// 2.x's SDPA op schemas by name and refuses an argument it does not know.
#include "worker/engine/attention/kept_attention.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "worker/engine/attention/attention.h"

namespace ulysses::engine {
namespace {

struct Result {
  torch::Tensor out, dq, dk, dv;
};

double MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// The plain call: out and d(sum(out * w))/d{q, k, v}.
Result Plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
             const torch::Tensor& w, const AttentionOptions& opts, const torch::Tensor& docs) {
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true),
       v1 = v.clone().requires_grad_(true);
  torch::Tensor out = CausalAttention(q1, k1, v1, opts, docs);
  (out * w).sum().backward();
  return {out.detach(), q1.grad(), k1.grad(), v1.grad()};
}

// Recorded without grad, then replayed with grad; `forwards` = forward kernel runs of the replay.
Result RecordThenReplay(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& w, const AttentionOptions& opts,
                        const torch::Tensor& docs, int64_t* record_forwards,
                        int64_t* replay_forwards) {
  KeptAttention kept;
  torch::Tensor recorded;
  int64_t before = CausalAttentionForwardRuns();
  {
    torch::NoGradGuard no_grad;
    KeepAttentionScope scope(&kept, KeepMode::kRecord);
    recorded = CausalAttention(q, k, v, opts, docs);
  }
  *record_forwards = CausalAttentionForwardRuns() - before;
  EXPECT_EQ(kept.size(), 1);
  EXPECT_GT(kept.bytes(), 0);
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true),
       v1 = v.clone().requires_grad_(true);
  torch::Tensor out;
  before = CausalAttentionForwardRuns();
  {
    KeepAttentionScope scope(&kept, KeepMode::kReplay);
    out = CausalAttention(q1, k1, v1, opts, docs);
  }
  EXPECT_TRUE(kept.empty());
  (out * w).sum().backward();
  *replay_forwards = CausalAttentionForwardRuns() - before;
  EXPECT_TRUE(torch::equal(recorded, out.detach()));
  return {out.detach(), q1.grad(), k1.grad(), v1.grad()};
}

// (dtype, documents)
class KeptAttentionReplay : public ::testing::TestWithParam<std::tuple<torch::ScalarType, bool>> {};

TEST_P(KeptAttentionReplay, GivesThePlainCallsOutputAndGradientsWithoutItsForward) {
  auto [dtype, documents] = GetParam();
  torch::manual_seed(7);
  const int64_t b = 2, s = 37, hq = 4, hkv = 2, d = 8;  // GQA, uneven blocks
  auto opt = torch::TensorOptions().dtype(dtype);
  auto q = torch::randn({b, s, hq, d}, opt), k = torch::randn({b, s, hkv, d}, opt),
       v = torch::randn({b, s, hkv, d}, opt), w = torch::randn({b, s, hq, d}, opt);
  torch::Tensor docs;
  if (documents) {
    docs = torch::cat({torch::zeros({b, 11}, torch::kLong), torch::ones({b, 20}, torch::kLong),
                       torch::full({b, 6}, 2, torch::kLong)},
                      1);  // [b, s]: three documents
  }
  AttentionOptions opts;
  opts.block_size = 8;
  Result plain = Plain(q, k, v, w, opts, docs);
  int64_t record_forwards = -1, replay_forwards = -1;
  Result kept = RecordThenReplay(q, k, v, w, opts, docs, &record_forwards, &replay_forwards);
  EXPECT_EQ(record_forwards, 1);
  EXPECT_EQ(replay_forwards, 0);  // the point: no second forward
  // The same kernels on the same inputs: equal to the bit.
  EXPECT_TRUE(torch::equal(plain.out, kept.out));
  EXPECT_TRUE(torch::equal(plain.dq, kept.dq));
  EXPECT_TRUE(torch::equal(plain.dk, kept.dk));
  EXPECT_TRUE(torch::equal(plain.dv, kept.dv));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KeptAttentionReplay,
                         ::testing::Combine(::testing::Values(torch::kDouble, torch::kBFloat16),
                                            ::testing::Bool()));

TEST(KeptAttentionTest, AReplayThatDoesNotMatchItsRecordIsAnError) {
  AttentionOptions opts;
  opts.block_size = 4;
  auto q = torch::randn({1, 9, 2, 4}, torch::kDouble),
       k = torch::randn({1, 9, 2, 4}, torch::kDouble);
  KeptAttention kept;
  {
    torch::NoGradGuard no_grad;
    KeepAttentionScope scope(&kept, KeepMode::kRecord);
    CausalAttention(q, k, k, opts);
  }
  // Another shape than the one recorded.
  auto q2 = torch::randn({1, 8, 2, 4}, torch::kDouble).requires_grad_(true);
  auto k2 = torch::randn({1, 8, 2, 4}, torch::kDouble);
  KeepAttentionScope scope(&kept, KeepMode::kReplay);
  try {
    CausalAttention(q2, k2, k2, opts);
    ADD_FAILURE() << "a mismatched replay was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not match this call's q"), std::string::npos)
        << e.what();
  }
  // More calls than were recorded.
  try {
    CausalAttention(q2, k2, k2, opts);
    ADD_FAILURE() << "a replay past the record was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more attention calls"), std::string::npos) << e.what();
  }
}

// A replayed output lives as long as its graph and no longer: nothing the replay keeps refers
// back to it (a cycle would keep every layer's kept output alive for the whole run).
TEST(KeptAttentionTest, AReplayedOutputIsFreedWithItsGraph) {
  AttentionOptions opts;
  opts.block_size = 4;
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> weak;
  {
    auto q = torch::randn({1, 9, 2, 4}, torch::kDouble);
    KeptAttention kept;
    {
      torch::NoGradGuard no_grad;
      KeepAttentionScope scope(&kept, KeepMode::kRecord);
      CausalAttention(q, q, q, opts);
    }
    auto q1 = q.clone().requires_grad_(true);
    torch::Tensor out;
    {
      KeepAttentionScope scope(&kept, KeepMode::kReplay);
      out = CausalAttention(q1, q1, q1, opts);
    }
    weak.emplace(out.getIntrusivePtr());
    EXPECT_FALSE(weak->expired());
    out.sum().backward();
  }
  EXPECT_TRUE(weak->expired()) << "the replayed output outlived its graph";
}

TEST(KeptAttentionTest, ScopesNestAndRestoreTheOuterOne) {
  KeptAttention a, b;
  EXPECT_EQ(KeepAttentionScope::Current(), nullptr);
  {
    KeepAttentionScope outer(&a, KeepMode::kRecord);
    {
      KeepAttentionScope inner(&b, KeepMode::kReplay);
      EXPECT_EQ(KeepAttentionScope::Current()->kept(), &b);
      EXPECT_EQ(KeepAttentionScope::Current()->mode(), KeepMode::kReplay);
    }
    EXPECT_EQ(KeepAttentionScope::Current()->kept(), &a);
  }
  EXPECT_EQ(KeepAttentionScope::Current(), nullptr);
}

// A fused attention op of this test's own, with the schema of libtorch 2.x's cuDNN op (ints for
// its SymInts), on CPU: the path CausalAttention takes on CUDA (RecordFusedAttention,
// ReplayFusedAttention: dispatcher calls bound by name, kv repeated, the output's layout) runs
// here against the naive reference. Like cuDNN's, its output is [b, h, s, d] with the strides of
// [b, s, h, d], and its backward wants the output gradient in that same layout.
std::atomic<int64_t> fake_forwards{0};

using FakeReturns = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t,
                               at::Tensor, at::Tensor, at::Tensor>;

// q, k, v [b, h, s, d] -> scores [b, h, s, s], causal.
at::Tensor FakeScores(const at::Tensor& q, const at::Tensor& k, double scale) {
  const int64_t s = q.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  return scores.masked_fill(torch::ones({s, s}, torch::kBool).triu(1),
                            -std::numeric_limits<double>::infinity());
}

FakeReturns FakeForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const c10::optional<at::Tensor>& attn_bias, bool compute_log_sumexp,
                        double dropout_p, bool is_causal, bool /*return_debug_mask*/,
                        c10::optional<double> scale) {
  TORCH_CHECK(!attn_bias.has_value() && compute_log_sumexp && dropout_p == 0 && is_causal,
              "fake_attention: called with other constants than a kept causal call uses");
  ++fake_forwards;
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  at::Tensor scores = FakeScores(q, k, sc);
  at::Tensor lse = scores.logsumexp(-1);  // [b, h, s]
  at::Tensor o = at::matmul((scores - lse.unsqueeze(-1)).exp(), v);
  // [b, s, h, d] storage seen as [b, h, s, d]
  at::Tensor out =
      at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, o.options()).permute({0, 2, 1, 3});
  out.copy_(o);
  at::Tensor none = at::empty({0}, q.options());
  return {out,
          lse,
          none,
          none,
          q.size(2),
          k.size(2),
          at::zeros({1}, torch::kLong),
          at::ones({1}, torch::kLong),
          none};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> FakeBackward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& seed, const at::Tensor& offset,
    const at::Tensor& attn_bias, const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/,
    int64_t max_q, int64_t max_k, double dropout_p, bool is_causal, c10::optional<double> scale) {
  TORCH_CHECK(grad.strides() == out.strides(), "fake_attention_backward: grad_out strides ",
              grad.strides(), " differ from out's ", out.strides());
  TORCH_CHECK(seed.item<int64_t>() == 0 && offset.item<int64_t>() == 1 && !attn_bias.defined() &&
                  max_q == q.size(2) && max_k == k.size(2) && dropout_p == 0 && is_causal,
              "fake_attention_backward: not given what its forward returned");
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  at::Tensor p = (FakeScores(q, k, sc) - lse.unsqueeze(-1)).exp();  // [b, h, s, s]
  at::Tensor dv = at::matmul(p.transpose(-2, -1), grad);
  at::Tensor dp = at::matmul(grad, v.transpose(-2, -1));
  at::Tensor ds = p * (dp - (grad * out).sum(-1, true)) * sc;
  return {at::matmul(ds, k), at::matmul(ds.transpose(-2, -1), q), dv};
}

TORCH_LIBRARY(ulysses_test, m) {
  m.def(
      "fake_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, bool "
      "compute_log_sumexp, float dropout_p=0., bool is_causal=False, bool "
      "return_debug_mask=False, *, float? scale=None) -> (Tensor output, Tensor logsumexp, Tensor "
      "cum_seq_q, Tensor cum_seq_k, int max_q, int max_k, Tensor philox_seed, Tensor "
      "philox_offset, Tensor debug_attn_mask)");
  m.def(
      "fake_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor "
      "out, Tensor logsumexp, Tensor philox_seed, Tensor philox_offset, Tensor attn_bias, Tensor "
      "cum_seq_q, Tensor cum_seq_k, int max_q, int max_k, float dropout_p, bool is_causal, *, "
      "float? scale=None) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ulysses_test, CPU, m) {
  m.impl("fake_attention", &FakeForward);
  m.impl("fake_attention_backward", &FakeBackward);
}

TEST(KeptAttentionTest, AFusedOpIsReplayedThroughItsBackwardWithoutItsForward) {
  auto op = FindFusedAttentionOp("ulysses_test::fake_attention");
  ASSERT_TRUE(op.ok()) << op.status();
  torch::manual_seed(11);
  auto opt = torch::TensorOptions().dtype(torch::kDouble);
  const int64_t b = 2, s = 19, hq = 4, hkv = 2, d = 8;  // GQA: the op sees kv repeated
  auto q = torch::randn({b, s, hq, d}, opt), k = torch::randn({b, s, hkv, d}, opt),
       v = torch::randn({b, s, hkv, d}, opt), w = torch::randn({b, s, hq, d}, opt);
  Result want = Plain(q, k, v, w, AttentionOptions{}, {});
  KeptAttention kept;
  torch::Tensor recorded;
  {
    torch::NoGradGuard no_grad;
    recorded = RecordFusedAttention(*op, q, k, v, &kept);
  }
  ASSERT_EQ(kept.size(), 1);
  const int64_t forwards = fake_forwards.load();
  EXPECT_EQ(forwards, 1);
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true),
       v1 = v.clone().requires_grad_(true);
  // The kept output becomes the replay node's own output; once the graph is gone it must be too.
  c10::intrusive_ptr<KeptAttentionEntry> entry = kept.Pop();
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> weak(
      entry->out.getIntrusivePtr());
  {
    torch::Tensor out = ReplayFusedAttention(q1, k1, v1, entry);
    entry.reset();
    EXPECT_TRUE(torch::equal(out.detach(), recorded));
    (out * w).sum().backward();
  }
  EXPECT_EQ(fake_forwards.load(), forwards) << "the replay ran the op's forward";
  EXPECT_TRUE(weak.expired()) << "the kept output outlived its graph";
  EXPECT_LT(MaxDiff(recorded, want.out), 1e-12);
  EXPECT_LT(MaxDiff(q1.grad(), want.dq), 1e-10);
  EXPECT_LT(MaxDiff(k1.grad(), want.dk), 1e-10);  // summed over the repeated heads
  EXPECT_LT(MaxDiff(v1.grad(), want.dv), 1e-10);
}

// Schemas of libtorch 2.x's fused SDPA ops, as its native_functions.yaml declares them (2.11's
// cuDNN op, flash in its older and newer return names, efficient).
constexpr char kCudnnForward[] =
    "aten::_scaled_dot_product_cudnn_attention(Tensor query, Tensor key, Tensor value, Tensor? "
    "attn_bias, bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, bool "
    "return_debug_mask=False, *, float? scale=None) -> (Tensor output, Tensor logsumexp, Tensor "
    "cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, Tensor philox_seed, Tensor "
    "philox_offset, Tensor debug_attn_mask)";
constexpr char kCudnnBackward[] =
    "aten::_scaled_dot_product_cudnn_attention_backward(Tensor grad_out, Tensor query, Tensor "
    "key, Tensor value, Tensor out, Tensor logsumexp, Tensor philox_seed, Tensor philox_offset, "
    "Tensor attn_bias, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, float "
    "dropout_p, bool is_causal, *, float? scale=None) -> (Tensor, Tensor, Tensor)";
constexpr char kFlashForwardNew[] =
    "aten::_scaled_dot_product_flash_attention(Tensor query, Tensor key, Tensor value, float "
    "dropout_p=0.0, bool is_causal=False, bool return_debug_mask=False, *, float? scale=None) -> "
    "(Tensor output, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt "
    "max_k, Tensor rng_state, Tensor unused, Tensor debug_attn_mask)";
constexpr char kFlashBackward[] =
    "aten::_scaled_dot_product_flash_attention_backward(Tensor grad_out, Tensor query, Tensor "
    "key, Tensor value, Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt "
    "max_q, SymInt max_k, float dropout_p, bool is_causal, Tensor philox_seed, Tensor "
    "philox_offset, *, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor "
    "grad_value)";
constexpr char kEfficientForward[] =
    "aten::_scaled_dot_product_efficient_attention(Tensor query, Tensor key, Tensor value, "
    "Tensor? attn_bias, bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, *, "
    "float? scale=None) -> (Tensor output, Tensor log_sumexp, Tensor philox_seed, Tensor "
    "philox_offset)";
constexpr char kEfficientBackward[] =
    "aten::_scaled_dot_product_efficient_attention_backward(Tensor grad_out_, Tensor query, "
    "Tensor key, Tensor value, Tensor attn_bias, Tensor out, Tensor logsumexp, Tensor "
    "philox_seed, Tensor philox_offset, float dropout_p, bool[4] grad_input_mask, bool "
    "is_causal=False, *, float? scale=None) -> (Tensor, Tensor, Tensor, Tensor)";

// A stand-in for the forward op's returns: tensor i holds the value i (ints for SymInts).
std::vector<c10::IValue> NumberedReturns(const c10::FunctionSchema& forward) {
  std::vector<c10::IValue> out;
  for (size_t i = 0; i < forward.returns().size(); ++i) {
    if (forward.returns()[i].type()->kind() == c10::TypeKind::TensorType) {
      out.emplace_back(torch::full({1}, static_cast<double>(i)));
    } else {
      out.emplace_back(static_cast<int64_t>(i));
    }
  }
  return out;
}

// Which forward return (by its number) or input fills backward argument `name`.
std::string Filled(const c10::FunctionSchema& backward, const std::vector<c10::IValue>& stack,
                   const std::string& name, const torch::Tensor& q, const torch::Tensor& grad) {
  for (size_t i = 0; i < backward.arguments().size(); ++i) {
    if (backward.arguments()[i].name() != name) continue;
    const c10::IValue& v = stack.at(i);
    if (v.isTensor() && v.toTensor().defined()) {
      if (v.toTensor().is_same(q)) return "q";
      if (v.toTensor().is_same(grad)) return "grad";
      return "return " + std::to_string(static_cast<int>(v.toTensor().item<double>()));
    }
    if (v.isInt()) return "return " + std::to_string(v.toInt());
    if (v.isTensor()) return "undefined";
    return v.tagKind() + ":" + (v.isBool() ? std::to_string(v.toBool()) : "");
  }
  return "missing";
}

TEST(FusedAttentionBindingTest, FillsTheSdpaOpsArgumentsByName) {
  struct Case {
    const char* forward;
    const char* backward;
  };
  for (const Case& c : {Case{kCudnnForward, kCudnnBackward}, Case{kFlashForwardNew, kFlashBackward},
                        Case{kEfficientForward, kEfficientBackward}}) {
    SCOPED_TRACE(c.forward);
    c10::FunctionSchema fwd = torch::jit::parseSchema(c.forward);
    c10::FunctionSchema bwd = torch::jit::parseSchema(c.backward);
    auto binding = FusedAttentionBinding::Bind(fwd, bwd);
    ASSERT_TRUE(binding.ok()) << binding.status();
    EXPECT_EQ(binding->output_index(), 0);
    EXPECT_EQ(binding->lse_index(), 1);
    auto q = torch::zeros({1}), k = torch::zeros({1}), v = torch::zeros({1}),
         grad = torch::zeros({1});
    std::vector<c10::IValue> f = binding->ForwardStack(q, k, v);
    ASSERT_EQ(f.size(), fwd.arguments().size());
    for (size_t i = 0; i < f.size(); ++i) {
      const std::string& name = fwd.arguments()[i].name();
      if (name == "query") EXPECT_TRUE(f[i].toTensor().is_same(q));
      if (name == "value") EXPECT_TRUE(f[i].toTensor().is_same(v));
      if (name == "is_causal" || name == "compute_log_sumexp") EXPECT_TRUE(f[i].toBool()) << name;
      if (name == "return_debug_mask") EXPECT_FALSE(f[i].toBool());
      if (name == "dropout_p") EXPECT_EQ(f[i].toDouble(), 0.0);
      if (name == "attn_bias" || name == "scale") EXPECT_TRUE(f[i].isNone()) << name;
    }
    std::vector<c10::IValue> returns = NumberedReturns(fwd);
    std::vector<c10::IValue> b = binding->BackwardStack(grad, q, k, v, returns);
    ASSERT_EQ(b.size(), bwd.arguments().size());
    const std::string grad_name = bwd.arguments()[0].name();  // grad_out, or grad_out_ (efficient)
    EXPECT_EQ(Filled(bwd, b, grad_name, q, grad), "grad");
    EXPECT_EQ(Filled(bwd, b, "query", q, grad), "q");
    EXPECT_EQ(Filled(bwd, b, "out", q, grad), "return 0");
    EXPECT_EQ(Filled(bwd, b, "logsumexp", q, grad), "return 1");
    EXPECT_EQ(Filled(bwd, b, "is_causal", q, grad), "Bool:1");
    const int64_t seed = std::string(c.forward).find("cum_seq_q") == std::string::npos ? 2 : 6;
    EXPECT_EQ(Filled(bwd, b, "philox_seed", q, grad), "return " + std::to_string(seed));
    EXPECT_EQ(Filled(bwd, b, "philox_offset", q, grad), "return " + std::to_string(seed + 1));
    if (seed == 6) {
      EXPECT_EQ(Filled(bwd, b, "cum_seq_k", q, grad), "return 3");
      EXPECT_EQ(Filled(bwd, b, "max_q", q, grad), "return 4");
    }
  }
}

TEST(FusedAttentionBindingTest, RefusesAnArgumentItDoesNotKnowAndNamesIt) {
  c10::FunctionSchema fwd = torch::jit::parseSchema(kCudnnForward);
  c10::FunctionSchema bwd = torch::jit::parseSchema(
      "aten::_scaled_dot_product_cudnn_attention_backward(Tensor grad_out, Tensor query, Tensor "
      "key, Tensor value, Tensor out, Tensor logsumexp, Tensor window_sizes) -> (Tensor, Tensor, "
      "Tensor)");
  auto binding = FusedAttentionBinding::Bind(fwd, bwd);
  ASSERT_FALSE(binding.ok());
  EXPECT_NE(std::string(binding.status().message()).find("'window_sizes'"), std::string::npos)
      << binding.status();
  // A forward whose returns do not say which is the output is refused too.
  c10::FunctionSchema unnamed = torch::jit::parseSchema(
      "aten::_scaled_dot_product_cudnn_attention(Tensor query, Tensor key, Tensor value) -> "
      "(Tensor, Tensor)");
  EXPECT_FALSE(FusedAttentionBinding::Bind(unnamed, bwd).ok());
  // An op this libtorch does not register is reported, not called.
  auto missing = FindFusedAttentionOp("aten::_no_such_attention");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("not registered"), std::string::npos);
}

}  // namespace
}  // namespace ulysses::engine
