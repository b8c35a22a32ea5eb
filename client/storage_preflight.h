// Storage preflight (`ulyssesctl preflight storage`, docs/DEPLOY.md "Storage that keeps up"):
// measures a directory's write bandwidth with the checkpoint's write pattern (one file per
// rank written at once in 8 MiB chunks, O_DIRECT where the file system takes it, fsync at the
// end: worker/engine/checkpoint/shard_writer.cc) and turns a bandwidth, measured or stated, into
// each stage's save time against the preemption grace.
#ifndef ULYSSES_CLIENT_STORAGE_PREFLIGHT_H_
#define ULYSSES_CLIENT_STORAGE_PREFLIGHT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/plan.h"

namespace ulysses::client {

struct StorageProbeOptions {
  std::string dir;         // Where the probe files go (a directory on the shared volume).
  int writers = 8;         // Concurrent files: the ranks of one node.
  double bytes = 1 << 30;  // Written in all, split over the writers.
  // Paces the writers to this many bytes/s in all (0 = as fast as the volume takes them): a
  // rate-limited writer, to see what a slower volume would mean.
  double limit_bytes_per_s = 0;
};

struct StorageProbeResult {
  double bytes = 0;        // Written and fsynced.
  double seconds = 0;      // From the first write to the last fsync.
  double bytes_per_s = 0;  // bytes / seconds.
  int writers = 0;
  bool direct = false;  // The files were opened with O_DIRECT.
};

// Writes the probe files under a fresh subdirectory of options.dir and removes them. Errors
// name the directory, the errno text and the fix.
absl::StatusOr<StorageProbeResult> ProbeStorage(const StorageProbeOptions& options);

// One stage's checkpoint save against the grace.
struct StageSave {
  double checkpoint_bytes = 0;  // Every rank's share: snapshot_host_bytes x world.
  double save_seconds = 0;      // checkpoint_bytes / bandwidth.
  double step_seconds = 0;      // The planned step (a preemption waits for the running one).
  bool fits = false;            // step + save <= grace.
};
std::vector<StageSave> SaveEstimates(const std::vector<StagePlan>& plans, double bytes_per_s,
                                     double grace_s);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_STORAGE_PREFLIGHT_H_
