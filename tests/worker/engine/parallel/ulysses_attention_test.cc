// UlyssesAttention over real Gloo process groups (sp 2 and 4) equals CausalAttention on the full
// sequence, forward and input gradients, in fp64 to 1e-10; GQA shard, replicate and error paths.
#include "worker/engine/parallel/ulysses_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "tests/testing/rank_processes.h"

namespace ulysses::engine {
namespace {

using testing::ChildEnv;

struct Full {
  torch::Tensor q, k, v, w;  // [b, s, h, d]; w weights the loss sum(out * w)
};

Full MakeInputs(int64_t s, int64_t hq, int64_t hkv) {
  torch::manual_seed(42);  // identical on every rank
  auto opt = torch::TensorOptions().dtype(torch::kDouble);
  const int64_t b = 2, d = 8;
  return {torch::randn({b, s, hq, d}, opt), torch::randn({b, s, hkv, d}, opt),
          torch::randn({b, s, hkv, d}, opt), torch::randn({b, s, hq, d}, opt)};
}

// Returns the max abs difference between Ulysses on this rank's shard and the full reference,
// over the output and the q, k, v gradients of the shard.
double CompareShard(const Full& f, Communicator* sp) {
  const int64_t p = sp->size(), r = sp->rank(), s = f.q.size(1), sl = s / p;
  // Reference on the full sequence.
  auto q = f.q.clone().requires_grad_(true), k = f.k.clone().requires_grad_(true),
       v = f.v.clone().requires_grad_(true);
  torch::Tensor ref = CausalAttention(q, k, v, AttentionOptions{});
  (ref * f.w).sum().backward();
  // This rank's shard: tokens [r*s/p, (r+1)*s/p).
  auto shard = [&](const torch::Tensor& t) { return t.narrow(1, r * sl, sl); };
  auto ql = shard(f.q).clone().requires_grad_(true), kl = shard(f.k).clone().requires_grad_(true),
       vl = shard(f.v).clone().requires_grad_(true);
  AttentionOptions small;
  small.block_size = 16;
  torch::Tensor out = UlyssesAttention(ql, kl, vl, sp, small);  // [b, s/p, hq, d]
  // The global loss is the sum over ranks of the local sums, so local grads are the slices.
  (out * shard(f.w)).sum().backward();
  double diff = (out - shard(ref)).abs().max().item<double>();
  diff = std::max(diff, (ql.grad() - shard(q.grad())).abs().max().item<double>());
  diff = std::max(diff, (kl.grad() - shard(k.grad())).abs().max().item<double>());
  diff = std::max(diff, (vl.grad() - shard(v.grad())).abs().max().item<double>());
  return diff;
}

int UlyssesChild(const ChildEnv& env) {
  const int64_t hq = std::atoi(std::getenv("ULYSSES_TEST_HQ"));
  const int64_t hkv = std::atoi(std::getenv("ULYSSES_TEST_HKV"));
  CommConfig config;
  config.rank = env.rank;
  config.world_size = env.world;
  config.sp_size = env.world;
  config.master_port = env.port;
  config.timeout = std::chrono::seconds(60);
  auto groups = CreateProcessGroups(config);
  CHILD_CHECK(env, groups.ok(), groups.status().ToString());
  Communicator* sp = groups->sp.get();
  if (!CheckUlyssesHeads(hq, hkv, env.world).ok()) {
    // Error path: rejected before any exchange, with both numbers in the message.
    try {
      Full f = MakeInputs(4 * env.world, hq, hkv);
      UlyssesAttention(f.q.narrow(1, 0, 4), f.k.narrow(1, 0, 4), f.v.narrow(1, 0, 4), sp,
                       AttentionOptions{});
      ChildFail(env, "UlyssesAttention accepted incompatible heads");
    } catch (const c10::Error& e) {
      std::string msg = e.what();
      CHILD_CHECK(env,
                  msg.find("sp_degree: " + std::to_string(env.world) +
                           " is incompatible with num_key_value_heads " + std::to_string(hkv)) !=
                      std::string::npos,
                  msg);
    }
    CHILD_CHECK(env, sp->Barrier().ok(), "barrier");
    return 0;
  }
  Full f = MakeInputs(/*s=*/12 * env.world + 0, hq, hkv);  // s/p = 12: not a multiple of block 16
  const double diff = CompareShard(f, sp);
  std::cerr << "ulysses sp=" << env.world << " hq=" << hq << " hkv=" << hkv << " max diff=" << diff
            << "\n";
  CHILD_CHECK(env, diff < 1e-10, "max diff " << diff);
  // Bytes: one fused q/k/v exchange and one output exchange forward, the same twice backward.
  const int64_t p = env.world, hk = hkv % p == 0 ? hkv : p;
  const int64_t elems_fwd = 2 * 12 * 8 * (hq + 2 * hk + hq);  // b * s/p * d * heads moved
  const int64_t want = 2 * elems_fwd * 8 * (p - 1) / p;       // fwd + bwd, fp64, to other ranks
  CHILD_CHECK(env, sp->bytes_sent() == want, sp->bytes_sent() << " != " << want);
  CHILD_CHECK(env, sp->Barrier().ok(), "barrier");
  return 0;
}

int Dispatch(const ChildEnv& env) {
  if (env.scenario == "ulysses") return UlyssesChild(env);
  return 3;
}

void RunUlysses(int sp, int hq, int hkv) {
  auto results = testing::RunChildren(
      "ulysses", sp, std::chrono::seconds(120),
      {"ULYSSES_TEST_HQ=" + std::to_string(hq), "ULYSSES_TEST_HKV=" + std::to_string(hkv)});
  for (int r = 0; r < sp; ++r) EXPECT_EQ(results[r].exit_code, 0) << "rank " << r;
}

TEST(UlyssesAttentionTest, Sp1IsPlainCausalAttention) {
  auto groups = CreateProcessGroups(CommConfig{});
  ASSERT_TRUE(groups.ok()) << groups.status();
  Full f = MakeInputs(40, 8, 2);
  EXPECT_LT(CompareShard(f, groups->sp.get()), 1e-10);
}
TEST(UlyssesAttentionTest, Sp2ShardsKvHeads) { RunUlysses(2, 8, 4); }
TEST(UlyssesAttentionTest, Sp4ShardsKvHeads) { RunUlysses(4, 8, 4); }
TEST(UlyssesAttentionTest, Sp4ReplicatesKvHeads) { RunUlysses(4, 8, 2); }
TEST(UlyssesAttentionTest, Sp2RejectsThreeKvHeads) { RunUlysses(2, 6, 3); }

TEST(UlyssesAttentionTest, CheckUlyssesHeadsRule) {
  EXPECT_TRUE(CheckUlyssesHeads(32, 8, 8).ok());
  EXPECT_TRUE(CheckUlyssesHeads(32, 8, 32).ok());
  EXPECT_TRUE(CheckUlyssesHeads(8, 2, 4).ok());
  absl::Status st = CheckUlyssesHeads(6, 3, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sp_degree: 2 is incompatible with num_key_value_heads 3"),
            std::string::npos)
      << st;
  st = CheckUlyssesHeads(8, 8, 3);
  EXPECT_NE(st.message().find("sp_degree: 3 does not divide num_attention_heads 8"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace ulysses::engine

ULYSSES_RANK_CHILD_MAIN(ulysses::engine::Dispatch);
