// The messages the worker agent sends up its session, built from what its ranks report
// (common/contract/rank_event.h events -> ulysses.v1 protos) and the small helpers the session
// uses to match reports with work. Pure functions, thread-compatible.
#ifndef ULYSSES_WORKER_AGENT_AGENT_MESSAGES_H_
#define ULYSSES_WORKER_AGENT_AGENT_MESSAGES_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/contract/rank_event.h"
#include "google/protobuf/timestamp.pb.h"
#include "ulysses/v1/worker_service.pb.h"
#include "worker/agent/worker_metrics.h"

namespace ulysses::agent {

// Sets `ts` to the wall-clock time now.
void SetNow(google::protobuf::Timestamp* ts);
// Reports the coordinator must ack (resent on the next session until then).
bool NeedsAck(const ::ulysses::v1::WorkerMessage& msg);
// The same job, generation and stage (ranks aside).
bool SameWork(const ::ulysses::v1::WorkRef& a, const ::ulysses::v1::WorkRef& b);
// "<job> gen <generation> stage <stage> rank <rank>" for logs.
std::string RefString(const ::ulysses::v1::WorkRef& ref);
::ulysses::v1::StepProgress ToProto(const contract::StepEvent& e);
::ulysses::v1::Checkpoint ToProto(const contract::CheckpointEvent& e);
::ulysses::v1::EvalResult ToProto(const contract::EvalEvent& e);
// The coordinator's checkpoint interval as a `--control stdin` line for a rank
// (common/contract/rank_control.h, without the newline); the contract's checks (version,
// finite and in-range values, reason) are this message's validation: an error names the field.
absl::StatusOr<std::string> IntervalControlLine(const ::ulysses::v1::CheckpointInterval& interval);
// The last non-empty stderr lines (at most two, 500 chars): the job's failure reason.
std::string LastLines(const std::string& tail);
// The metric labels of a rank's series.
RankLabels Labels(const ::ulysses::v1::WorkRef& ref);

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_AGENT_MESSAGES_H_
