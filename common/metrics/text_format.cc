#include "common/metrics/text_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ulysses {
namespace metrics {
namespace {

// 2^53: every integer with smaller magnitude is exactly representable.
constexpr double kMaxExactInteger = 9007199254740992.0;

void AppendEscaped(absl::string_view text, bool escape_quotes, std::string* out) {
  for (char c : text) {
    switch (c) {
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '"':
        if (escape_quotes) {
          out->append("\\\"");
        } else {
          out->push_back(c);
        }
        break;
      default:
        out->push_back(c);
    }
  }
}

}  // namespace

absl::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string FormatValue(double value) {
  if (std::isnan(value)) {
    return "NaN";
  }
  if (std::isinf(value)) {
    return value > 0 ? "+Inf" : "-Inf";
  }
  if (value == 0) {
    return "0";  // Also folds -0.
  }
  if (value == std::trunc(value) && std::fabs(value) < kMaxExactInteger) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(value));
    return buf;
  }
  // Shortest %g form that parses back to the same double (at most 17 digits).
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) {
      break;
    }
  }
  return buf;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  AppendEscaped(help, /*escape_quotes=*/false, &out);
  return out;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  AppendEscaped(value, /*escape_quotes=*/true, &out);
  return out;
}

void AppendFamily(const FamilySnapshot& family, std::string* out) {
  absl::StrAppend(out, "# HELP ", family.name, " ");
  AppendEscaped(family.help, /*escape_quotes=*/false, out);
  absl::StrAppend(out, "\n# TYPE ", family.name, " ", MetricTypeName(family.type), "\n");
  for (const Sample& sample : family.samples) {
    absl::StrAppend(out, family.name, sample.suffix);
    if (!sample.labels.empty()) {
      out->push_back('{');
      bool first = true;
      for (const auto& [name, value] : sample.labels) {
        if (!first) {
          out->push_back(',');
        }
        first = false;
        absl::StrAppend(out, name, "=\"");
        AppendEscaped(value, /*escape_quotes=*/true, out);
        out->push_back('"');
      }
      out->push_back('}');
    }
    absl::StrAppend(out, " ", FormatValue(sample.value), "\n");
  }
}

std::string WriteTextFormat(std::vector<FamilySnapshot> families) {
  std::stable_sort(
      families.begin(), families.end(),
      [](const FamilySnapshot& a, const FamilySnapshot& b) { return a.name < b.name; });
  std::string out;
  for (const FamilySnapshot& family : families) {
    AppendFamily(family, &out);
  }
  return out;
}

}  // namespace metrics
}  // namespace ulysses
