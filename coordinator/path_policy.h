// Where a job's files may live (docs/SECURITY.md, "Paths"). A spec is text from a
// user; the paths in it are opened by worker processes with the workers' rights, so
// the coordinator confines them before a job is accepted:
//   - data.train, data.validation and model.init_from lie under one of the
//     coordinator's data roots (`data_roots`; none configured = no file paths allowed);
//   - checkpoint.dir, when a spec sets one, lies under the checkpoint root, is not a
//     name the coordinator gives its own per-job directories (`job-...`), and does not
//     overlap (equal, contain or lie inside) another job's checkpoint directory;
//   - a committed checkpoint a worker reports lies inside its job's checkpoint dir.
// "Lies under" is decided on resolved paths: absolute, no "." or ".." components, no
// control characters, no leading/trailing whitespace, no '#' after whitespace, and every
// component that exists on the coordinator resolved, so a link under a root that points
// outside it is outside and a link that cannot be resolved (dangling) is refused.
//
// Pure functions over the file system's current state; thread-safe.
#ifndef ULYSSES_COORDINATOR_PATH_POLICY_H_
#define ULYSSES_COORDINATOR_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/spec/job_spec.h"
#include "common/spec/path_confine.h"

namespace ulysses::coordinator {

// The roots, resolved (ResolvePath) once when the config is validated.
struct PathRoots {
  std::vector<std::string> data_roots;
  std::string checkpoint_root;
};

// ResolvePath, IsWithin, Overlaps: common/spec/path_confine.h (the worker agent uses them too).
using spec::IsWithin;
using spec::Overlaps;
using spec::ResolvePath;

// Checks every path a spec names (data.train, data.validation, model.init_from,
// checkpoint.dir) against `roots`. Errors name the field, the value and the fix.
absl::Status CheckSpecPaths(const spec::JobSpec& spec, const PathRoots& roots);

// The checkpoint directory of a new job `job_id`: the spec's checkpoint.dir resolved,
// or <checkpoint_root>/<job_id>. FailedPrecondition when it overlaps one of `taken`
// (the checkpoint dirs of the jobs the coordinator knows). `taken_by` holds the job id
// of each entry of `taken` the caller may see, "" for another tenant's: the error names
// the other job and its directory only when its id is given.
absl::StatusOr<std::string> JobCheckpointDir(const spec::JobSpec& spec, absl::string_view job_id,
                                             const PathRoots& roots,
                                             absl::Span<const std::string> taken,
                                             absl::Span<const std::string> taken_by);

// OK when a worker's committed checkpoint `path` lies inside `job_checkpoint_dir`
// (lexically: absolute, no "." / ".." components; the coordinator does not open it).
absl::Status CheckCommittedCheckpointPath(absl::string_view field, absl::string_view path,
                                          absl::string_view job_checkpoint_dir);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_PATH_POLICY_H_
