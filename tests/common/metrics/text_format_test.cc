#include "common/metrics/text_format.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace ulysses {
namespace metrics {
namespace {

TEST(FormatValueTest, IntegersHaveNoExponentOrFraction) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-12), "-12");
  EXPECT_EQ(FormatValue(1e6), "1000000");
  EXPECT_EQ(FormatValue(123456789012.0), "123456789012");
  EXPECT_EQ(FormatValue(9007199254740991.0), "9007199254740991");  // 2^53 - 1
}

TEST(FormatValueTest, FractionsUseShortestRoundTrip) {
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(2.5), "2.5");
  EXPECT_EQ(FormatValue(-0.005), "-0.005");
  EXPECT_EQ(FormatValue(1e-6), "1e-06");
  EXPECT_EQ(FormatValue(1.5e300), "1.5e+300");
  EXPECT_EQ(FormatValue(1e20), "1e+20");  // Beyond 2^53: exponent form is exact enough.
  const double third = 1.0 / 3.0;
  EXPECT_EQ(std::strtod(FormatValue(third).c_str(), nullptr), third);
}

TEST(FormatValueTest, SpecialValuesAreSpelledAsPrometheusExpects) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(EscapeTest, HelpEscapesBackslashAndNewlineOnly) {
  EXPECT_EQ(EscapeHelp("a\\b\nc \"q\""), "a\\\\b\\nc \"q\"");
}

TEST(EscapeTest, LabelValuesEscapeBackslashQuoteNewline) {
  EXPECT_EQ(EscapeLabelValue("C:\\dir \"x\"\nnext"), "C:\\\\dir \\\"x\\\"\\nnext");
  EXPECT_EQ(EscapeLabelValue("plain-value_1"), "plain-value_1");
  EXPECT_EQ(EscapeLabelValue("ünïcödé"), "ünïcödé");
}

TEST(WriteTextFormatTest, ExactOutputWithSortingAndLabels) {
  FamilySnapshot gauge{"ulysses_queue_length",
                       "Jobs waiting.\nSecond line",
                       MetricType::kGauge,
                       {Sample{"", {}, 4}}};
  FamilySnapshot counter{"ulysses_job_restarts_total",
                         "Restarts \\ by reason.",
                         MetricType::kCounter,
                         {Sample{"", {{"reason", "worker_lost"}, {"job_id", "a\"b"}}, 2},
                          Sample{"", {{"reason", "oom"}, {"job_id", "x"}}, 0.5}}};
  const std::string body = WriteTextFormat({gauge, counter});
  EXPECT_EQ(body,
            "# HELP ulysses_job_restarts_total Restarts \\\\ by reason.\n"
            "# TYPE ulysses_job_restarts_total counter\n"
            "ulysses_job_restarts_total{reason=\"worker_lost\",job_id=\"a\\\"b\"} 2\n"
            "ulysses_job_restarts_total{reason=\"oom\",job_id=\"x\"} 0.5\n"
            "# HELP ulysses_queue_length Jobs waiting.\\nSecond line\n"
            "# TYPE ulysses_queue_length gauge\n"
            "ulysses_queue_length 4\n");
}

TEST(WriteTextFormatTest, EmptyFamilyStillDeclaresHelpAndType) {
  FamilySnapshot empty{"ulysses_workers", "Workers.", MetricType::kGauge, {}};
  EXPECT_EQ(WriteTextFormat({empty}),
            "# HELP ulysses_workers Workers.\n# TYPE ulysses_workers gauge\n");
}

TEST(MetricTypeNameTest, Spellings) {
  EXPECT_EQ(MetricTypeName(MetricType::kCounter), "counter");
  EXPECT_EQ(MetricTypeName(MetricType::kGauge), "gauge");
  EXPECT_EQ(MetricTypeName(MetricType::kHistogram), "histogram");
}

}  // namespace
}  // namespace metrics
}  // namespace ulysses
