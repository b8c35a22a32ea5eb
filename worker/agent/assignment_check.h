// Defence in depth on the worker: before a rank opens anything, the agent reads the spec
// of an Assignment exactly as the rank will (the document plus its --set overrides) and
// confines its paths against the worker's own roots, resolved on this host
// (common/spec/path_confine.h). The coordinator checked the same paths on its host; a
// link that resolves differently here, a compromised or misconfigured coordinator, or a
// worker mounting other storage is stopped here.
#ifndef ULYSSES_WORKER_AGENT_ASSIGNMENT_CHECK_H_
#define ULYSSES_WORKER_AGENT_ASSIGNMENT_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ulysses/v1/worker_service.pb.h"

namespace ulysses::agent {

// The worker's roots (--checkpoint-root, --data-root). Empty = that check is off.
struct WorkerRoots {
  std::string checkpoint_root;
  std::vector<std::string> data_roots;
};

// OK when no roots are set (the check is opted into with --checkpoint-root/--data-root),
// or when the rank's spec parses, its checkpoint.dir is the Assignment's checkpoint_dir,
// and (where the roots are set) checkpoint.dir lies below checkpoint_root and data.train,
// data.validation and model.init_from below one of data_roots. The error names the
// field, the value and the fix.
absl::Status CheckAssignmentPaths(const v1::Assignment& assignment, const WorkerRoots& roots);

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_ASSIGNMENT_CHECK_H_
