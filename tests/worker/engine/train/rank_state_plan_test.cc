// PlanRankState (rank_state.h): where a rank's state comes from, decided once for the six
// cases init / import / resume x below ZeRO-3 / at ZeRO-3, without a communicator.
#include <string>

#include "gtest/gtest.h"
#include "worker/engine/train/rank_state.h"

namespace ulysses::engine::train {
namespace {

spec::JobSpec SpecWith(int zero_stage, const std::string& init_from) {
  spec::JobSpec spec;
  spec.parallelism.zero_stage = zero_stage;
  spec.model.init_from = init_from;
  return spec;
}

ResumePlan Resuming(bool with_model_config) {
  ResumePlan r;
  r.state.emplace();
  if (with_model_config) r.training.model_config.emplace();
  return r;
}

TEST(PlanRankStateTest, InitSeedsTheChunksOnlyUnderZero) {
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE(zero);
    const StatePlan p = PlanRankState(SpecWith(zero, ""), ResumePlan{});
    EXPECT_EQ(p.source, StateSource::kInit);
    EXPECT_STREQ(p.Name(), "init");
    EXPECT_EQ(p.seed_chunks, zero > 0);
    EXPECT_EQ(p.sharded_init, zero == 3);
    EXPECT_FALSE(p.restore_whole_model || p.import_whole_model || p.import_chunks ||
                 p.restore_optimizer || p.config_from_checkpoint);
  }
}

TEST(PlanRankStateTest, ImportReadsTheWholeModelBelowZero3AndItsChunksAtZero3) {
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE(zero);
    const StatePlan p = PlanRankState(SpecWith(zero, "/models/llama"), ResumePlan{});
    EXPECT_EQ(p.source, StateSource::kImport);
    EXPECT_STREQ(p.Name(), "import");
    EXPECT_EQ(p.import_whole_model, zero < 3);
    EXPECT_EQ(p.import_chunks, zero == 3);
    EXPECT_FALSE(p.seed_chunks);  // The import's weights, never the seed's.
    EXPECT_FALSE(p.restore_optimizer || p.restore_whole_model || p.config_from_checkpoint);
  }
}

// A checkpoint wins over init_from: a resumed job never imports again.
TEST(PlanRankStateTest, ResumeWinsOverInitFromAndRestoresTheOptimizer) {
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE(zero);
    const StatePlan p = PlanRankState(SpecWith(zero, "/models/llama"), Resuming(true));
    EXPECT_EQ(p.source, StateSource::kResume);
    EXPECT_STREQ(p.Name(), "resume");
    EXPECT_EQ(p.restore_whole_model, zero < 3);  // At ZeRO-3 the share loads chunk by chunk.
    EXPECT_TRUE(p.restore_optimizer);
    EXPECT_TRUE(p.config_from_checkpoint);
    EXPECT_FALSE(p.import_whole_model || p.import_chunks || p.seed_chunks);
  }
  // A checkpoint without a model config (written before it had one): the spec's.
  EXPECT_FALSE(PlanRankState(SpecWith(0, ""), Resuming(false)).config_from_checkpoint);
}

}  // namespace
}  // namespace ulysses::engine::train
