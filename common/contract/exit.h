// The process exit contract shared by every Ulysses binary, and how the control
// plane reads a `ulysses-train rank` exit. Defined here and nowhere else; documented
// in docs/CONTRACTS.md. Pure functions, thread-safe.
//
//   code  meaning                                              retry?
//   0     ok (`ulysses-train rank`: stage finished, final      -
//         checkpoint committed)
//   1     failure: crash, I/O error, unreachable peer, ...     yes (counts as a failure)
//   2     bad input: flags, spec, data, checkpoint, request    no: fix the input
//   69    lost a peer: a collective or the rendezvous failed   yes (an infrastructure
//         (peer closed the connection, timed out);             failure, budgeted apart
//         `ulysses-train` only; EX_UNAVAILABLE                 from application ones)
//   75    preempted: stopped on SIGTERM after committing a     yes (resumes from that
//         checkpoint (`ulysses-train` only; EX_TEMPFAIL)       checkpoint; not a failure)
//
// A process killed by a signal is reported as 128 + signal by the supervisors
// (common/process), as shells do.
#ifndef ULYSSES_COMMON_CONTRACT_EXIT_H_
#define ULYSSES_COMMON_CONTRACT_EXIT_H_

#include "absl/status/status.h"

namespace ulysses::contract {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitPeerLost = 69;
inline constexpr int kExitPreempted = 75;

// True for the status codes that mean "the input is wrong, retrying will not help":
// INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, DATA_LOSS, OUT_OF_RANGE,
// ALREADY_EXISTS.
bool IsBadInput(absl::StatusCode code);

// OK -> kExitOk, bad input (IsBadInput) -> kExitBadInput, anything else -> kExitFailure.
int ExitCodeFor(const absl::Status& status);

// The exit code of a `ulysses-train` rank: ExitCodeFor, except that UNAVAILABLE and
// DEADLINE_EXCEEDED (how the communicators report a peer that closed the connection, a
// rendezvous that failed, a collective that timed out) -> kExitPeerLost.
int RankExitCodeFor(const absl::Status& status);

// Why a supervisor (the worker agent) stopped a rank, if it did.
enum class StopRequest {
  kNone,     // Not stopped: the rank exited on its own.
  kAbort,    // The coordinator no longer wants this attempt (group re-formed, cancel).
  kPreempt,  // SIGTERM for a preemption (node drain, pod eviction): checkpoint and exit 75.
};

// How one rank's attempt ended. The coordinator maps it to v1::AttemptOutcome.
enum class RankOutcome {
  kSucceeded,  // Exit 0: stage finished, final checkpoint committed.
  kPreempted,  // Stopped for a preemption; resumable, not a failure.
  kBadInput,   // Exit 2: spec/data/checkpoint error; retrying will not help.
  kFailed,     // Crash, signal, or any other exit; counts against the failure budget.
  kAborted,    // Stopped because the coordinator asked; not the rank's fault.
};

const char* RankOutcomeName(RankOutcome outcome);  // "succeeded", "preempted", ...
const char* StopRequestName(StopRequest stop);     // "none", "abort", "preempt".

// How a process ended: its exit code, or the signal that killed it.
struct ProcessExit {
  int exit_code = 0;  // WEXITSTATUS, or 128 + signal when killed.
  int signal = 0;     // Terminating signal; 0 when the process exited by itself.
};

// The one exit -> outcome table (the worker agent and the coordinator both use it):
// - exit 0 -> kSucceeded, whatever was requested (the stage finished first);
// - else kAbort requested -> kAborted; kPreempt requested -> kPreempted (exit 75, or
//   killed after its grace ran out: the job resumes from its last checkpoint);
// - else killed by a signal -> kFailed; exit 75 -> kPreempted; exit 2 -> kBadInput;
//   any other exit -> kFailed.
RankOutcome OutcomeOf(const ProcessExit& exit, StopRequest stop);

// What a failed rank (RankOutcome::kFailed) says about its cause, for the failure budgets
// of the coordinator (docs/JOBSPEC.md "Failure budgets"):
// - kInfrastructure: killed from outside (SIGKILL: kill -9, the OOM killer, a node going
//   away; SIGTERM, SIGINT, SIGHUP), SIGPIPE (it wrote to a peer, the store or the agent
//   that was already gone), or exit kExitPeerLost (another rank or the network failed first);
// - kApplication: any other exit code, or a crash signal (SIGSEGV, SIGABRT, SIGBUS, ...).
// A worker that is lost or comes back without its rank is infrastructure too (the
// coordinator decides that; no process exit is seen).
enum class FailureKind { kApplication, kInfrastructure };
FailureKind FailureKindOf(const ProcessExit& exit);
const char* FailureKindName(FailureKind kind);  // "application", "infrastructure".

}  // namespace ulysses::contract

#endif  // ULYSSES_COMMON_CONTRACT_EXIT_H_
