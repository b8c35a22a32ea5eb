#include "coordinator/engine_spec.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"

namespace ulysses::coordinator {

absl::StatusOr<std::string> EngineSpecYaml(const std::string& spec_yaml,
                                           const std::string& checkpoint_dir) {
  absl::StatusOr<spec::JobSpec> parsed = spec::ParseJobSpec(spec_yaml);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job's stored spec does not parse: ", parsed.status().message()));
  }
  parsed->checkpoint.dir = checkpoint_dir;
  std::string out = spec::ToYaml(*parsed);
  // The round trip: what the engine will read back is what was checked.
  absl::StatusOr<spec::JobSpec> back = spec::ParseJobSpec(out);
  if (!back.ok() || back->checkpoint.dir != checkpoint_dir || spec::ToYaml(*back) != out) {
    return absl::InternalError(absl::StrCat(
        spec::fields::PathOf(&spec::CheckpointSpec::dir), ": \"", absl::CEscape(checkpoint_dir),
        "\" does not survive the spec document a rank reads (it reads back as \"",
        back.ok() ? absl::CEscape(back->checkpoint.dir) : std::string(back.status().message()),
        "\"; rename the directory)"));
  }
  return out;
}

}  // namespace ulysses::coordinator
