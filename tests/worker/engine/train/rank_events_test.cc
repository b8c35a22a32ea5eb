// The group figures of a step and the progress line (worker/engine/train/rank_events.h); the
// preemption decision (worker/engine/train/preemption.h).
#include "worker/engine/train/rank_events.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "worker/engine/train/preemption.h"

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
            "stage 1 step 3/10 seq_len 256 loss 4.1523 tok/s 1234 ckpt none");
  e.mfu = 0.1234;
  e.slowest_rank = 1;
  e.slowest_step_seconds = 0.52;
  e.median_step_seconds = 0.48;
  EXPECT_EQ(ProgressLine(e, 12.4),
            "stage 1 step 3/10 seq_len 256 loss 4.1523 tok/s 1234 mfu 12.3% slowest r1 0.520s "
            "(median 0.480s) ckpt 12s ago");
}

// A step that ends, with its save, before the deadline is finished and committed; one that
// does not, one that is overdue (no estimate) and one whose length is unknown are left.
TEST(PreemptionTest, FinishesTheStepOnlyWhenItAndItsSaveFitTheGrace) {
  PreemptionView v;
  v.in_step = true;
  v.since_begin = 4;
  v.step_seconds = 10;
  v.save_seconds = 3;
  v.seconds_left = 9.5;  // 6 s of step + 3 s of save fit
  EXPECT_EQ(DecidePreemption(v), PreemptionAction::kFinishStep);
  v.seconds_left = 8.5;  // they do not
  EXPECT_EQ(DecidePreemption(v), PreemptionAction::kLeaveNow);
  v.seconds_left = 1000;
  v.since_begin = 16;  // overdue (> 1.5 typical steps): no estimate of its end
  EXPECT_EQ(DecidePreemption(v), PreemptionAction::kLeaveNow);
  v.since_begin = 14;  // late but not overdue: what is left counts as 0
  EXPECT_EQ(DecidePreemption(v), PreemptionAction::kFinishStep);
  v.step_seconds = 0;  // the first step: its length is unknown
  EXPECT_EQ(DecidePreemption(v), PreemptionAction::kLeaveNow);
  // Between steps (saving, evaluating) the stop waits for the end of the next step.
  v.in_step = false;
  v.since_begin = 0.5;
  v.step_seconds = 10;
  v.seconds_left = 13.5;  // a whole step (10 s) and its save (3 s)
  EXPECT_EQ(DecidePreemption(v), PreemptionAction::kFinishStep);
  v.seconds_left = 12.5;
  EXPECT_EQ(DecidePreemption(v), PreemptionAction::kLeaveNow);
  EXPECT_NE(DescribePreemption(v, PreemptionAction::kLeaveNow).find("running step is lost"),
            std::string::npos);
  // The margin before SIGKILL: 10 % of the grace, at most 2 s.
  EXPECT_DOUBLE_EQ(PreemptionMarginSeconds(5), 0.5);
  EXPECT_DOUBLE_EQ(PreemptionMarginSeconds(120), 2.0);
  EXPECT_DOUBLE_EQ(PreemptionMarginSeconds(0), 0.0);
}

}  // namespace
}  // namespace ulysses::engine::train
