// Where a rank starts (PlanResume, worker/engine/train/resume.h) when the checkpoint directory
// holds another job's checkpoints.
#include "worker/engine/train/resume.h"

#include <gtest/gtest.h>

#include "tests/testing/temp_dir.h"
#include "worker/engine/checkpoint/checkpoint.h"

namespace ulysses::engine::train {
namespace {

using ::ulysses::testing::TempDir;

// A committed stage-complete checkpoint of stage 0 written by `owner`.
std::string SaveFinal(const std::string& root, const CheckpointOwner& owner) {
  CheckpointState state;
  state.stage = 0;
  state.step_in_stage = 4;
  state.global_step = 4;
  state.stage_complete = true;
  state.spec_hash = "h";
  state.owner = owner;
  state.tensors = {{"model/w", torch::ones({2, 2})}};
  absl::StatusOr<std::string> dir =
      SaveCheckpoint(root, state, 0, 1, 2, [] { return absl::OkStatus(); });
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *dir : "";
}

// Before (b145c41): bob's job given alice's directory (same spec) found her final checkpoint of
// stage 0 and reported it as its own result (SUCCEEDED at her step, no training), and its stage 1
// resumed from her weights. Now both are refused, naming this job; her own job and her tenant's
// job with checkpoint.adopt resume as before.
TEST(ResumeTest, AnotherJobsCheckpointIsNeitherTheResultNorTheStart) {
  TempDir root;
  const std::string alices = SaveFinal(root.path(), {"research", "job-000001"});
  const CheckpointOwner bob{"other", "job-000002"};
  for (int stage : {0, 1}) {
    absl::StatusOr<ResumePlan> plan = PlanResume(root.path(), "h", stage, bob, /*adopt=*/true);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition) << plan.status();
    EXPECT_NE(plan.status().message().find("this is job job-000002"), std::string::npos)
        << plan.status();
  }
  absl::StatusOr<ResumePlan> same_tenant =
      PlanResume(root.path(), "h", 1, {"research", "job-000003"}, /*adopt=*/false);
  EXPECT_EQ(same_tenant.status().code(), absl::StatusCode::kFailedPrecondition)
      << same_tenant.status();

  absl::StatusOr<ResumePlan> own = PlanResume(root.path(), "h", 0, {"research", "job-000001"});
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(own->stage_done);
  EXPECT_EQ(own->path, alices);
  absl::StatusOr<ResumePlan> adopted =
      PlanResume(root.path(), "h", 1, {"research", "job-000003"}, /*adopt=*/true);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_FALSE(adopted->stage_done);
  EXPECT_EQ(adopted->path, alices);
}

}  // namespace
}  // namespace ulysses::engine::train
