// Goodput accounting (coordinator/goodput.h): the pure bookkeeping with injected times, so
// every figure is exact. Part of coordinator_job_machine_test.
#include "coordinator/goodput.h"

#include "gtest/gtest.h"

namespace ulysses::coordinator {
namespace {

double Lost(const GoodputRecord& g, LostReason r) { return g.lost_gpu_s[static_cast<int>(r)]; }

// Every GPU-second of the view is in exactly one bucket.
void ExpectPartition(const v1::Goodput& p) {
  const double parts = p.productive_gpu_seconds() + p.lost_failure_gpu_seconds() +
                       p.lost_preemption_gpu_seconds() + p.lost_restart_gpu_seconds() +
                       p.lost_checkpoint_stall_gpu_seconds() + p.lost_cancelled_gpu_seconds() +
                       p.uncommitted_gpu_seconds();
  EXPECT_NEAR(parts, p.allocated_gpu_seconds(), 1e-9) << p.DebugString();
}

// One attempt of 4 ranks launched at t=0 (ms): first step reported at 10 s taking 2 s, steps
// every 2 s, a checkpoint of step 5 (its step ended at 18 s) reported at 19 s blocking 0.5 s,
// a step 6 at 20.5 s, then a preemption at 30 s.
TEST(GoodputTest, AnAttemptIsCutIntoRestartProductiveStallAndItsCause) {
  GoodputRecord g;
  GoodputSteps steps;
  GoodputStart(g, steps, /*generation=*/1, /*world=*/4, /*started_ms=*/0);
  GoodputDelta d = GoodputStep(g, steps, 1, 2.0, 10'000);
  EXPECT_DOUBLE_EQ(d.lost_gpu_s[static_cast<int>(LostReason::kRestart)], 8.0 * 4);  // 0..8 s
  for (int s = 2; s <= 5; ++s) GoodputStep(g, steps, s, 2.0, 10'000 + (s - 1) * 2000);
  ExpectPartition(GoodputToProto(g, 19'000));
  EXPECT_DOUBLE_EQ(GoodputToProto(g, 19'000).uncommitted_gpu_seconds(), (19 - 8) * 4.0);
  d = GoodputCommit(g, steps, 5, 0.5, 19'000);
  EXPECT_DOUBLE_EQ(d.productive_gpu_s, (18 - 8) * 4.0);  // 8 s .. step 5's end at 18 s.
  EXPECT_DOUBLE_EQ(d.lost_gpu_s[static_cast<int>(LostReason::kCheckpointStall)], 0.5 * 4);
  GoodputStep(g, steps, 6, 2.0, 20'500);
  GoodputEnd(g, v1::ATTEMPT_OUTCOME_PREEMPTED, 30'000);
  v1::Goodput before = GoodputToProto(g, 31'000);  // Ended, not settled: counted provisionally.
  EXPECT_DOUBLE_EQ(before.lost_preemption_gpu_seconds(), (30 - 18.5) * 4);
  ExpectPartition(before);
  bool changed = false;
  d = GoodputSettle(g, 31'000, /*settle_ms=*/5000, /*force=*/false, &changed);
  EXPECT_FALSE(changed);  // Within the grace: a late commit may still come.
  d = GoodputSettle(g, 35'000, 5000, false, &changed);
  EXPECT_TRUE(changed);
  EXPECT_DOUBLE_EQ(d.lost_gpu_s[static_cast<int>(LostReason::kPreemption)], (30 - 18.5) * 4);
  const v1::Goodput after = GoodputToProto(g, 99'000);  // Settled: no longer grows.
  EXPECT_DOUBLE_EQ(after.allocated_gpu_seconds(), 30 * 4.0);
  EXPECT_DOUBLE_EQ(after.productive_gpu_seconds(), 40.0);
  EXPECT_DOUBLE_EQ(after.ratio(), 40.0 / 120.0);
  EXPECT_DOUBLE_EQ(after.uncommitted_gpu_seconds(), 0);
  ExpectPartition(after);
  EXPECT_EQ(Lost(g, LostReason::kFailure), 0);
}

// A preempted rank commits its checkpoint in the grace, after the attempt ended (its peers
// exited first): that work is productive, not lost.
TEST(GoodputTest, ACommitInTheGraceAfterTheEndIsProductive) {
  GoodputRecord g;
  GoodputSteps steps;
  GoodputStart(g, steps, 3, 2, 1'000);
  GoodputStep(g, steps, 1, 1.0, 3'000);  // Training from 2 s.
  GoodputStep(g, steps, 2, 1.0, 4'000);
  GoodputEnd(g, v1::ATTEMPT_OUTCOME_PREEMPTED, 5'000);
  GoodputDelta d = GoodputCommit(g, steps, 2, 0.25, 6'000);
  EXPECT_DOUBLE_EQ(d.productive_gpu_s, 2 * 2.0);  // 2 s .. 4 s.
  EXPECT_DOUBLE_EQ(d.lost_gpu_s[static_cast<int>(LostReason::kCheckpointStall)], 0.25 * 2);
  bool changed = false;
  d = GoodputSettle(g, 6'000, 0, /*force=*/true, &changed);
  EXPECT_DOUBLE_EQ(d.lost_gpu_s[static_cast<int>(LostReason::kPreemption)], 0.75 * 2);
  // A commit after settling changes nothing.
  d = GoodputCommit(g, steps, 3, 0, 7'000);
  EXPECT_EQ(d.productive_gpu_s, 0);
  ExpectPartition(GoodputToProto(g, 8'000));
  EXPECT_DOUBLE_EQ(GoodputToProto(g, 8'000).allocated_gpu_seconds(), 4 * 2.0);
}

// Failures, cancels and finished stages name their cause; the next launch settles the last
// attempt at once; an attempt that never trained is all its cause.
TEST(GoodputTest, CausesAccumulateOverAttempts) {
  GoodputRecord g;
  GoodputSteps steps;
  GoodputStart(g, steps, 1, 2, 0);
  GoodputEnd(g, v1::ATTEMPT_OUTCOME_FAILED, 3'000);      // Failed before its first step.
  GoodputDelta d = GoodputStart(g, steps, 2, 2, 4'000);  // Settles generation 1.
  EXPECT_DOUBLE_EQ(d.lost_gpu_s[static_cast<int>(LostReason::kFailure)], 3 * 2.0);
  GoodputStep(g, steps, 1, -1, 5'000);  // Unknown step time: training from the report.
  GoodputCommit(g, steps, 1, -1, 6'000);
  GoodputEnd(g, v1::ATTEMPT_OUTCOME_ABORTED, 8'000);
  GoodputCancelled(g);
  d = GoodputStart(g, steps, 3, 1, 9'000);  // Resumed.
  EXPECT_DOUBLE_EQ(d.lost_gpu_s[static_cast<int>(LostReason::kCancelled)], 3 * 2.0);
  GoodputStep(g, steps, 2, 0.5, 10'000);
  GoodputCommit(g, steps, 2, 1.0, 11'000);  // Final checkpoint of the stage: a 1 s sync save.
  GoodputEnd(g, v1::ATTEMPT_OUTCOME_SUCCEEDED, 12'000);
  bool changed = false;
  GoodputSettle(g, 12'000, 0, true, &changed);
  EXPECT_DOUBLE_EQ(Lost(g, LostReason::kFailure), 6.0);
  EXPECT_DOUBLE_EQ(Lost(g, LostReason::kCancelled), 6.0);
  EXPECT_DOUBLE_EQ(Lost(g, LostReason::kCheckpointStall), 1.0);
  // Restart: gen 2 launch 4 s .. 5 s (x2), gen 3 9 s .. 9.5 s, and 11 s .. 12 s after the commit.
  EXPECT_DOUBLE_EQ(Lost(g, LostReason::kRestart), 2.0 + 0.5 + 1.0);
  // Generation 2's one step counts as its start (no step time: training from the report).
  EXPECT_DOUBLE_EQ(g.productive_gpu_s, 0.5);
  const v1::Goodput p = GoodputToProto(g, 50'000);
  EXPECT_DOUBLE_EQ(p.allocated_gpu_seconds(), 3 * 2 + 4 * 2 + 3 * 1.0);
  ExpectPartition(p);
}

TEST(GoodputTest, TheRecordRoundTripsAndBadTextIsRefused) {
  GoodputRecord g;
  GoodputSteps steps;
  GoodputStart(g, steps, 7, 8, 1'234);
  GoodputStep(g, steps, 1, 0.1, 2'000);
  GoodputCommit(g, steps, 1, 0.3, 2'500);
  GoodputEnd(g, v1::ATTEMPT_OUTCOME_PREEMPTED, 3'000);
  absl::StatusOr<GoodputRecord> back = DecodeGoodput(EncodeGoodput(g));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(EncodeGoodput(*back), EncodeGoodput(g));
  EXPECT_EQ(back->end_reason, LostReason::kPreemption);
  EXPECT_EQ(back->generation, 7);
  EXPECT_DOUBLE_EQ(back->productive_gpu_s, g.productive_gpu_s);
  EXPECT_EQ(DecodeGoodput("")->generation, 0);  // A job stored before accounting.
  for (const char* bad :
       {"v2 0 0 0 0 0 0 0 1 1 0 0 0 0 0 0 end", "v1 1 2 3", "garbage",
        "v1 -1 0 0 0 0 0 0 1 1 0 0 0 0 0 0 end", "v1 0 0 0 0 0 0 0 1 1 0 0 0 0 0 9 end"}) {
    EXPECT_EQ(DecodeGoodput(bad).status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

TEST(GoodputTest, StepTimesStayBoundedAndOlderCommitsUseTheNearestKeptStep) {
  GoodputRecord g;
  GoodputSteps steps;
  GoodputStart(g, steps, 1, 1, 0);
  for (int64_t s = 1; s <= 3 * static_cast<int64_t>(kMaxGoodputSteps); ++s) {
    GoodputStep(g, steps, s, 0, s * 10);
  }
  EXPECT_LE(steps.size(), kMaxGoodputSteps);
  EXPECT_EQ(steps.back().first, 3 * static_cast<int64_t>(kMaxGoodputSteps));
  const GoodputDelta d = GoodputCommit(g, steps, 101, 0, 1'000'000);
  EXPECT_GT(d.productive_gpu_s, 0);
  EXPECT_LE(d.productive_gpu_s, 101 * 10 / 1000.0);  // Never past step 101's end.
  ExpectPartition(GoodputToProto(g, 1'000'000));
}

}  // namespace
}  // namespace ulysses::coordinator
