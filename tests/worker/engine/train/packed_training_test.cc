// Training on packed documents is exact, fp64, on CPU, through the real data path (JSONL ->
// `data pack` format -> PackedDataset -> ShardSamples -> model with the document layout):
//   - a packed sequence of k documents gives the same loss sum, token count and every gradient as
//     the k documents run alone, at sp 1 and at sp 4 (real rank processes over Gloo: the document
//     layout reaches every rank after the all-to-all);
//   - a loss mask zeroing a prompt prefix equals the loss over the completion targets only
//     (labels built by hand), at sp 1 and sp 4 where whole SP shards hold no trainable token;
//   - one optimizer step with micro_batch 4 = grad_accum 4 x micro_batch 1 = dp 2 x micro_batch 2
//     (rank processes) = the four sequences summed by hand: same loss, tokens and gradients.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/rank_processes.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"
#include "worker/engine/data/batches.h"
#include "worker/engine/data/indexed.h"
#include "worker/engine/data/packing.h"
#include "worker/engine/data/sharding.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/parallelize.h"
#include "worker/engine/parallel/ulysses_attention.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/optimizer.h"
#include "worker/engine/train/train_step.h"

namespace ulysses::engine::train {
namespace {

constexpr int64_t kSeq = 32;
// Three documents of 7, 13 and 9 tokens: one packed sequence of 32 (3 padding).
const std::vector<int> kDocLengths = {7, 13, 9};
constexpr int kPrompt = 20;  // masked document: 20 prompt tokens (mask 0), 12 completion tokens

model::LlamaConfig Config() { return ::ulysses::testing::TinyLlama(); }

// Deterministic token ids of document d.
std::vector<int64_t> DocTokens(int d, int n) {
  std::vector<int64_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (17 * d + 5 * i + i * i) % 64;
  return t;
}

std::string Line(const std::vector<int64_t>& ids, int prompt) {
  std::string a, m;
  for (size_t i = 0; i < ids.size(); ++i) {
    a += (i ? "," : "") + std::to_string(ids[i]);
    m += (i ? "," : "") + std::string(static_cast<int>(i) < prompt ? "0" : "1");
  }
  return "{\"ids\": [" + a + "]" + (prompt > 0 ? ", \"mask\": [" + m + "]" : "") + "}\n";
}

// Writes and packs the dataset of `kind` ("docs": kDocLengths; "masked": one 32-token document
// with a kPrompt prompt; "many": 12 documents for batches) under dir; returns the prefix.
std::string MakeDataset(const std::string& dir, const std::string& kind) {
  std::ofstream f(dir + "/" + kind + ".jsonl");
  if (kind == "docs") {
    for (size_t d = 0; d < kDocLengths.size(); ++d) f << Line(DocTokens(d, kDocLengths[d]), 0);
  } else if (kind == "masked") {
    f << Line(DocTokens(7, kSeq), kPrompt);
  } else {
    for (int d = 0; d < 12; ++d) f << Line(DocTokens(d, 5 + (d * 7) % 20), d % 3 == 0 ? 4 : 0);
  }
  f.close();
  const std::string prefix = dir + "/" + kind;
  auto st = PackJsonl(dir + "/" + kind + ".jsonl", prefix, 64);
  EXPECT_TRUE(st.ok()) << st.status();
  return prefix;
}

// [loss_sum, tokens] followed by every parameter's gradient of the loss SUM.
using Result = std::vector<torch::Tensor>;

model::LlamaForCausalLM Model() {
  model::LlamaForCausalLM m(Config(), model::MemoryOptions{});
  m->InitWeights(99);
  m->to(torch::kDouble);
  return m;
}

// Forward + backward of one shard; accumulates into the model's .grad and returns the stats.
std::pair<double, int64_t> LossSum(model::LlamaForCausalLM& m, const LocalShard& shard,
                                   const model::AttentionFn& attn) {
  model::LossOutput out = m->Loss(shard.input_ids, shard.position_ids, shard.labels, attn,
                                  /*accuracy_mask=*/{}, shard.doc_ids);
  out.loss_sum.backward();
  return {out.loss_sum.item<double>(), out.tokens};
}

Result Collect(model::LlamaForCausalLM& m, double loss, int64_t tokens) {
  Result r = {torch::tensor({loss, static_cast<double>(tokens)}, torch::kDouble)};
  for (auto& p : m->named_parameters()) {
    r.push_back(p.value().grad().defined() ? p.value().grad().clone()
                                           : torch::zeros_like(p.value()));
  }
  return r;
}

model::AttentionFn LocalAttention() {
  AttentionOptions opts;
  opts.block_size = 4;  // several tiles per document: skipping and mixed tiles both run
  return [opts](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                const torch::Tensor& docs) { return CausalAttention(q, k, v, opts, docs); };
}

// Sample 0 of the packed validation view of `prefix` at kSeq.
Sample PackedSample(const std::string& prefix) {
  auto ds = OpenPackedDataset(prefix, Split::kValidation, 64, 1, /*packing=*/true);
  EXPECT_TRUE(ds.ok()) << ds.status();
  auto s = (*ds)->Get(0, kSeq);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Child: one SP rank of the packed sample of ULYSSES_PT_PREFIX; rank 0 saves the world sums.
int ChildMain(const ::ulysses::testing::ChildEnv& env) {
  if (env.scenario == "dp") {
    ParallelConfig pc;
    pc.dp = env.world;
    pc.rank = env.rank;
    pc.world_size = env.world;
    pc.master_port = env.port;
    auto rt = Parallelize(pc);
    CHILD_CHECK(env, rt.ok(), rt.status());
    auto model = BuildModel(Config(), {}, 99, torch::kCPU, torch::kDouble);
    CHILD_CHECK(env, model.ok(), model.status());
    AdamW adam{AdamWConfig{}};
    Trainer trainer(*model, UlyssesAttentionFn(rt->groups.sp.get(), AttentionOptions{4}),
                    rt->groups.world.get(), &adam, /*grad_clip=*/0, torch::Device(torch::kCPU));
    auto ds = OpenPackedDataset(std::getenv("ULYSSES_PT_PREFIX"), Split::kTrain, 64, 1, true);
    CHILD_CHECK(env, ds.ok(), ds.status());
    BatchLayout l{kSeq, 0, 1, rt->groups.dp_rank, env.world, 1, 4 / env.world};
    auto mbs = StepMicroBatches(**ds, l, /*cursor=*/4);
    CHILD_CHECK(env, mbs.ok(), mbs.status());
    auto stats = trainer.Step(*mbs, /*lr=*/0.0, 0);
    CHILD_CHECK(env, stats.ok(), stats.status());
    if (env.rank == 0) {
      Result r = {torch::tensor({stats->loss, stats->tokens}, torch::kDouble)};
      for (auto& [name, p] : trainer.params()) r.push_back(p.grad().clone());
      torch::save(r, std::getenv("ULYSSES_PT_OUT"));
    }
    return 0;
  }
  CommConfig comm;
  comm.rank = env.rank;
  comm.world_size = env.world;
  comm.sp_size = env.world;
  comm.master_port = env.port;
  auto groups = CreateProcessGroups(comm);
  CHILD_CHECK(env, groups.ok(), groups.status());
  auto m = Model();
  auto shard =
      ShardSamples({PackedSample(std::getenv("ULYSSES_PT_PREFIX"))}, groups->sp_rank, env.world);
  CHILD_CHECK(env, shard.ok(), shard.status());
  Communicator* sp = groups->sp.get();
  model::AttentionFn attn = [sp](const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const torch::Tensor& docs) {
    return UlyssesAttention(q, k, v, sp, AttentionOptions{4}, docs);
  };
  auto [loss, tokens] = LossSum(m, *shard, attn);
  Result r = Collect(m, loss, tokens);
  CHILD_CHECK(env, groups->world->AllReduceSum(r).ok(), "all-reduce");
  if (env.rank == 0) torch::save(r, std::getenv("ULYSSES_PT_OUT"));
  return 0;
}

ULYSSES_RANK_CHILD_MAIN(ChildMain);

Result RunRanks(const std::string& scenario, int world, const std::string& prefix) {
  ::ulysses::testing::TempDir dir("ulysses-packed");
  const std::string out = dir.Sub("result.pt");
  const auto results =
      ::ulysses::testing::RunChildren(scenario, world, std::chrono::seconds(90),
                                      {"ULYSSES_PT_OUT=" + out, "ULYSSES_PT_PREFIX=" + prefix});
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << scenario << " rank " << r << " of " << world;
    ok = ok && results[r].exit_code == 0;
  }
  Result result;
  if (ok) torch::load(result, out);
  return result;
}

// Same loss sum, token count and gradients (1e-10 relative).
void ExpectSame(const Result& a, const Result& b, int64_t tokens) {
  ASSERT_FALSE(a.empty() || b.empty()) << "a run failed (see above)";
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a[0][1].item<double>(), tokens);
  EXPECT_EQ(b[0][1].item<double>(), tokens);
  const double la = a[0][0].item<double>();
  EXPECT_NEAR(la, b[0][0].item<double>(), 1e-11 * std::abs(la));
  auto names = Model()->named_parameters().keys();
  ASSERT_EQ(names.size() + 1, a.size());
  for (size_t i = 1; i < a.size(); ++i) {
    SCOPED_TRACE(names[i - 1]);
    const double scale = 1 + a[i].abs().max().item<double>();
    EXPECT_GT(a[i].abs().max().item<double>(), 0);
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-10 * scale);
  }
}

TEST(PackedTrainingTest, PackedDocumentsEqualTheDocumentsRunAloneAtSp1AndSp4) {
  ::ulysses::testing::TempDir dir("ulysses-packed");
  const std::string prefix = MakeDataset(dir.path(), "docs");
  // Reference: each document alone, one sequence each, loss sums and gradients added.
  auto ref = Model();
  double loss = 0;
  int64_t tokens = 0;
  for (size_t d = 0; d < kDocLengths.size(); ++d) {
    Sample alone;
    alone.tokens = torch::tensor(DocTokens(d, kDocLengths[d]), torch::kLong);
    auto shard = ShardSamples({alone}, 0, 1);
    ASSERT_TRUE(shard.ok());
    auto [l, t] = LossSum(ref, *shard, LocalAttention());
    loss += l;
    tokens += t;
  }
  const Result alone = Collect(ref, loss, tokens);
  const int64_t want_tokens = 7 - 1 + 13 - 1 + 9 - 1;

  auto packed_model = Model();
  auto shard = ShardSamples({PackedSample(prefix)}, 0, 1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto [pl, pt] = LossSum(packed_model, *shard, LocalAttention());
  ExpectSame(alone, Collect(packed_model, pl, pt), want_tokens);
  ExpectSame(alone, RunRanks("sp", 4, prefix), want_tokens);

  // Without the document layout, attention crosses documents: the loss differs.
  auto crossing = Model();
  LocalShard no_docs = *shard;
  no_docs.doc_ids = torch::Tensor();
  auto [cl, ct] = LossSum(crossing, no_docs, LocalAttention());
  EXPECT_GT(std::abs(cl - pl), 1e-6);
}

TEST(PackedTrainingTest, MaskedPromptEqualsTheLossOnTheCompletionOnlyAtSp1AndSp4) {
  ::ulysses::testing::TempDir dir("ulysses-packed");
  const std::string prefix = MakeDataset(dir.path(), "masked");
  // Reference: the whole document as context, labels by hand on the completion targets only.
  const std::vector<int64_t> ids = DocTokens(7, kSeq);
  torch::Tensor input = torch::tensor(ids, torch::kLong).unsqueeze(0);  // [1, s]
  torch::Tensor labels = torch::full({1, kSeq}, model::kIgnoreIndex, torch::kLong);
  for (int j = kPrompt - 1; j + 1 < kSeq; ++j) labels[0][j] = ids[j + 1];
  auto ref = Model();
  model::LossOutput out =
      ref->Loss(input, torch::arange(kSeq, torch::kLong), labels, LocalAttention());
  out.loss_sum.backward();
  const Result completion = Collect(ref, out.loss_sum.item<double>(), out.tokens);
  const int64_t want_tokens = kSeq - kPrompt;

  auto m = Model();
  auto shard = ShardSamples({PackedSample(prefix)}, 0, 1);
  ASSERT_TRUE(shard.ok());
  auto [l, t] = LossSum(m, *shard, LocalAttention());
  ExpectSame(completion, Collect(m, l, t), want_tokens);
  // sp 4: shards [0, 8) and [8, 16) hold prompt targets only.
  ExpectSame(completion, RunRanks("sp", 4, prefix), want_tokens);
}

// One Trainer step (lr 0, no clipping) on one rank; returns [loss, tokens] + averaged grads.
Result TrainerStep(const TokenDataset& data, int64_t grad_accum, int64_t micro_batch) {
  ParallelConfig pc;
  auto rt = Parallelize(pc);
  EXPECT_TRUE(rt.ok()) << rt.status();
  auto model = BuildModel(Config(), {}, 99, torch::kCPU, torch::kDouble);
  EXPECT_TRUE(model.ok()) << model.status();
  AdamW adam{AdamWConfig{}};
  Trainer trainer(*model, UlyssesAttentionFn(rt->groups.sp.get(), AttentionOptions{4}),
                  rt->groups.world.get(), &adam, /*grad_clip=*/0, torch::Device(torch::kCPU));
  BatchLayout l{kSeq, 0, 1, 0, 1, grad_accum, micro_batch};
  auto mbs = StepMicroBatches(data, l, /*cursor=*/4);
  EXPECT_TRUE(mbs.ok()) << mbs.status();
  EXPECT_EQ(mbs->size(), static_cast<size_t>(grad_accum));
  auto stats = trainer.Step(*mbs, /*lr=*/0.0, 0);
  EXPECT_TRUE(stats.ok()) << stats.status();
  Result r = {torch::tensor({stats->loss, stats->tokens}, torch::kDouble)};
  for (auto& [name, p] : trainer.params()) r.push_back(p.grad().clone());
  return r;
}

TEST(PackedTrainingTest, MicroBatch4EqualsGradAccum4EqualsDp2EqualsOneBatchByHand) {
  ::ulysses::testing::TempDir dir("ulysses-packed");
  const std::string prefix = MakeDataset(dir.path(), "many");
  auto data = OpenPackedDataset(prefix, Split::kTrain, 64, 1, true);
  ASSERT_TRUE(data.ok()) << data.status();
  // By hand: the four sequences the step at cursor 4 reads, loss sums and gradients added, then
  // divided by the token count (the Trainer's math).
  auto ref = BuildModel(Config(), {}, 99, torch::kCPU, torch::kDouble);
  ASSERT_TRUE(ref.ok());
  double loss = 0;
  int64_t tokens = 0;
  for (int64_t i = 4; i < 8; ++i) {
    auto sample = (*data)->Get(i, kSeq);
    ASSERT_TRUE(sample.ok());
    auto shard = ShardSamples({*sample}, 0, 1);
    ASSERT_TRUE(shard.ok());
    auto [l, t] = LossSum(*ref, *shard, LocalAttention());
    loss += l;
    tokens += t;
  }
  Result by_hand = Collect(*ref, loss / tokens, tokens);
  for (size_t i = 1; i < by_hand.size(); ++i) by_hand[i] /= static_cast<double>(tokens);

  const Result mb4 = TrainerStep(**data, 1, 4);
  const Result ga4 = TrainerStep(**data, 4, 1);
  ExpectSame(by_hand, mb4, tokens);
  ExpectSame(by_hand, ga4, tokens);
  ExpectSame(by_hand, RunRanks("dp", 2, prefix), tokens);
}

}  // namespace
}  // namespace ulysses::engine::train
