#include "worker/agent/assignment_check.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/path_confine.h"

namespace ulysses::agent {
namespace {

absl::Status Confine(const std::string& field, const std::string& value,
                     const std::vector<std::string>& roots, bool strictly_below) {
  if (value.empty() || roots.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> resolved = spec::ResolvePath(field, value);
  if (!resolved.ok()) return resolved.status();
  for (const std::string& root : roots) {
    absl::StatusOr<std::string> r = spec::ResolvePath("root", root);
    if (r.ok() && spec::IsWithin(*resolved, *r) && !(strictly_below && *resolved == *r)) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": \"", absl::CEscape(value), "\"",
      *resolved == value ? "" : absl::StrCat(" (resolves to \"", *resolved, "\" here)"),
      " is outside this worker's roots [", absl::StrJoin(roots, ", "),
      "] (the worker refuses it before the rank starts; check --checkpoint-root / --data-root "
      "of the worker and the coordinator)"));
}

}  // namespace

absl::Status CheckAssignmentPaths(const v1::Assignment& a, const WorkerRoots& roots) {
  if (roots.checkpoint_root.empty() && roots.data_roots.empty()) return absl::OkStatus();
  spec::ParseOptions options;
  options.overrides.assign(a.overrides().begin(), a.overrides().end());
  absl::StatusOr<spec::JobSpec> parsed = spec::ParseJobSpec(a.spec_yaml(), options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the assignment's spec does not parse: ", parsed.status().message()));
  }
  const spec::JobSpec& s = *parsed;
  if (!a.checkpoint_dir().empty() && s.checkpoint.dir != a.checkpoint_dir()) {
    return absl::PermissionDeniedError(absl::StrCat(
        spec::fields::PathOf(&spec::CheckpointSpec::dir), ": the rank would read \"",
        absl::CEscape(s.checkpoint.dir), "\" but the job's checkpoint directory is \"",
        absl::CEscape(a.checkpoint_dir()),
        "\" (the worker refuses a spec whose directory differs from the assigned one)"));
  }
  std::vector<std::string> checkpoint_roots;
  if (!roots.checkpoint_root.empty()) checkpoint_roots.push_back(roots.checkpoint_root);
  if (absl::Status st = Confine(spec::fields::PathOf(&spec::CheckpointSpec::dir), s.checkpoint.dir,
                                checkpoint_roots, true);
      !st.ok()) {
    return st;
  }
  for (const auto& [field, value] :
       {std::pair<std::string, std::string>{spec::fields::PathOf(&spec::DataSpec::train),
                                            s.data.train},
        {spec::fields::PathOf(&spec::DataSpec::validation), s.data.validation},
        {spec::fields::PathOf(&spec::ModelSpec::init_from), s.model.init_from}}) {
    if (absl::Status st = Confine(field, value, roots.data_roots, false); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace ulysses::agent
