#include "client/output.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_parser.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::client {

absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& text, OutputFormat fallback) {
  if (text.empty()) {
    return fallback;
  }
  if (text == "table") {
    return OutputFormat::kTable;
  }
  if (text == "json") {
    return OutputFormat::kJson;
  }
  if (text == "yaml") {
    return OutputFormat::kYaml;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("-o: '", text, "' is not an output format (use table, json or yaml)"));
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> widths(headers_.size(), 0);
  for (size_t c = 0; c < headers_.size(); ++c) {
    widths[c] = headers_[c].size();
  }
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  auto print_row = [&](const std::vector<std::string>& cells, bool upper) {
    std::string line;
    for (size_t c = 0; c < widths.size(); ++c) {
      std::string cell = c < cells.size() ? cells[c] : "";
      if (upper) {
        cell = absl::AsciiStrToUpper(cell);
      }
      line += cell;
      if (c + 1 < widths.size()) {
        line += std::string(widths[c] - cell.size() + 2, ' ');
      }
    }
    out << line << "\n";
  };
  print_row(headers_, true);
  for (const auto& row : rows_) {
    print_row(row, false);
  }
}

nlohmann::ordered_json Table::ToJson() const {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& row : rows_) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (size_t c = 0; c < headers_.size() && c < row.size(); ++c) {
      const std::string& cell = row[c];
      char* end = nullptr;
      const double number = std::strtod(cell.c_str(), &end);
      if (!cell.empty() && end == cell.c_str() + cell.size()) {
        const int64_t whole = std::strtoll(cell.c_str(), &end, 10);
        if (end == cell.c_str() + cell.size()) {
          object[headers_[c]] = whole;
        } else {
          object[headers_[c]] = number;
        }
      } else {
        object[headers_[c]] = cell;
      }
    }
    rows.push_back(std::move(object));
  }
  return rows;
}

nlohmann::ordered_json JobSpecToJson(const spec::JobSpec& s) { return spec::ToJson(s); }

namespace {

void EmitJson(YAML::Emitter& out, const nlohmann::ordered_json& value) {
  if (value.is_object()) {
    out << YAML::BeginMap;
    for (auto it = value.begin(); it != value.end(); ++it) {
      out << YAML::Key << it.key() << YAML::Value;
      EmitJson(out, it.value());
    }
    out << YAML::EndMap;
  } else if (value.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& item : value) {
      EmitJson(out, item);
    }
    out << YAML::EndSeq;
  } else if (value.is_string()) {
    out << value.get<std::string>();
  } else if (value.is_null()) {
    out << YAML::Null;
  } else {
    out << value.dump();  // numbers and booleans: JSON text is valid YAML.
  }
}

}  // namespace

std::string JsonToYaml(const nlohmann::ordered_json& value) {
  YAML::Emitter out;
  EmitJson(out, value);
  return std::string(out.c_str()) + "\n";
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return buf;
}

std::string FormatNumber(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

std::string FormatCount(double count) {
  const char* suffixes[] = {"", "K", "M", "G", "T"};
  int s = 0;
  while (count >= 1000 && s < 4) {
    count /= 1000;
    ++s;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), s == 0 ? "%.0f%s" : "%.1f%s", count, suffixes[s]);
  return buf;
}

}  // namespace ulysses::client
