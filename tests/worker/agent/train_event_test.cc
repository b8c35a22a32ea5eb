#include "worker/agent/train_event.h"

#include <sys/wait.h>

#include "gtest/gtest.h"

namespace ulysses::agent {
namespace {

int Exited(int code) { return (code & 0xff) << 8; }  // What waitpid reports for exit(code).
int Signaled(int sig) { return sig & 0x7f; }

TEST(TrainEventTest, ParsesStep) {
  auto event = ParseTrainEvent(
      R"({"event":"step","stage":1,"step":7,"steps":20,"loss":3.25,"tokens_per_s":1234.5,"seq_len":2048})");
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(event->kind, TrainEvent::Kind::kStep);
  EXPECT_EQ(event->stage, 1);
  EXPECT_EQ(event->step, 7);
  EXPECT_EQ(event->steps, 20);
  EXPECT_DOUBLE_EQ(event->loss, 3.25);
  EXPECT_DOUBLE_EQ(event->tokens_per_s, 1234.5);
  EXPECT_EQ(event->seq_len, 2048);
}

TEST(TrainEventTest, ParsesCheckpointEvalDone) {
  auto ckpt = ParseTrainEvent(
      R"({"event":"checkpoint","stage":0,"step":10,"path":"/ck/step-10","bytes":99,"seconds":0.5})");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->kind, TrainEvent::Kind::kCheckpoint);
  EXPECT_EQ(ckpt->path, "/ck/step-10");
  EXPECT_EQ(ckpt->bytes, 99);
  EXPECT_DOUBLE_EQ(ckpt->seconds, 0.5);

  auto eval =
      ParseTrainEvent(R"({"event":"eval","stage":2,"seq_len":4096,"loss":2.0,"accuracy":0.75})");
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->kind, TrainEvent::Kind::kEval);
  ASSERT_TRUE(eval->accuracy.has_value());
  EXPECT_DOUBLE_EQ(*eval->accuracy, 0.75);

  auto eval_no_acc = ParseTrainEvent(R"({"event":"eval","stage":2,"seq_len":4096,"loss":2.0})");
  ASSERT_TRUE(eval_no_acc.ok());
  EXPECT_FALSE(eval_no_acc->accuracy.has_value());

  auto done = ParseTrainEvent(R"({"event":"done","stage":2})");
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->kind, TrainEvent::Kind::kDone);
  EXPECT_EQ(done->stage, 2);
}

TEST(TrainEventTest, RejectsNonEvents) {
  EXPECT_EQ(ParseTrainEvent("loading model").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTrainEvent("{not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTrainEvent("").status().code(), absl::StatusCode::kInvalidArgument);
  auto unknown = ParseTrainEvent(R"({"event":"warp","stage":0})");
  EXPECT_NE(unknown.status().message().find("unknown event \"warp\""), std::string::npos);
  auto no_step = ParseTrainEvent(R"({"event":"step","stage":0})");
  EXPECT_NE(no_step.status().message().find("\"step\""), std::string::npos);
  auto bad_type = ParseTrainEvent(R"({"event":"step","stage":0,"step":"x"})");
  EXPECT_NE(bad_type.status().message().find("not a number"), std::string::npos);
  auto no_path = ParseTrainEvent(R"({"event":"checkpoint","stage":0,"step":3})");
  EXPECT_NE(no_path.status().message().find("path"), std::string::npos);
}

TEST(TrainEventTest, MapsExitCodesWithoutStopRequest) {
  EXPECT_EQ(MapExit(Exited(0), StopCause::kNone), AttemptOutcome::kSucceeded);
  EXPECT_EQ(MapExit(Exited(75), StopCause::kNone), AttemptOutcome::kPreempted);
  EXPECT_EQ(MapExit(Exited(2), StopCause::kNone), AttemptOutcome::kBadInput);
  EXPECT_EQ(MapExit(Exited(1), StopCause::kNone), AttemptOutcome::kFailed);
  EXPECT_EQ(MapExit(Exited(127), StopCause::kNone), AttemptOutcome::kFailed);
  EXPECT_EQ(MapExit(Signaled(SIGSEGV), StopCause::kNone), AttemptOutcome::kFailed);
  EXPECT_EQ(MapExit(Signaled(SIGKILL), StopCause::kNone), AttemptOutcome::kFailed);
}

TEST(TrainEventTest, MapsExitCodesAfterStopRequest) {
  EXPECT_EQ(MapExit(Exited(75), StopCause::kPreempt), AttemptOutcome::kPreempted);
  EXPECT_EQ(MapExit(Signaled(SIGKILL), StopCause::kPreempt), AttemptOutcome::kPreempted);
  EXPECT_EQ(MapExit(Exited(0), StopCause::kPreempt), AttemptOutcome::kSucceeded);
  EXPECT_EQ(MapExit(Exited(75), StopCause::kAbort), AttemptOutcome::kAborted);
  EXPECT_EQ(MapExit(Signaled(SIGKILL), StopCause::kAbort), AttemptOutcome::kAborted);
  EXPECT_EQ(MapExit(Exited(1), StopCause::kAbort), AttemptOutcome::kAborted);
}

TEST(TrainEventTest, DescribesWaitStatus) {
  EXPECT_EQ(DescribeWaitStatus(Exited(75)), "exit code 75");
  EXPECT_NE(DescribeWaitStatus(Signaled(SIGKILL)).find("killed by signal 9"), std::string::npos);
}

}  // namespace
}  // namespace ulysses::agent
