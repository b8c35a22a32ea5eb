// Ulysses exactness at the model level, fp64, real processes over Gloo: the global
// loss and EVERY parameter's gradient (local loss-sum gradients summed over the
// world, divided by the global token count -- the training loop's math) at sp 1
// equal those at sp 2 and sp 4. The model is GQA with 2 kv heads, so sp 4
// replicates kv heads. A variant runs with tiled loss + activation checkpointing +
// tiled MLP at sp 4 (recompute with collectives inside the reentrant backward), another with
// kept attention outputs (selective checkpointing) at sp 2 and 4, which must also run the
// attention forward once per layer instead of twice.
// The token count check fails if shard-boundary labels are dropped.
//
// Ranks are this binary re-executed (tests/testing/rank_processes.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/testing/rank_processes.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"
#include "worker/engine/attention/kept_attention.h"
#include "worker/engine/data/sharding.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/ulysses_attention.h"

namespace ulysses::engine::train {
namespace {

constexpr int64_t kSeq = 32;

model::LlamaConfig Config() { return ::ulysses::testing::TinyLlama(); }

int Getenv(const char* name, int def) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : def;
}

// Child: one rank. Writes [loss, count, grads...] (rank 0) to ULYSSES_SPX_OUT.
int ChildMain(const ::ulysses::testing::ChildEnv& env) {
  const int rank = env.rank, world = env.world;
  const int memopts = Getenv("ULYSSES_SPX_MEMOPTS", 0);  // 0 none, 1 recompute, 2 kept attention
  CommConfig comm;
  comm.rank = rank;
  comm.world_size = world;
  comm.sp_size = world;
  comm.master_port = env.port;
  auto groups = CreateProcessGroups(comm);
  if (!groups.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(groups.status().message()).c_str());
    return 1;
  }
  model::MemoryOptions mem;
  if (memopts != 0) {
    mem.tiled_loss = true;
    mem.loss_tile_tokens = 3;
    mem.activation_checkpointing = true;
    mem.tiled_mlp = true;
    mem.mlp_tile_tokens = 5;
    mem.keep_attention_outputs = memopts == 2;
  }
  model::LlamaForCausalLM m(Config(), mem);
  m->InitWeights(99);
  m->to(torch::kDouble);
  torch::manual_seed(5);
  Sample sample;
  sample.tokens = torch::randint(0, 64, {kSeq + 1}, torch::kLong);
  auto shard = ShardSamples({sample}, groups->sp_rank, world);
  if (!shard.ok()) return 1;
  Communicator* sp = groups->sp.get();
  AttentionOptions opts;
  opts.block_size = 4;
  model::AttentionFn attn = [sp, opts](const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, const torch::Tensor& doc_ids) {
    return UlyssesAttention(q, k, v, sp, opts, doc_ids);
  };
  const int64_t forwards_before = CausalAttentionForwardRuns();
  model::LossOutput out = m->Loss(shard->input_ids, shard->position_ids, shard->labels, attn);
  out.loss_sum.backward();
  // Attention forward kernel runs of this rank's step.
  const double forwards = static_cast<double>(CausalAttentionForwardRuns() - forwards_before);
  std::vector<torch::Tensor> reduce;
  for (auto& p : m->named_parameters()) reduce.push_back(p.value().grad());
  reduce.push_back(torch::tensor(
      {out.loss_sum.item<double>(), static_cast<double>(out.tokens), forwards}, torch::kDouble));
  if (!groups->world->AllReduceSum(reduce).ok()) return 1;
  if (rank == 0) {
    const double count = reduce.back()[1].item<double>();
    std::vector<torch::Tensor> result = {reduce.back()};
    for (size_t i = 0; i + 1 < reduce.size(); ++i) result.push_back(reduce[i] / count);
    torch::save(result, std::getenv("ULYSSES_SPX_OUT"));
  }
  return 0;
}

ULYSSES_RANK_CHILD_MAIN(ChildMain);

// Runs `world` ranks; returns [[loss_sum, count, attention forwards summed over ranks],
// grads/count] from rank 0. memopts: 0 none, 1 recompute (checkpointing, tiled MLP and loss), 2 the
// same with kept attention outputs.
std::vector<torch::Tensor> RunRanks(int world, int memopts) {
  ::ulysses::testing::TempDir dir("ulysses-spx");
  const std::string out = dir.Sub("result.pt");
  const auto results = ::ulysses::testing::RunChildren(
      "rank", world, std::chrono::seconds(90),
      {"ULYSSES_SPX_OUT=" + out, "ULYSSES_SPX_MEMOPTS=" + std::to_string(memopts)});
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " of " << world;
    ok = ok && results[r].exit_code == 0;
  }
  std::vector<torch::Tensor> result;
  if (ok) torch::load(result, out);
  return result;
}

void ExpectEqualResults(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_FALSE(a.empty() || b.empty()) << "a run failed (see the rank exit codes above)";
  ASSERT_EQ(a.size(), b.size());
  // Every label kept, including the one at each shard boundary.
  EXPECT_EQ(a[0][1].item<double>(), kSeq);
  EXPECT_EQ(b[0][1].item<double>(), kSeq);
  const double la = a[0][0].item<double>(), lb = b[0][0].item<double>();
  EXPECT_NEAR(la, lb, 1e-11 * std::abs(la));
  auto names = model::LlamaForCausalLM(Config(), model::MemoryOptions{})->named_parameters().keys();
  ASSERT_EQ(names.size() + 1, a.size());
  for (size_t i = 1; i < a.size(); ++i) {
    SCOPED_TRACE(names[i - 1]);
    const double scale = 1 + a[i].abs().max().item<double>();
    EXPECT_GT(a[i].abs().max().item<double>(), 0);  // every parameter gets a gradient
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-10 * scale);
  }
}

TEST(SpExactnessTest, LossAndEveryGradientMatchAcrossSpDegrees) {
  auto sp1 = RunRanks(1, 0);
  auto sp2 = RunRanks(2, 0);
  auto sp4 = RunRanks(4, 0);
  ExpectEqualResults(sp1, sp2);
  ExpectEqualResults(sp1, sp4);
}

// Attention forward runs of a step, summed over the ranks.
double AttentionForwards(const std::vector<torch::Tensor>& r) {
  return r.empty() ? -1 : r[0][2].item<double>();
}

TEST(SpExactnessTest, MemoryOptionsAtSp4MatchPlainSp1) {
  auto sp1 = RunRanks(1, 0);
  auto sp4 = RunRanks(4, 1);
  ExpectEqualResults(sp1, sp4);
  const double layers = static_cast<double>(Config().num_hidden_layers);
  EXPECT_EQ(AttentionForwards(sp1), layers);
  EXPECT_EQ(AttentionForwards(sp4), 4 * 2 * layers);  // checkpointing: every layer twice
}

TEST(SpExactnessTest, KeptAttentionOutputsMatchPlainSp1WithOneForwardPerLayer) {
  auto sp1 = RunRanks(1, 0);
  auto sp2 = RunRanks(2, 2);
  auto sp4 = RunRanks(4, 2);
  ExpectEqualResults(sp1, sp2);
  ExpectEqualResults(sp1, sp4);
  const double layers = static_cast<double>(Config().num_hidden_layers);
  EXPECT_EQ(AttentionForwards(sp2), 2 * layers);  // the recompute replays the kept outputs
  EXPECT_EQ(AttentionForwards(sp4), 4 * layers);
}

}  // namespace
}  // namespace ulysses::engine::train
