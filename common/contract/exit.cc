#include "common/contract/exit.h"

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
