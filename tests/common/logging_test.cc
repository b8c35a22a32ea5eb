#include "common/logging.h"

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

}  // namespace
}  // namespace ulysses
