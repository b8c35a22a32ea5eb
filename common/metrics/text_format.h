// Prometheus text exposition format 0.0.4: value formatting, escaping, and the
// writer that turns family snapshots into a scrape body.
//
// This layer does no validation: it prints what it is given. Registry (metrics.h)
// validates names at registration, so everything it collects is well formed; the
// raw writer is public so tests (and tools) can format arbitrary families, e.g. to
// prove that promtool rejects a badly named one. Functions here are pure and
// thread-safe.
#ifndef ULYSSES_COMMON_METRICS_TEXT_FORMAT_H_
#define ULYSSES_COMMON_METRICS_TEXT_FORMAT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace ulysses {
namespace metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge", "histogram" (the # TYPE spelling).
absl::string_view MetricTypeName(MetricType type);

// One exposition line: <family name><suffix>{labels} value.
struct Sample {
  std::string suffix;  // "" or "_bucket", "_sum", "_count" for histograms.
  // (label name, label value) in exposition order; `le` last for buckets.
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

// Everything one family contributes to a scrape, already in output order.
struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<Sample> samples;
};

// Content-Type of a scrape response in this format.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Formats a sample value the way Prometheus parses and prints it: integral values
// up to 2^53 without exponent or fraction ("3", "-12", "1000000"), others in the
// shortest form that round-trips ("0.25", "1e-06", "1.5e+300"), and "+Inf", "-Inf",
// "NaN". Also used for histogram `le` bounds.
std::string FormatValue(double value);

// HELP text: `\` -> `\\`, newline -> `\n`.
std::string EscapeHelp(absl::string_view help);
// Label values: `\` -> `\\`, `"` -> `\"`, newline -> `\n`.
std::string EscapeLabelValue(absl::string_view value);

// Appends "# HELP", "# TYPE" and every sample line of `family` to `out`.
void AppendFamily(const FamilySnapshot& family, std::string* out);

// The whole body: families sorted by name (stable for equal names), each via
// AppendFamily. Families with no samples still get their HELP/TYPE lines.
std::string WriteTextFormat(std::vector<FamilySnapshot> families);

}  // namespace metrics
}  // namespace ulysses

#endif  // ULYSSES_COMMON_METRICS_TEXT_FORMAT_H_
