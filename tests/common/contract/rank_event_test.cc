#include "common/contract/rank_event.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/contract/rank_control.h"
#include "gtest/gtest.h"

namespace ulysses::contract {
namespace {

// Parses a line that must be a valid event.
RankEvent MustParse(const std::string& line) {
  absl::StatusOr<std::optional<RankEvent>> parsed = ParseRankEventLine(line);
  EXPECT_TRUE(parsed.ok()) << line << ": " << parsed.status();
  EXPECT_TRUE(parsed.ok() && parsed->has_value()) << line << " was not read as an event";
  return parsed.ok() && parsed->has_value() ? **parsed : RankEvent{};
}

// The error message for a line that must be rejected.
std::string MustReject(const std::string& line) {
  absl::StatusOr<std::optional<RankEvent>> parsed = ParseRankEventLine(line);
  EXPECT_FALSE(parsed.ok()) << line << " was accepted";
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST(RankEventTest, SerializesEachKindAsDocumented) {
  EXPECT_EQ(SerializeRankEvent(StepEvent{1, 7, 20, 3.25, 1234.5, 2048}),
            R"({"event":"step","stage":1,"step":7,"steps":20,"loss":3.25,)"
            R"("tokens_per_s":1234.5,"seq_len":2048})");
  EXPECT_EQ(SerializeRankEvent(CheckpointEvent{0, 10, "/ck/step-00000010", 99, 0.5}),
            R"({"event":"checkpoint","stage":0,"step":10,"path":"/ck/step-00000010",)"
            R"("bytes":99,"seconds":0.5})");
  EXPECT_EQ(SerializeRankEvent(EvalEvent{2, 4096, 2.0, 0.75}),
            R"({"event":"eval","stage":2,"seq_len":4096,"loss":2.0,"accuracy":0.75})");
  EXPECT_EQ(SerializeRankEvent(EvalEvent{2, 4096, 2.0, std::nullopt}),
            R"({"event":"eval","stage":2,"seq_len":4096,"loss":2.0})");
  EXPECT_EQ(SerializeRankEvent(EvalEvent{2, 4096, 2.0, std::nullopt, 30}),
            R"({"event":"eval","stage":2,"seq_len":4096,"loss":2.0,"step":30})");
  EXPECT_EQ(SerializeRankEvent(DoneEvent{2, 1 << 20}),
            R"({"event":"done","stage":2,"peak_rss_bytes":1048576})");
  EXPECT_EQ(SerializeRankEvent(DoneEvent{2, std::nullopt}), R"({"event":"done","stage":2})");
}

TEST(RankEventTest, RoundTripsEveryKind) {
  const RankEvent events[] = {
      StepEvent{3, 1, 1, 0.0, 0.0, 1},
      StepEvent{0, 20, 20, 10.875, 98765.25, 1 << 20},
      CheckpointEvent{1, 0, "runs/x/checkpoints/step-00000000", -1, 0.0},
      CheckpointEvent{1, 8, "/ck/step-8", int64_t{1} << 40, 12.5},
      CheckpointEvent{1, 9, "/ck/step-9", 4096, 12.5, 0.25},
      EvalEvent{0, 64, 4.5, std::nullopt},
      EvalEvent{0, 64, 4.5, 1.0},
      EvalEvent{0, 64, 4.5, std::nullopt, 6},
      DoneEvent{7, std::nullopt},
      DoneEvent{7, 0},
  };
  for (const RankEvent& event : events) {
    const std::string line = SerializeRankEvent(event);
    EXPECT_EQ(MustParse(line), event) << line;
  }
}

// The optional per-rank figures of a step event: written only when set, read back
// exactly, each checked against its rule (docs/CONTRACTS.md).
TEST(RankEventTest, StepCarriesOptionalPerRankFigures) {
  StepEvent e{0, 2, 4, 3.0, 100.0, 256};
  e.step_seconds = 0.5;
  e.data_wait_seconds = 0.125;
  e.forward_seconds = 0.25;
  e.backward_seconds = 0.0625;
  e.optimizer_seconds = 0.0625;
  e.alltoall_seconds = 0.03125;
  e.alltoall_bytes = 4096;
  e.peak_allocated_bytes = 1 << 20;
  e.peak_reserved_bytes = 2 << 20;
  e.memory_limit_bytes = int64_t{1} << 34;
  e.rank_tokens_per_s = 50;
  e.model_flops_per_s = 1.5e12;
  const std::string line = SerializeRankEvent(e);
  EXPECT_NE(line.find(R"("alltoall_bytes":4096)"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("step_seconds":0.5)"), std::string::npos) << line;
  EXPECT_EQ(MustParse(line), RankEvent(e)) << line;
  StepEvent partial{0, 2, 4, 3.0, 100.0, 256};
  partial.peak_allocated_bytes = 7;
  EXPECT_EQ(MustParse(SerializeRankEvent(partial)), RankEvent(partial));
  EXPECT_FALSE(MustParse(SerializeRankEvent(partial)) == RankEvent(e));
  const std::string base = R"({"event":"step","stage":0,"step":1,"steps":1,"loss":1,)"
                           R"("tokens_per_s":1,"seq_len":8,)";
  EXPECT_EQ(MustReject(base + R"("alltoall_seconds":-1})"),
            "step.alltoall_seconds: -1 is out of range (a finite number >= 0)");
  EXPECT_EQ(MustReject(base + R"("alltoall_bytes":1.5})"),
            "step.alltoall_bytes: 1.5 is not an integer (an integer >= 0)");
  EXPECT_EQ(MustReject(base + R"("model_flops_per_s":null})"),
            "step.model_flops_per_s: null is not a number (a finite number >= 0)");
}

// The optional group figures (docs/CONTRACTS.md): the same round trip and rules, plus the
// pairing of slowest_rank with slowest_step_seconds.
TEST(RankEventTest, StepCarriesOptionalGroupFigures) {
  StepEvent e{1, 3, 8, 2.5, 400.0, 512};
  e.mfu = 0.375;
  e.median_step_seconds = 0.25;
  e.slowest_step_seconds = 0.75;
  e.slowest_rank = 3;
  e.grad_norm = 1.25;
  e.lr = 0.0005;
  const std::string line = SerializeRankEvent(e);
  EXPECT_NE(line.find(R"("grad_norm":1.25,"lr":0.0005)"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("mfu":0.375,"median_step_seconds":0.25,"slowest_step_seconds":0.75)"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find(R"("slowest_rank":3)"), std::string::npos) << line;
  EXPECT_EQ(MustParse(line), RankEvent(e)) << line;
  StepEvent other = e;
  other.slowest_rank = 2;
  EXPECT_FALSE(MustParse(line) == RankEvent(other));
  other = e;
  other.lr = 0.001;
  EXPECT_FALSE(MustParse(line) == RankEvent(other));
  const std::string base = R"({"event":"step","stage":0,"step":1,"steps":1,"loss":1,)"
                           R"("tokens_per_s":1,"seq_len":8,)";
  EXPECT_EQ(MustReject(base + R"("mfu":-0.5})"),
            "step.mfu: -0.5 is out of range (a finite number >= 0)");
  EXPECT_EQ(MustReject(base + R"("slowest_rank":-1,"slowest_step_seconds":1})"),
            "step.slowest_rank: -1 is out of range (an integer in [0, 2147483646])");
  EXPECT_EQ(MustReject(base + R"("slowest_rank":2147483647,"slowest_step_seconds":1})"),
            "step.slowest_rank: 2147483647 is out of range (an integer in [0, 2147483646])");
  EXPECT_EQ(MustReject(base + R"("slowest_rank":1})"),
            "step.slowest_rank: 1 but step.slowest_step_seconds absent (give both, or neither)");
  EXPECT_EQ(MustReject(base + R"("slowest_step_seconds":1})"),
            "step.slowest_rank: absent but step.slowest_step_seconds given (give both, or "
            "neither)");
}

TEST(RankEventTest, WriteRankEventWritesOneLine) {
  std::ostringstream out;
  WriteRankEvent(out, DoneEvent{1, std::nullopt});
  WriteRankEvent(out, DoneEvent{2, std::nullopt});
  EXPECT_EQ(out.str(), "{\"event\":\"done\",\"stage\":1}\n{\"event\":\"done\",\"stage\":2}\n");
}

TEST(RankEventTest, KindNames) {
  EXPECT_STREQ(RankEventKind(StepEvent{}), "step");
  EXPECT_STREQ(RankEventKind(CheckpointEvent{}), "checkpoint");
  EXPECT_STREQ(RankEventKind(EvalEvent{}), "eval");
  EXPECT_STREQ(RankEventKind(DoneEvent{}), "done");
}

TEST(RankEventTest, ReadsEventsInAnyFieldOrderAndWithCarriageReturn) {
  EXPECT_EQ(MustParse(R"({"stage":0,"event":"done"})"), RankEvent(DoneEvent{0, std::nullopt}));
  EXPECT_EQ(MustParse("{\"event\":\"done\",\"stage\":4}\r"), RankEvent(DoneEvent{4, std::nullopt}));
  // Integers are numbers too.
  EXPECT_EQ(MustParse(R"({"event":"eval","stage":0,"seq_len":8,"loss":3,"accuracy":1})"),
            RankEvent(EvalEvent{0, 8, 3.0, 1.0}));
}

TEST(RankEventTest, OtherLinesAreLogLines) {
  for (const char* line : {"", "loading model", "  {\"event\":\"step\"}", "[1, 2]",
                           R"({"level":"info","msg":"hello"})", "{not json at all", "{}", "\r"}) {
    absl::StatusOr<std::optional<RankEvent>> parsed = ParseRankEventLine(line);
    ASSERT_TRUE(parsed.ok()) << line << ": " << parsed.status();
    EXPECT_FALSE(parsed->has_value()) << line;
  }
}

TEST(RankEventTest, RejectsBrokenEventLines) {
  EXPECT_NE(MustReject(R"({"event":"step","stage":0,"st)").find("not a JSON object"),
            std::string::npos);
  EXPECT_NE(
      MustReject(R"({"event":"warp","stage":0})").find("event: \"warp\" is not an event kind"),
      std::string::npos);
  EXPECT_NE(MustReject(R"({"event":7,"stage":0})").find("event: 7 is not a string"),
            std::string::npos);
}

TEST(RankEventTest, RejectsMissingFields) {
  EXPECT_EQ(
      MustReject(R"({"event":"step","stage":0,"steps":4,"loss":1,"tokens_per_s":1,"seq_len":8})"),
      "step.step: missing (a step event needs \"step\": an integer in [1, 4])");
  EXPECT_NE(MustReject(R"({"event":"checkpoint","stage":0,"step":3,"bytes":1,"seconds":0})")
                .find("checkpoint.path: missing"),
            std::string::npos);
  EXPECT_NE(MustReject(R"({"event":"eval","stage":0,"seq_len":8})").find("eval.loss: missing"),
            std::string::npos);
  EXPECT_NE(MustReject(R"({"event":"done"})").find("done.stage: missing"), std::string::npos);
}

TEST(RankEventTest, RejectsUnknownFields) {
  EXPECT_NE(MustReject(R"({"event":"done","stage":0,"stgae":1})").find("done.stgae: unknown field"),
            std::string::npos);
  // accuracy belongs to eval, not step.
  EXPECT_NE(MustReject(R"({"event":"step","stage":0,"step":1,"steps":1,"loss":1,)"
                       R"("tokens_per_s":1,"seq_len":8,"accuracy":0.5})")
                .find("step.accuracy: unknown field"),
            std::string::npos);
}

TEST(RankEventTest, RejectsMistypedFields) {
  EXPECT_EQ(MustReject(R"({"event":"done","stage":"0"})"),
            "done.stage: \"0\" is not an integer (an integer in [0, 2147483647])");
  EXPECT_NE(MustReject(R"({"event":"done","stage":1.5})").find("done.stage: 1.5 is not an integer"),
            std::string::npos);
  // A non-finite loss is serialized as null; it is not a number the protocol accepts.
  EXPECT_EQ(MustReject(R"({"event":"eval","stage":0,"seq_len":8,"loss":null})"),
            "eval.loss: null is not a number (a finite number >= 0)");
  EXPECT_NE(
      MustReject(R"({"event":"checkpoint","stage":0,"step":3,"path":7,"bytes":1,"seconds":0})")
          .find("checkpoint.path: 7 is not a string"),
      std::string::npos);
}

TEST(RankEventTest, RejectsOutOfRangeValues) {
  const std::string step_head = R"({"event":"step","stage":0,)";
  EXPECT_EQ(
      MustReject(step_head + R"("step":21,"steps":20,"loss":1,"tokens_per_s":1,"seq_len":8})"),
      "step.step: 21 is out of range (an integer in [1, 20])");
  EXPECT_NE(MustReject(step_head + R"("step":0,"steps":20,"loss":1,"tokens_per_s":1,"seq_len":8})")
                .find("step.step: 0 is out of range"),
            std::string::npos);
  EXPECT_NE(MustReject(step_head + R"("step":1,"steps":0,"loss":1,"tokens_per_s":1,"seq_len":8})")
                .find("step.steps: 0 is out of range"),
            std::string::npos);
  EXPECT_EQ(
      MustReject(step_head + R"("step":1,"steps":2,"loss":-0.5,"tokens_per_s":1,"seq_len":8})"),
      "step.loss: -0.5 is out of range (a finite number >= 0)");
  // 1e400 overflows a double: the JSON reader refuses the line.
  EXPECT_NE(
      MustReject(step_head + R"("step":1,"steps":2,"loss":1e400,"tokens_per_s":1,"seq_len":8})")
          .find("not a JSON object"),
      std::string::npos);
  EXPECT_NE(MustReject(step_head + R"("step":1,"steps":2,"loss":1,"tokens_per_s":-1,"seq_len":8})")
                .find("step.tokens_per_s: -1 is out of range"),
            std::string::npos);
  EXPECT_NE(MustReject(step_head + R"("step":1,"steps":2,"loss":1,"tokens_per_s":1,"seq_len":0})")
                .find("step.seq_len: 0 is out of range"),
            std::string::npos);
  EXPECT_NE(MustReject(R"({"event":"done","stage":-1})").find("done.stage: -1 is out of range"),
            std::string::npos);
  EXPECT_NE(MustReject(R"({"event":"done","stage":2147483648})").find("done.stage"),
            std::string::npos);
  EXPECT_NE(MustReject(R"({"event":"done","stage":0,"peak_rss_bytes":18446744073709551615})")
                .find("done.peak_rss_bytes: 18446744073709551615 is out of range"),
            std::string::npos);
  EXPECT_EQ(MustReject(R"({"event":"eval","stage":0,"seq_len":8,"loss":1,"accuracy":1.5})"),
            "eval.accuracy: 1.5 is out of range (a finite number in [0, 1])");
  EXPECT_NE(MustReject(R"({"event":"eval","stage":0,"seq_len":8,"loss":1,"step":-1})")
                .find("eval.step: -1 is out of range"),
            std::string::npos);
  const std::string ckpt_head = R"({"event":"checkpoint","stage":0,"step":3,)";
  EXPECT_NE(MustReject(ckpt_head + R"("path":"/ck","bytes":-2,"seconds":0})")
                .find("checkpoint.bytes: -2 is out of range (an integer >= -1)"),
            std::string::npos);
  EXPECT_NE(MustReject(ckpt_head + R"("path":"","bytes":1,"seconds":0})")
                .find("checkpoint.path: \"\" is not a valid path"),
            std::string::npos);
  EXPECT_NE(MustReject(ckpt_head + R"("path":"/ck\nstep","bytes":1,"seconds":0})")
                .find("checkpoint.path"),
            std::string::npos);
  EXPECT_NE(MustReject(ckpt_head + "\"path\":\"/" + std::string(4096, 'a') +
                       R"(","bytes":1,"seconds":0})")
                .find("checkpoint.path"),
            std::string::npos);
  EXPECT_NE(MustReject(ckpt_head + R"("path":"/ck","bytes":1,"seconds":-1})")
                .find("checkpoint.seconds: -1 is out of range"),
            std::string::npos);
  EXPECT_NE(MustReject(ckpt_head + R"("path":"/ck","bytes":1,"seconds":1,"blocked_seconds":-1})")
                .find("checkpoint.blocked_seconds: -1 is out of range"),
            std::string::npos);
}

TEST(RankEventTest, NonFiniteValuesDoNotSurviveTheWire) {
  const std::string line =
      SerializeRankEvent(StepEvent{0, 1, 2, std::numeric_limits<double>::quiet_NaN(), 1.0, 8});
  EXPECT_NE(MustReject(line).find("step.loss: null"), std::string::npos) << line;
}

// The --control stdin line (rank_control.h): round trip, and every broken field named.
TEST(RankControlTest, IntervalLinesRoundTripAndBrokenOnesNameTheField) {
  CheckpointIntervalControl c;
  c.version = 3;
  c.every_steps = 0;
  c.every_seconds = 1234.5;
  c.reason = "auto: every 1234.5 s";
  absl::StatusOr<std::string> line = SerializeRankControl(c);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line,
            "{\"control\":\"checkpoint_interval\",\"version\":3,\"every_steps\":0,"
            "\"every_seconds\":1234.5,\"reason\":\"auto: every 1234.5 s\"}");
  absl::StatusOr<CheckpointIntervalControl> back = ParseRankControlLine(*line + "\r");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == c);
  const std::string ok_tail = R"(,"every_steps":1,"every_seconds":0,"reason":"r"})";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not a JSON object"},
      {R"({"control":"stop","version":1})", "control: \"stop\""},
      {R"({"control":"checkpoint_interval","version":0)" + ok_tail, "version: 0"},
      {R"({"control":"checkpoint_interval","version":16777216)" + ok_tail, "version: 16777216"},
      {R"({"control":"checkpoint_interval","version":1.5)" + ok_tail, "version: 1.5"},
      {R"({"control":"checkpoint_interval","version":1,"every_steps":-1,"every_seconds":0,)"
       R"("reason":"r"})",
       "every_steps: -1"},
      {R"({"control":"checkpoint_interval","version":1,"every_steps":1,"every_seconds":null,)"
       R"("reason":"r"})",
       "every_seconds: null"},
      {R"({"control":"checkpoint_interval","version":1,"every_steps":1,"every_seconds":1e12,)"
       R"("reason":"r"})",
       "every_seconds: 1e+12"},
      {R"({"control":"checkpoint_interval","version":1,"every_steps":1,"every_seconds":0,)"
       R"("reason":"a\nb"})",
       "reason: a control character"},
      {R"({"control":"checkpoint_interval","version":1,"every_steps":1,"every_seconds":0,)"
       R"("reason":"r","extra":1})",
       "extra: unknown field"},
      {R"({"control":"checkpoint_interval","version":1,"every_steps":1,"reason":"r"})",
       "every_seconds: missing"},
  };
  for (const auto& [text, needle] : bad) {
    absl::StatusOr<CheckpointIntervalControl> parsed = ParseRankControlLine(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(std::string(parsed.status().message()).find(needle), std::string::npos)
        << text << " -> " << parsed.status();
  }
  c.version = 0;
  EXPECT_FALSE(SerializeRankControl(c).ok());  // the writer checks too
}

}  // namespace
}  // namespace ulysses::contract
