// The TrainJob schema and scalar conversions, shared by the parser's units
// (job_spec_parser.cc reads documents and applies --set overrides along it). Internal to
// common/spec.
#ifndef ULYSSES_COMMON_SPEC_JOB_SPEC_SCHEMA_H_
#define ULYSSES_COMMON_SPEC_JOB_SPEC_SCHEMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_spec_parser.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::spec::internal::schema {

// Every known path, derived from the field list (job_spec_fields.h). "[]" stands for any list
// index, "*" for any key of a free-form string map (labels). Order is the order of "valid keys"
// hints (document order).
enum class Kind { kMap, kList, kScalar, kStringMap };

struct SchemaEntry {
  std::string path;
  Kind kind;
};

const std::vector<SchemaEntry>& Schema();
// The entry of `schema_path`, or null.
const SchemaEntry* FindSchema(const std::string& schema_path);
std::string JoinPath(const std::string& parent, const std::string& key);
// Keys directly under the map at `schema_path`.
std::vector<std::string> ChildKeys(const std::string& schema_path);

// The reader alone: YAML -> JobSpec along the schema with options.overrides applied, without
// ValidateJobSpec (ParseJobSpec = this + validation; tests of the field list).
absl::StatusOr<JobSpec> ReadJobSpec(absl::string_view yaml_text, const ParseOptions& options);

// "'ten'", "a list", "a mapping", "an empty value".
std::string Describe(const YAML::Node& node);
// Whole-string conversions (no leading space, no trailing text, in range, finite).
bool ParseInt64(const std::string& text, int64_t* out);
bool ParseUint64(const std::string& text, uint64_t* out);
bool ParseDouble(const std::string& text, double* out);
// true/yes/on, false/no/off (any case).
bool ParseBool(const std::string& text, bool* out);

}  // namespace ulysses::spec::internal::schema

#endif  // ULYSSES_COMMON_SPEC_JOB_SPEC_SCHEMA_H_
