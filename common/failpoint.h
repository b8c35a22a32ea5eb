// Test-only fault injection ("failpoints"): off unless an environment variable arms one.
//
//   ULYSSES_FAILPOINT=<name>[@<step>]   e.g. ULYSSES_FAILPOINT=checkpoint.before_manifest@4
//   ULYSSES_FAILPOINT_MARKER=<path>     optional: file created when the failpoint fires
//
// Production code marks a point with HangAtFailpoint("<name>", step). When the armed
// name matches and either no @<step> was given or it equals `step`, the process logs an
// ERROR line, creates the marker file (content "<pid>\n", written to <path>.tmp and
// renamed, so its existence means it is complete) and blocks forever in pause(), so a
// test can SIGKILL it at an exactly known point without sleeping. A signal that is
// handled (SIGTERM via common/stop.h) does not end the block; only one that terminates
// the process does.
//
// The variables are read once, on the first call (thread-safe); an armed failpoint logs
// a WARNING then, and a malformed value logs an ERROR and arms nothing. Unset (the
// default), a call is an already-initialised static and an empty-name check. For tests
// only: never set these in production.
//
// Failpoints in the code base:
//   checkpoint.before_manifest   worker/engine/checkpoint SaveCheckpoint, rank 0, after
//                                every rank's shard is written + fsynced and the
//                                post-shard barrier passed, right before manifest.json
//                                is written; step = the checkpoint's global_step. In an
//                                asynchronous save (async_checkpoint.h) the same point on
//                                rank 0's writer thread, once every shard is on disk,
//                                while the training thread goes on.
//   train.step                   worker/engine/train engine.cc, every rank's training thread at
//                                the start of a step (before its batches); step = the global
//                                step it would complete. A step that never ends: the
//                                preemption watch (train/preemption.h) must leave anyway.
#ifndef ULYSSES_COMMON_FAILPOINT_H_
#define ULYSSES_COMMON_FAILPOINT_H_

#include <cstdint>
#include <string_view>

namespace ulysses {

inline constexpr char kFailpointEnv[] = "ULYSSES_FAILPOINT";
inline constexpr char kFailpointMarkerEnv[] = "ULYSSES_FAILPOINT_MARKER";

// True when ULYSSES_FAILPOINT arms `name` for `step` (no @<step>: every step).
bool FailpointArmed(std::string_view name, int64_t step);

// If FailpointArmed(name, step): creates the marker, logs, and never returns.
// Otherwise returns at once.
void HangAtFailpoint(std::string_view name, int64_t step);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_FAILPOINT_H_
