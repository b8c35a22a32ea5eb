// The `ulysses-train rank` stdout protocol (TEAM.md "Shared contracts"): one JSON
// object per line, and the exit-code contract. Pure functions, thread-safe.
//
//   {"event":"step","stage":i,"step":n,"steps":total,"loss":..,"tokens_per_s":..,"seq_len":..}
//   {"event":"checkpoint","stage":i,"step":n,"path":"...","bytes":..,"seconds":..}
//   {"event":"eval","stage":i,"seq_len":..,"loss":..,"accuracy":..}
//   {"event":"done","stage":i}
//
// Lines that are not JSON objects with a known "event" are not events: the
// supervisor forwards them as log lines instead.
#ifndef ULYSSES_WORKER_AGENT_TRAIN_EVENT_H_
#define ULYSSES_WORKER_AGENT_TRAIN_EVENT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ulysses::agent {

struct TrainEvent {
  enum class Kind { kStep, kCheckpoint, kEval, kDone };
  Kind kind = Kind::kStep;
  int64_t stage = 0;
  // step / checkpoint
  int64_t step = 0;
  int64_t steps = 0;  // step only: total steps of the stage.
  // step / eval
  double loss = 0.0;
  double tokens_per_s = 0.0;
  int64_t seq_len = 0;
  // checkpoint
  std::string path;
  int64_t bytes = 0;
  double seconds = 0.0;
  // eval: retrieval accuracy (needle data) when the engine reports one.
  std::optional<double> accuracy;
};

const char* TrainEventKindName(TrainEvent::Kind kind);

// Parses one stdout line. InvalidArgument for non-JSON lines, unknown events or
// fields of the wrong type (the message says which).
absl::StatusOr<TrainEvent> ParseTrainEvent(absl::string_view line);

// Exit codes of `ulysses-train rank`.
inline constexpr int kExitStageFinished = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitPreempted = 75;

// How one attempt of one rank ended, as reported to the coordinator.
enum class AttemptOutcome {
  kSucceeded,  // Stage finished, final checkpoint committed.
  kPreempted,  // Stopped for a preemption (resumable; not a failure).
  kBadInput,   // Spec/data/checkpoint error: retrying will not help.
  kFailed,     // Crash, signal, or any other non-zero exit.
  kAborted,    // Killed because the coordinator asked (group re-formed, cancel).
};

const char* AttemptOutcomeName(AttemptOutcome outcome);

// Why the agent stopped the child, if it did.
enum class StopCause { kNone, kAbort, kPreempt };

// Maps a waitpid() status plus the agent's own stop request to an outcome:
// - kAbort requested: always kAborted (the coordinator no longer wants this attempt),
//   except a clean exit 0, which is kSucceeded.
// - kPreempt requested: exit 0 -> kSucceeded, anything else (75, or killed after the
//   grace ran out) -> kPreempted.
// - no request: 0 -> kSucceeded, 75 -> kPreempted, 2 -> kBadInput, else kFailed.
AttemptOutcome MapExit(int wait_status, StopCause cause);

// "exit code 2", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_TRAIN_EVENT_H_
