// Parsing, defaulting and validation of TrainJob documents.
//
// All errors are absl::InvalidArgumentError whose message is one or more lines
// of the form `<field path>: <value> <problem> (<fix>)`, e.g.
//   spec.stages[2].seq_len: 100001 is not divisible by sp_degree 8 (try 98304 or 106496)
// Unknown keys are errors with a did-you-mean. Nothing here touches the filesystem
// except LoadJobSpecFile (and the optional data-file existence check).
#ifndef ULYSSES_COMMON_SPEC_JOB_SPEC_PARSER_H_
#define ULYSSES_COMMON_SPEC_JOB_SPEC_PARSER_H_

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/spec/job_spec.h"

namespace ulysses::spec {

struct ParseOptions {
  // Check that data files exist and hold at least one sequence of the first stage.
  bool check_files = false;
  // Overrides applied before validation: "spec.path.to.field=value" (YAML scalar value),
  // e.g. "spec.stages[0].steps=5" or "spec.parallelism.sp_degree=4".
  std::vector<std::string> overrides;
};

// Parses, applies overrides, fills defaults (presets), validates.
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view yaml_text, const ParseOptions& options = {});
absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path, const ParseOptions& options = {});

// Validates an already-built spec (ParseJobSpec calls this). Collects every error.
absl::Status ValidateJobSpec(const JobSpec& spec);

// Canonical YAML of a (defaulted) spec; ParseJobSpec(ToYaml(s)) == s.
std::string ToYaml(const JobSpec& spec);
// The same document as JSON (numbers as numbers; `ulyssesctl validate -o json`).
nlohmann::ordered_json ToJson(const JobSpec& spec);
// One section as JSON with every field, defaults included (optional parts only when set):
// the data and eval parts of `ulyssesctl get job -o json`.
nlohmann::ordered_json AllFieldsJson(const DataSpec& data);
nlohmann::ordered_json AllFieldsJson(const EvalSpec& eval);

// Stable hash of the canonical YAML of the training-relevant fields (model, data,
// optimizer, seed), hex. Stored in checkpoints to detect foreign resumes.
std::string SpecHash(const JobSpec& spec);

// ApplyModelPreset (presets) is in model_shape.h.

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_JOB_SPEC_PARSER_H_
