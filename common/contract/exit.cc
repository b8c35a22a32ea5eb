#include "common/contract/exit.h"

#include <csignal>

namespace ulysses::contract {

bool IsBadInput(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      return true;
    default:
      return false;
  }
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  return IsBadInput(status.code()) ? kExitBadInput : kExitFailure;
}

int RankExitCodeFor(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    return kExitPeerLost;
  }
  return ExitCodeFor(status);
}

FailureKind FailureKindOf(const ProcessExit& exit) {
  if (exit.signal != 0) {
    switch (exit.signal) {
      case SIGKILL:
      case SIGTERM:
      case SIGINT:
      case SIGHUP:
      // A write to a connection whose other end is gone (a peer rank, the rendezvous store
      // or the agent died first): seen in CI when a kill -9'd node's surviving rank wrote to
      // its Gloo or store socket before noticing the lost peer.
      case SIGPIPE:
        return FailureKind::kInfrastructure;
      default:
        return FailureKind::kApplication;  // SIGSEGV, SIGABRT, SIGBUS, SIGFPE, ...: a crash.
    }
  }
  return exit.exit_code == kExitPeerLost ? FailureKind::kInfrastructure : FailureKind::kApplication;
}

const char* FailureKindName(FailureKind kind) {
  return kind == FailureKind::kInfrastructure ? "infrastructure" : "application";
}

const char* RankOutcomeName(RankOutcome outcome) {
  switch (outcome) {
    case RankOutcome::kSucceeded:
      return "succeeded";
    case RankOutcome::kPreempted:
      return "preempted";
    case RankOutcome::kBadInput:
      return "bad_input";
    case RankOutcome::kFailed:
      return "failed";
    case RankOutcome::kAborted:
      return "aborted";
  }
  return "?";
}

const char* StopRequestName(StopRequest stop) {
  switch (stop) {
    case StopRequest::kNone:
      return "none";
    case StopRequest::kAbort:
      return "abort";
    case StopRequest::kPreempt:
      return "preempt";
  }
  return "?";
}

RankOutcome OutcomeOf(const ProcessExit& exit, StopRequest stop) {
  const bool killed = exit.signal != 0;
  if (!killed && exit.exit_code == kExitOk) return RankOutcome::kSucceeded;
  switch (stop) {
    case StopRequest::kAbort:
      return RankOutcome::kAborted;
    case StopRequest::kPreempt:
      return RankOutcome::kPreempted;
    case StopRequest::kNone:
      break;
  }
  if (killed) return RankOutcome::kFailed;
  if (exit.exit_code == kExitPreempted) return RankOutcome::kPreempted;
  if (exit.exit_code == kExitBadInput) return RankOutcome::kBadInput;
  return RankOutcome::kFailed;
}

}  // namespace ulysses::contract
