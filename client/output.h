// Output helpers shared by every ulyssesctl verb: the -o table|json|yaml switch,
// an aligned text table, JobSpec -> JSON, JSON -> YAML. Stateless; safe from
// any thread. The control-plane verbs reuse these for jobs, runs and events.
#ifndef ULYSSES_CLIENT_OUTPUT_H_
#define ULYSSES_CLIENT_OUTPUT_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "nlohmann/json.hpp"

namespace ulysses::client {

enum class OutputFormat { kTable, kJson, kYaml };

// "table" | "json" | "yaml"; "" gives `fallback` (each verb has its own default).
absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& text, OutputFormat fallback);

// Left-aligned columns separated by two spaces, upper-case headers.
class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void Print(std::ostream& out) const;
  // [{header: cell, ...}, ...] with numeric-looking cells as numbers.
  nlohmann::ordered_json ToJson() const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// The JobSpec as JSON with the YAML document's shape and key names.
nlohmann::ordered_json JobSpecToJson(const spec::JobSpec& spec);

// Block-style YAML for any JSON value (objects keep their key order).
std::string JsonToYaml(const nlohmann::ordered_json& value);

// "512 B", "1.5 KiB", "3.2 GiB".
std::string FormatBytes(double bytes);
// "%g": "0.001", "3e-05", "1024".
std::string FormatNumber(double value);
// "1.2e+09"-free grouping for big counts: "134217728" -> "134.2M".
std::string FormatCount(double count);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_OUTPUT_H_
