// StepAgreement (worker/engine/train/step_agreement.h) without a communicator: the packed tensors
// of a world, max-reduced element by element as AllReduceMax does, unpack to every rank's step
// seconds, a stop if any rank asked for one and the schedule slots' max.
#include "worker/engine/train/step_agreement.h"

#include <array>
#include <vector>

#include <gtest/gtest.h>

namespace ulysses::engine::train {
namespace {

using Slots = std::array<float, CheckpointSchedule::kSlots>;

torch::Tensor MaxOver(const std::vector<torch::Tensor>& packed) {
  torch::Tensor out = packed.front().clone();
  for (const torch::Tensor& t : packed) out = torch::maximum(out, t);
  return out;
}

TEST(StepAgreementTest, PackedRanksMaxReducedUnpackToEveryRanksFigures) {
  const int world = 3;
  const std::vector<double> seconds = {0.5, 1.25, 0.75};
  const std::vector<Slots> slots = {Slots{0, 1, 0}, Slots{0, 0, 4}, Slots{2, 0, 1}};
  std::vector<torch::Tensor> packed;
  for (int r = 0; r < world; ++r) {
    packed.push_back(StepAgreement::Pack(/*stop=*/r == 1, r, world, seconds[r], slots[r]));
    ASSERT_EQ(packed.back().numel(), StepAgreement::Size(world));
    EXPECT_EQ(packed.back().scalar_type(), torch::kFloat32);
  }
  const StepAgreement a = StepAgreement::Unpack(MaxOver(packed), world);
  EXPECT_TRUE(a.stop) << "rank 1 asked to stop";
  ASSERT_EQ(a.rank_seconds.size(), 3u);
  for (int r = 0; r < world; ++r) EXPECT_DOUBLE_EQ(a.rank_seconds[r], seconds[r]) << r;
  EXPECT_EQ(a.schedule, (Slots{2, 1, 4}));
}

TEST(StepAgreementTest, NoRankAskingMeansNoStop) {
  const int world = 2;
  std::vector<torch::Tensor> packed;
  for (int r = 0; r < world; ++r) packed.push_back(StepAgreement::Pack(false, r, world, 1.0, {}));
  const StepAgreement a = StepAgreement::Unpack(MaxOver(packed), world);
  EXPECT_FALSE(a.stop);
  EXPECT_EQ(a.schedule, (Slots{0, 0, 0}));
  // One rank alone is a world of one: its own figures back.
  const StepAgreement one =
      StepAgreement::Unpack(StepAgreement::Pack(true, 0, 1, 0.25, Slots{1, 2, 3}), 1);
  EXPECT_TRUE(one.stop);
  EXPECT_DOUBLE_EQ(one.rank_seconds.at(0), 0.25);
  EXPECT_EQ(one.schedule, (Slots{1, 2, 3}));
}

}  // namespace
}  // namespace ulysses::engine::train
