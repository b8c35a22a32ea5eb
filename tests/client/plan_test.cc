// client/plan: parameter counts of the presets against the published model
// sizes, and the all-to-all volume formula against the MHA closed form 4*N*H/P.
#include "client/plan.h"

#include "common/spec/job_spec_parser.h"
#include "gtest/gtest.h"

namespace ulysses::client {
namespace {

spec::JobSpec Job(const std::string& preset, int64_t seq_len, int64_t sp) {
  spec::JobSpec s;
  s.metadata.name = "plan";
  s.model.preset = preset;
  EXPECT_TRUE(spec::ApplyModelPreset(s.model).ok());
  s.data.synthetic = spec::SyntheticDataSpec{"random", 8};
  s.stages.push_back({seq_len, 10});
  s.parallelism.sp_degree = sp;
  return s;
}

TEST(PlanTest, PresetParameterCountsMatchPublishedSizes) {
  // Llama-3.2-1B: 1.24B (tied embeddings); Llama-3.1-8B: 8.03B.
  EXPECT_NEAR(ParameterCount(Job("llama3-1b", 1024, 1).model), 1.2358e9, 1e6);
  EXPECT_NEAR(ParameterCount(Job("llama3-8b", 1024, 1).model), 8.0301e9, 1e6);
}

TEST(PlanTest, MhaAllToAllIsFourNHOverP) {
  spec::JobSpec s = Job("tiny", 4096, 4);
  s.model.num_key_value_heads = s.model.num_attention_heads;  // MHA
  const std::vector<StagePlan> plans = PlanJob(s);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].tokens_per_rank, 1024);
  EXPECT_DOUBLE_EQ(plans[0].a2a_elements, 4.0 * 4096 * 256 / 4);
  // SP 1 keeps the whole sequence on one rank: no exchange at all.
  s.parallelism.sp_degree = 1;
  EXPECT_EQ(PlanJob(s)[0].a2a_elements, 0);
  EXPECT_EQ(PlanJob(s)[0].a2a_bytes, 0);
}

TEST(PlanTest, GqaReplicatesKvHeadsWhenSpExceedsThem) {
  spec::JobSpec s = Job("llama3-8b", 1 << 20, 32);
  const StagePlan p = PlanJob(s)[0];
  EXPECT_EQ(p.kv_heads_exchanged, 32);
  s.parallelism.sp_degree = 4;
  EXPECT_EQ(PlanJob(s)[0].kv_heads_exchanged, 8);
}

TEST(PlanTest, MemoryTechniquesReduceTheEstimate) {
  spec::JobSpec s = Job("llama3-8b", 131072, 8);
  const double plain = PlanJob(s)[0].activation_bytes;
  s.memory.activation_checkpointing = true;
  const double ckpt = PlanJob(s)[0].activation_bytes;
  s.memory.tiled_mlp = true;
  s.memory.tiled_loss = true;
  const double tiled = PlanJob(s)[0].activation_bytes;
  EXPECT_LT(ckpt, plain);
  EXPECT_LT(tiled, ckpt);
  s.model.hidden_size = 0;  // unknown shape (init_from): no estimate
  EXPECT_EQ(PlanJob(s)[0].activation_bytes, 0);
}

}  // namespace
}  // namespace ulysses::client
