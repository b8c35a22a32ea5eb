#include "common/status.h"

#include <gtest/gtest.h>

namespace ulysses {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status QuarterInto(int x, int* out) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(*out, Half(half));
  return absl::OkStatus();
}

absl::Status FailsThenContinues(bool fail, int* reached) {
  RETURN_IF_ERROR(fail ? absl::NotFoundError("gone") : absl::OkStatus());
  *reached = 1;
  return absl::OkStatus();
}

TEST(StatusTest, AssignOrReturnPropagatesValueAndError) {
  int out = 0;
  EXPECT_TRUE(QuarterInto(8, &out).ok());
  EXPECT_EQ(out, 2);
  absl::Status status = QuarterInto(6, &out);  // 6 -> 3 -> odd.
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "odd");
}

TEST(StatusTest, ReturnIfErrorStopsOnError) {
  int reached = 0;
  EXPECT_EQ(FailsThenContinues(true, &reached).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(FailsThenContinues(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusTest, AnnotateKeepsCodeAndPrependsContext) {
  absl::Status s = Annotate(absl::DataLossError("bad crc"), "shard-00001.bin");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "shard-00001.bin: bad crc");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace ulysses
