#include "common/contract/rank_control.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ulysses::contract {
namespace {

using ordered_json = nlohmann::ordered_json;

absl::Status Bad(const std::string& field, const std::string& value, const std::string& rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint_interval.", field, ": ", value, " (", rule, ")"));
}

absl::Status Check(const CheckpointIntervalControl& c) {
  if (c.version < 1 || c.version > kMaxControlVersion) {
    return Bad("version", absl::StrCat(c.version), absl::StrCat("must be 1..", kMaxControlVersion));
  }
  if (c.every_steps < 0 || c.every_steps > 2147483647) {
    return Bad("every_steps", absl::StrCat(c.every_steps), "must be 0..2147483647");
  }
  if (!std::isfinite(c.every_seconds) || c.every_seconds < 0 ||
      c.every_seconds > kMaxCheckpointIntervalSeconds) {
    return Bad("every_seconds", absl::StrCat(c.every_seconds),
               "must be a finite number in 0..315360000");
  }
  if (c.reason.size() > kMaxControlReasonBytes) {
    return Bad("reason", absl::StrCat(c.reason.size(), " bytes"), "must be <= 1024 bytes");
  }
  for (unsigned char ch : c.reason) {
    if (ch < 0x20 || ch == 0x7f) return Bad("reason", "a control character", "must be printable");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SerializeRankControl(const CheckpointIntervalControl& c) {
  if (absl::Status s = Check(c); !s.ok()) return s;
  ordered_json j{{"control", CheckpointIntervalControl::kKind},
                 {"version", c.version},
                 {"every_steps", c.every_steps},
                 {"every_seconds", c.every_seconds},
                 {"reason", c.reason}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<CheckpointIntervalControl> ParseRankControlLine(absl::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("control line: not a JSON object");
  }
  if (!j.contains("control") || !j["control"].is_string() ||
      j["control"].get<std::string>() != CheckpointIntervalControl::kKind) {
    return absl::InvalidArgumentError(
        absl::StrCat("control: ", j.contains("control") ? j["control"].dump() : "missing",
                     " (the only kind is \"checkpoint_interval\")"));
  }
  static const std::set<std::string> kFields = {"control", "version", "every_steps",
                                                "every_seconds", "reason"};
  for (const auto& [key, value] : j.items()) {
    if (kFields.count(key) == 0) return Bad(key, "unknown field", "no other fields");
  }
  CheckpointIntervalControl c;
  for (const char* key : {"version", "every_steps"}) {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return Bad(key, j.contains(key) ? j[key].dump() : "missing", "an integer");
    }
  }
  if (!j.contains("every_seconds") || !j["every_seconds"].is_number()) {
    return Bad("every_seconds", j.contains("every_seconds") ? j["every_seconds"].dump() : "missing",
               "a number");
  }
  if (!j.contains("reason") || !j["reason"].is_string()) {
    return Bad("reason", j.contains("reason") ? j["reason"].dump() : "missing", "a string");
  }
  c.version = j["version"].get<int64_t>();
  c.every_steps = j["every_steps"].get<int64_t>();
  c.every_seconds = j["every_seconds"].get<double>();
  c.reason = j["reason"].get<std::string>();
  if (absl::Status s = Check(c); !s.ok()) return s;
  return c;
}

bool operator==(const CheckpointIntervalControl& a, const CheckpointIntervalControl& b) {
  return a.version == b.version && a.every_steps == b.every_steps &&
         a.every_seconds == b.every_seconds && a.reason == b.reason;
}

}  // namespace ulysses::contract
