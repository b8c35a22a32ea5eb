// Proto views of the coordinator's records: what GetJob, ListJobs, WatchJob and
// ListWorkers return. Pure functions; thread-compatible.
#ifndef ULYSSES_COORDINATOR_VIEWS_H_
#define ULYSSES_COORDINATOR_VIEWS_H_

#include <cstdint>

#include "coordinator/model.h"
#include "coordinator/runtime.h"
#include "ulysses/v1/types.pb.h"

namespace ulysses::coordinator {

v1::Checkpoint CheckpointToProto(const CheckpointRecord& checkpoint);
v1::Attempt AttemptToProto(const AttemptRecord& attempt);
// `full`: with every attempt (GetJob, WatchJob); ListJobs leaves them out.
v1::Job JobToProto(const JobRecord& job, bool full);
// The heartbeat time is derived from the steady clock (`now_steady_ms`, the clock of
// last_seen_steady) and shown in Unix time relative to `now_unix_ms`.
v1::Worker WorkerToProto(const WorkerRt& worker, int64_t now_steady_ms, int64_t now_unix_ms);

// "checkpoint stage 1 step 40", or where a restart begins without one.
std::string CheckpointText(const JobRecord& job);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_VIEWS_H_
