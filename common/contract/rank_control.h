// The `ulysses-train rank --control stdin` protocol: what a rank's supervisor (the worker agent)
// tells a running rank. Defined here and nowhere else; documented in docs/CONTRACTS.md. The
// agent writes lines with SerializeRankControl; the rank reads them with ParseRankControlLine.
//
// One JSON object per stdin line, "control" first, then exactly these fields:
//
//   {"control":"checkpoint_interval","version":V,"every_steps":N,"every_seconds":S,
//    "reason":"..."}
//
// version: 1..16777215, grows with each new interval of the attempt (every rank applies the
// newest version once every rank of the group has it, at a step boundary); every_steps:
// 0..2147483647 (0 = none by steps); every_seconds: finite, 0..315360000 (0 = none by time);
// reason: <= 1024 bytes, no control characters (why this interval, e.g. the Young/Daly inputs).
// A line that breaks the protocol is rejected with an error naming the field, the value and the
// rule; the rank logs it and keeps its interval.
//
// Pure functions, thread-safe.
#ifndef ULYSSES_COMMON_CONTRACT_RANK_CONTROL_H_
#define ULYSSES_COMMON_CONTRACT_RANK_CONTROL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ulysses::contract {

// The environment variable that carries an attempt's rendezvous secret (Assignment
// .rendezvous_secret) from the worker agent to `ulysses-train rank`, which reads and clears it:
// never on a command line (other local users can read those).
inline constexpr char kRendezvousSecretEnv[] = "ULYSSES_RENDEZVOUS_SECRET";

// Versions stay exact in a float32 (the ranks agree on them in one all-reduce).
inline constexpr int64_t kMaxControlVersion = (int64_t{1} << 24) - 1;
inline constexpr double kMaxCheckpointIntervalSeconds = 315360000;  // ten years
inline constexpr size_t kMaxControlReasonBytes = 1024;

struct CheckpointIntervalControl {
  static constexpr const char* kKind = "checkpoint_interval";
  int64_t version = 1;
  int64_t every_steps = 0;
  double every_seconds = 0;
  std::string reason;
};

// One JSON line without the trailing newline. Checks the fields first (the same rules).
absl::StatusOr<std::string> SerializeRankControl(const CheckpointIntervalControl& control);

// One stdin line (without its newline; a trailing '\r' is ignored).
absl::StatusOr<CheckpointIntervalControl> ParseRankControlLine(absl::string_view line);

bool operator==(const CheckpointIntervalControl& a, const CheckpointIntervalControl& b);

}  // namespace ulysses::contract

#endif  // ULYSSES_COMMON_CONTRACT_RANK_CONTROL_H_
