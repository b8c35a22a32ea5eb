// VerifyFinalCheckpoint: before a job is SUCCEEDED, its result must be on disk. A worker's
// report is a claim; this reads what rank 0 committed (the engine's format,
// worker/engine/checkpoint/checkpoint.h) without libtorch: <path>/manifest.json is a
// ulysses-checkpoint manifest of the job's final stage and last step, naming this job when it
// names an owner, and every shard file it lists exists with its recorded size.
#ifndef ULYSSES_COORDINATOR_CHECKPOINT_VERIFY_H_
#define ULYSSES_COORDINATOR_CHECKPOINT_VERIFY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ulysses::coordinator {

// Manifests above this are refused unread (a real one lists every tensor: ~100 B each).
inline constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;

struct ExpectedCheckpoint {
  std::string path;    // The step directory rank 0 reported.
  std::string tenant;  // The job's tenant and id (the manifest's "owner").
  std::string job_id;
  int stage = 0;  // The final stage's index and its last step.
  int64_t step = 0;
};

// OK, or FailedPrecondition saying what is missing or wrong (shown in the attempt's reason).
absl::Status VerifyFinalCheckpoint(const ExpectedCheckpoint& expected);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_CHECKPOINT_VERIFY_H_
