// Where a job's files may live (docs/SECURITY.md, "Paths"). A spec is text from a
// user; the paths in it are opened by worker processes with the workers' rights, so
// the coordinator confines them before a job is accepted:
//   - data.train, data.validation and model.init_from lie under one of the
//     coordinator's data roots (`data_roots`; none configured = no file paths allowed);
//   - checkpoint.dir, when a spec sets one, lies under the checkpoint root, is not a
//     name the coordinator gives its own per-job directories (`job-...`), and does not
//     overlap (equal, contain or lie inside) a running job's checkpoint directory, nor a
//     directory another tenant's job was given (deleted jobs' too), nor one of the same
//     tenant's without checkpoint.adopt: true; a directory no job was given must be empty
//     (CheckCheckpointDirClaims);
//   - a committed checkpoint a worker reports lies inside its job's checkpoint dir.
// "Lies under" is decided on resolved paths: absolute, no "." or ".." components, no
// control characters, no leading/trailing whitespace, no '#' after whitespace, and every
// component that exists on the coordinator resolved, so a link under a root that points
// outside it is outside and a link that cannot be resolved (dangling) is refused.
//
// Pure functions over the file system's current state; thread-safe.
#ifndef ULYSSES_COORDINATOR_PATH_POLICY_H_
#define ULYSSES_COORDINATOR_PATH_POLICY_H_

#include <cstdint>
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

// A checkpoint directory a job was given, as the store remembers it after the job is gone.
struct DirClaim {
  std::string path;
  std::string tenant;
  std::string job_id;
};

// Whether tenant `tenant`'s new job may use checkpoint directory `dir` (resolved), given every
// directory jobs were given (`claims`, deleted jobs' included):
//   - one that overlaps another tenant's claim: refused (its checkpoints are still there);
//   - one that overlaps a claim of the same tenant: only with checkpoint.adopt: true;
//   - one no claim overlaps: only when it does not exist or is an empty directory.
// FailedPrecondition naming the field, the directory and the fix; another tenant's job is never
// named.
absl::Status CheckCheckpointDirClaims(absl::string_view dir, absl::string_view tenant, bool adopt,
                                      absl::Span<const DirClaim> claims);

// The highest N of the `job-N` entries directly under `checkpoint_root` (0 when none or the
// root cannot be read): the coordinator's ids stay above it (a restored store never reissues
// an id whose default directory is still on disk).
int64_t HighestJobNumberUnder(const std::string& checkpoint_root);

// OK when a worker's committed checkpoint `path` lies inside `job_checkpoint_dir`
// (lexically: absolute, no "." / ".." components; the coordinator does not open it).
absl::Status CheckCommittedCheckpointPath(absl::string_view field, absl::string_view path,
                                          absl::string_view job_checkpoint_dir);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_PATH_POLICY_H_
