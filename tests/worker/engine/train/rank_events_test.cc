// The group figures of a step and the progress line (worker/engine/train/rank_events.h).
#include "worker/engine/train/rank_events.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace ulysses::engine::train {
namespace {

TEST(GroupFiguresTest, SlowestIsTheLowestRankWithTheLongestStepAndMedianIsTheMiddle) {
  GroupStepFigures g = GroupFigures({0.5, 0.75, 0.25, 0.75});
  EXPECT_EQ(g.slowest_rank, 1);
  EXPECT_DOUBLE_EQ(g.slowest_step_seconds, 0.75);
  EXPECT_DOUBLE_EQ(g.median_step_seconds, 0.625);  // (0.5 + 0.75) / 2
  g = GroupFigures({0.25, 0.5, 2.0});
  EXPECT_EQ(g.slowest_rank, 2);
  EXPECT_DOUBLE_EQ(g.median_step_seconds, 0.5);
  // Non-finite or negative seconds count as 0; no ranks: all 0.
  g = GroupFigures({std::numeric_limits<double>::quiet_NaN(), -1.0, 0.125});
  EXPECT_EQ(g.slowest_rank, 2);
  EXPECT_DOUBLE_EQ(g.median_step_seconds, 0.0);
  g = GroupFigures({});
  EXPECT_EQ(g.slowest_rank, 0);
  EXPECT_DOUBLE_EQ(g.slowest_step_seconds, 0.0);
}

TEST(ProgressLineTest, ShowsTheFiguresTheEventHas) {
  contract::StepEvent e{0, 3, 10, 4.15234, 1234.4, 256};
  EXPECT_EQ(ProgressLine(e, std::nullopt),
            "stage 0 step 3/10 seq_len 256 loss 4.1523 tok/s 1234 ckpt none");
  e.mfu = 0.1234;
  e.slowest_rank = 1;
  e.slowest_step_seconds = 0.52;
  e.median_step_seconds = 0.48;
  EXPECT_EQ(ProgressLine(e, 12.4),
            "stage 0 step 3/10 seq_len 256 loss 4.1523 tok/s 1234 mfu 12.3% slowest r1 0.520s "
            "(median 0.480s) ckpt 12s ago");
}

}  // namespace
}  // namespace ulysses::engine::train
