// Path confinement shared by the coordinator (coordinator/path_policy.h: every path of a
// submitted spec) and the worker agent (worker/agent/assignment_check.h: the same paths
// again, against the worker's own roots, before a rank opens anything).
//
// A path is data: it reaches the engine inside a YAML document the coordinator emits
// (strings quoted as needed), never as text a parser re-interprets. On top of that,
// CheckPathText refuses what a YAML or shell reader could read differently from the
// string the checks saw: control characters, leading or trailing whitespace, and a '#'
// after whitespace (a YAML comment).
//
// Pure functions over the file system's current state; thread-safe.
#ifndef ULYSSES_COMMON_SPEC_PATH_CONFINE_H_
#define ULYSSES_COMMON_SPEC_PATH_CONFINE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ulysses::spec {

// InvalidArgument naming `field`, the value and the fix when `path` is empty, relative,
// has a "." / ".." / empty component, a control character (NUL, newline, tab, ESC,
// DEL, ...), leading or trailing whitespace, or a '#' after whitespace.
absl::Status CheckPathText(absl::string_view field, absl::string_view path);

// `path` (CheckPathText first) as an absolute path with every component that exists
// resolved (symlinks followed) and the rest, which does not exist yet, appended as
// written. A component that exists but cannot be resolved (a dangling symlink, a link
// loop, no permission) is refused: where it points is unknown here, and on another
// host it may point anywhere.
absl::StatusOr<std::string> ResolvePath(absl::string_view field, absl::string_view path);

// True when `path` is `root` or lies below it, component-wise ("/data2" is not
// under "/data"). Both must already be resolved.
bool IsWithin(absl::string_view path, absl::string_view root);

// True when one of the two resolved paths is, or lies within, the other.
bool Overlaps(absl::string_view a, absl::string_view b);

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_PATH_CONFINE_H_
