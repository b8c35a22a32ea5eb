// Bounds of everything that reaches the coordinator from outside: every JobService and
// WorkerService request and every worker Session message is checked here before it
// touches state (docs/API.md, "Bounds"). Pure functions, thread-safe.
//
// Each check returns OK or InvalidArgument with ONE line `field: value problem (fix)`,
// the field named by its proto path from the request or the WorkerMessage, e.g.
//   progress.progress.loss: nan is not a finite number >= 0 (report the step's mean
//   token loss; a non-finite loss is never stored)
// Long strings are shown by their size, never echoed.
//
// The numbers of worker reports follow the rank event contract (docs/CONTRACTS.md,
// common/contract/rank_event.h), with the proto's "0 = unset" for the fields the
// coordinator fills from the stage (StepProgress.steps and .seq_len), and are also
// checked against the stage the report names.
#ifndef ULYSSES_COORDINATOR_VALIDATION_H_
#define ULYSSES_COORDINATOR_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/spec/job_spec.h"
#include "coordinator/model.h"
#include "ulysses/v1/job_service.pb.h"
#include "ulysses/v1/worker_service.pb.h"

namespace ulysses::coordinator {

// --- Bounds (docs/API.md). Spec-side bounds (document size, stages, max_failures) are
// in common/spec (kMaxSpecBytes, kMaxStages), shared with ulyssesctl.
inline constexpr size_t kMaxJobIdBytes = 64;           // Job ids are "job-000042".
inline constexpr size_t kMaxNameBytes = 253;           // Worker name, node label, host.
inline constexpr size_t kMaxDeviceBytes = 64;          // "cpu", "cuda:0".
inline constexpr size_t kMaxVersionBytes = 128;        // RegisterRequest.agent_version.
inline constexpr int32_t kMaxCapacity = 1024;          // RegisterRequest.capacity.
inline constexpr size_t kMaxReasonBytes = 1024;        // CancelJob reason; exit error messages.
inline constexpr size_t kMaxLogLineBytes = 16 * 1024;  // Longer lines are truncated.
inline constexpr int kMaxLogLinesPerBatch = 1000;      // The agent sends at most 500.
inline constexpr int kMaxOverrides = 64;               // SubmitJobRequest.overrides.
inline constexpr size_t kMaxOverrideBytes = 4096;
inline constexpr size_t kMaxPageTokenBytes = 32;
inline constexpr int kMaxStateFilters = 16;  // ListJobsRequest.states.
inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr size_t kMaxRequestIdBytes = 128;         // SubmitJobRequest.request_id.
inline constexpr size_t kMaxWorkerPageTokenBytes = 256;   // A worker id.
inline constexpr int32_t kMaxRank = spec::kMaxWorldSize;  // WorkRef.rank < this.
inline constexpr int32_t kMaxExitCode = 255;
inline constexpr int32_t kMaxSignal = 64;  // SIGRTMAX on Linux.

// --- JobService requests (checked by the gRPC handlers, coordinator/service.cc).
// SubmitJob: overrides only; the document itself is bounded and validated by
// spec::ParseJobSpec (kMaxSpecBytes, kMaxStages, ...).
absl::Status ValidateSubmitJobRequest(const v1::SubmitJobRequest& request);
absl::Status ValidateGetJobRequest(const v1::GetJobRequest& request);
absl::Status ValidateListJobsRequest(const v1::ListJobsRequest& request);
absl::Status ValidateCancelJobRequest(const v1::CancelJobRequest& request);
absl::Status ValidateResumeJobRequest(const v1::ResumeJobRequest& request);
absl::Status ValidateWatchJobRequest(const v1::WatchJobRequest& request);
absl::Status ValidateGetJobLogsRequest(const v1::GetJobLogsRequest& request);
absl::Status ValidateListWorkersRequest(const v1::ListWorkersRequest& request);

// --- WorkerService.
absl::Status ValidateRegisterRequest(const v1::RegisterRequest& request);
absl::Status ValidateSessionHello(const v1::SessionHello& hello);

// --- Session messages (checked by the Coordinator before any state changes).
// `stages` are the stages of the job the message's WorkRef names; empty when the
// coordinator does not know that job (the stage checks are then skipped: fencing
// rejects the message as stale).
absl::Status ValidateWorkerMessage(const v1::WorkerMessage& message,
                                   absl::Span<const StageRecord> stages);
// One per kind (ValidateWorkerMessage dispatches to them).
absl::Status ValidateHeartbeat(const v1::Heartbeat& heartbeat);
absl::Status ValidateAttemptStarted(const v1::AttemptStarted& started,
                                    absl::Span<const StageRecord> stages);
absl::Status ValidateProgressReport(const v1::ProgressReport& report,
                                    absl::Span<const StageRecord> stages);
// Line text is not bounded here: the coordinator truncates long lines (TruncateText).
absl::Status ValidateLogBatch(const v1::LogBatch& batch, absl::Span<const StageRecord> stages);
absl::Status ValidateCheckpointCommitted(const v1::CheckpointCommitted& committed,
                                         absl::Span<const StageRecord> stages);
absl::Status ValidateEvalReport(const v1::EvalReport& report, absl::Span<const StageRecord> stages);
absl::Status ValidatePreemptionNotice(const v1::PreemptionNotice& notice,
                                      absl::Span<const StageRecord> stages);
// error_message is not bounded here: the coordinator truncates it to kMaxReasonBytes
// (an exit report must never be lost for its message).
absl::Status ValidateAttemptExited(const v1::AttemptExited& exited,
                                   absl::Span<const StageRecord> stages);

// The WorkRef a Session message is about (nullptr for hello, heartbeat and no kind).
const v1::WorkRef* WorkRefOf(const v1::WorkerMessage& message);

// The `reason` label of ulysses_rejected_reports_total for a message that failed
// ValidateWorkerMessage: "invalid_<kind>" (invalid_progress, invalid_logs, ...).
std::string InvalidReason(const v1::WorkerMessage& message);

// `text` when it has at most `max_bytes` bytes; else its head, cut at a UTF-8
// character boundary, followed by " [truncated N bytes]": at most `max_bytes` bytes
// in all (`max_bytes` >= 64).
std::string TruncateText(absl::string_view text, size_t max_bytes);

// Worker-supplied text (rank log lines, an exit's error message) made safe for the
// coordinator's text log, Job.reason and a terminal: control characters (C0 but tab, DEL, C1)
// become visible escapes ("\n", "\r", "\x1b"), so a worker cannot forge a log line or send
// terminal escapes. Everything else is kept as is.
std::string EscapeControl(absl::string_view text);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_VALIDATION_H_
