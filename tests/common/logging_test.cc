#include "common/logging.h"

#include "common/log_format.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ulysses {
namespace {

TEST(LoggingTest, ParsesLevels) {
  EXPECT_EQ(*ParseLogLevel("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWarning);
  auto bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'loud'"), std::string::npos);
}

TEST(LoggingTest, SinkSeesEnabledLinesOnly) {
  std::vector<std::string> lines;
  SetLogSink([&](LogLevel, const std::string& line) { lines.push_back(line); });
  SetLogLevel(LogLevel::kWarning);
  ULOG(INFO) << "hidden";
  ULOG(WARNING) << "shown " << 42;
  SetLogSink(nullptr);
  SetLogLevel(LogLevel::kInfo);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("shown 42"), std::string::npos);
  EXPECT_NE(lines[0].find(" W "), std::string::npos);
  EXPECT_NE(lines[0].find("logging_test.cc:"), std::string::npos);
  // ISO-8601 UTC timestamp first: YYYY-MM-DDTHH:MM:SS.mmmZ
  EXPECT_EQ(lines[0][4], '-');
  EXPECT_EQ(lines[0][10], 'T');
  EXPECT_EQ(lines[0][23], 'Z');
}

// --log-format json: one JSON object per line on stderr, the message escaped; the sink still
// gets the text line.
TEST(LoggingTest, JsonFormatWritesOneEscapedObjectPerLine) {
  std::vector<std::string> sunk;
  SetLogSink([&](LogLevel, const std::string& line) { sunk.push_back(line); });
  ASSERT_TRUE(SetLogFormatFromFlag("--log-format", "json").ok());
  ::testing::internal::CaptureStderr();
  ULOG(WARNING) << "say \"hi\"\n\tnext \\ " << 7;
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(SetLogFormatFromFlag("--log-format", "text").ok());
  SetLogSink(nullptr);
  ASSERT_FALSE(err.empty());
  EXPECT_EQ(err.find('\n'), err.size() - 1) << err;  // One line.
  EXPECT_EQ(err.rfind("{\"time\":\"20", 0), 0u) << err;
  EXPECT_NE(err.find("\",\"level\":\"warning\",\"pid\":"), std::string::npos) << err;
  EXPECT_NE(err.find("\"source\":\"logging_test.cc:"), std::string::npos) << err;
  EXPECT_NE(err.find("\"msg\":\"say \\\"hi\\\"\\n\\tnext \\\\ 7\"}"), std::string::npos) << err;
  ASSERT_EQ(sunk.size(), 1u);
  EXPECT_EQ(sunk[0].front(), '2') << "the sink gets the text line";
  absl::Status bad = SetLogFormatFromFlag("--log-format", "xml");
  EXPECT_EQ(bad.message(), "--log-format: \"xml\" is not a log format (use text or json)");
  EXPECT_EQ(TextLogLineToJson("no prefix"), "{\"msg\":\"no prefix\"}");
}

}  // namespace
}  // namespace ulysses
