// Proto views of the coordinator's records: what GetJob, ListJobs, WatchJob and
// ListWorkers return. Pure functions; thread-compatible.
#ifndef ULYSSES_COORDINATOR_VIEWS_H_
#define ULYSSES_COORDINATOR_VIEWS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/model.h"
#include "coordinator/runtime.h"
#include "ulysses/v1/types.pb.h"

namespace ulysses::coordinator {

// Response size bounds (the gRPC message limit is 4 MiB): a Job shows its newest
// attempts within kMaxAttemptsViewBytes (always the newest one), GetJob its newest
// events within kMaxEventsViewBytes, and a ListJobs/ListWorkers page holds items while it
// stays within kMaxPageBytes (always at least one).
inline constexpr size_t kMaxAttemptsViewBytes = 1 << 20;
inline constexpr size_t kMaxEventsViewBytes = 1 << 20;
inline constexpr size_t kMaxPageBytes = 3 << 20;

v1::Checkpoint CheckpointToProto(const CheckpointRecord& checkpoint);
// `sp`: the SP group size of the attempt's stage (for the placement warnings).
v1::Attempt AttemptToProto(const AttemptRecord& attempt, int sp);
// Why a placement is worse than it could be: each SP group (ranks g*sp .. g*sp+sp-1) whose
// ranks are on more than one node label, so its all-to-all crosses the network.
std::vector<std::string> PlacementWarnings(const AttemptRecord& attempt, int sp);
// `full`: with the attempts (GetJob, WatchJob: the newest within kMaxAttemptsViewBytes);
// ListJobs leaves them out.
v1::Job JobToProto(const JobRecord& job, bool full);
// The heartbeat time is derived from the steady clock (`now_steady_ms`, the clock of
// last_seen_steady) and shown in Unix time relative to `now_unix_ms`.
v1::Worker WorkerToProto(const WorkerRt& worker, int64_t now_steady_ms, int64_t now_unix_ms);

// "checkpoint stage 1 step 40", or where a restart begins without one.
std::string CheckpointText(const JobRecord& job);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_VIEWS_H_
