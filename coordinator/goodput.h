// Goodput accounting (docs/COORDINATOR.md "Goodput"): where a job's GPU time goes. Pure
// functions on a GoodputRecord (persisted with the job) and the in-memory step times of the
// attempt being accounted; no locks, no I/O (the pattern of scheduler.h).
//
// GPU-seconds are ranks x wall seconds. An attempt holds its ranks from its launch to its end
// (allocated). Its time is cut at a moving mark into consecutive pieces, each counted once:
//   launch .. first step's start   lost to `restart` (launch, rendezvous, resume, warm-up)
//   mark .. end of step S          productive when a checkpoint of step S commits
//   end of step S .. + blocked     lost to `checkpoint_stall` (the save's blocked_seconds:
//                                  training waited for it right after step S)
//   mark .. attempt end            lost to the attempt's cause once it has settled: `failure`
//                                  (failed, lost worker, bad input, coordinator restart),
//                                  `preemption`, `cancelled`, or `restart` for a finished stage
//                                  (its exit after the final commit)
// Until an attempt ends, its time past the mark is uncommitted (neither productive nor lost).
// An ended attempt settles `settle_ms` after its end (the grace in which a preempted or
// cancelled rank may still commit a checkpoint, which then counts as productive), at the next
// launch, or at once when forced. So productive + lost + uncommitted == allocated, exactly.
//
// Step ends are the coordinator's arrival times of rank 0's progress reports (the first step's
// start is its arrival minus its step_seconds). Kept in memory only: after a coordinator
// restart a commit of a step reported before it counts from the persisted mark to the newest
// known step end at or below it (the rest counts at the next commit).
#ifndef ULYSSES_COORDINATOR_GOODPUT_H_
#define ULYSSES_COORDINATOR_GOODPUT_H_

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "ulysses/v1/types.pb.h"

namespace ulysses::coordinator {

enum class LostReason { kFailure = 0, kPreemption, kRestart, kCheckpointStall, kCancelled };
inline constexpr int kLostReasons = 5;
// "failure", "preemption", "restart", "checkpoint_stall", "cancelled": the `reason` label of
// ulysses_lost_gpu_seconds_total.
const char* LostReasonName(LostReason reason);

// Persisted with the job (jobs.goodput, EncodeGoodput).
struct GoodputRecord {
  double allocated_gpu_s = 0;  // Of settled attempts.
  double productive_gpu_s = 0;
  std::array<double, kLostReasons> lost_gpu_s{};
  // The attempt being accounted: the live one, or the last one until it settles.
  int64_t generation = 0;  // 0 = none.
  int world = 0;
  int64_t started_ms = 0;
  int64_t mark_ms = 0;   // Its time up to here is counted.
  bool trained = false;  // It reported a step (the restart overhead is counted).
  int64_t ended_ms = 0;  // 0 while it runs.
  bool settled = false;  // Its time after the mark is counted (allocated_gpu_s includes it).
  LostReason end_reason = LostReason::kFailure;  // Of the time after the mark, once ended.
};

// Rank 0's step ends of the accounted attempt since its last commit: (step, Unix ms), at most
// kMaxGoodputSteps (beyond it every other entry is dropped: older commits then count to the
// nearest kept step below them).
using GoodputSteps = std::deque<std::pair<int64_t, int64_t>>;
inline constexpr size_t kMaxGoodputSteps = 4096;

// GPU-seconds one call counted (for the metrics counters).
struct GoodputDelta {
  double productive_gpu_s = 0;
  std::array<double, kLostReasons> lost_gpu_s{};
};

// A new attempt `generation` of `world` ranks launched at `started_ms`. Settles the previous
// one first (its delta is returned).
GoodputDelta GoodputStart(GoodputRecord& g, GoodputSteps& steps, int64_t generation, int world,
                          int64_t started_ms);
// Rank 0 finished `step` (reported at `now_ms`; it took `step_seconds`, < 0 = unknown).
GoodputDelta GoodputStep(GoodputRecord& g, GoodputSteps& steps, int64_t step, double step_seconds,
                         int64_t now_ms);
// A checkpoint of `step` committed (reported at `now_ms`); training was blocked for
// `blocked_seconds` by it (< 0 = unknown: 0). Ignored once the attempt has settled.
GoodputDelta GoodputCommit(GoodputRecord& g, GoodputSteps& steps, int64_t step,
                           double blocked_seconds, int64_t now_ms);
// The attempt ended at `ended_ms` with `outcome` (SUCCEEDED: restart, PREEMPTED: preemption,
// ABORTED/FAILED/LOST/BAD_INPUT: failure; GoodputCancelled changes it).
void GoodputEnd(GoodputRecord& g, v1::AttemptOutcome outcome, int64_t ended_ms);
// The ended attempt was stopped by a cancel: its time after the mark is lost to `cancelled`.
void GoodputCancelled(GoodputRecord& g);
// Settles an ended attempt once `now_ms` >= its end + `settle_ms` (or at once with `force`);
// `*changed` tells whether it did.
GoodputDelta GoodputSettle(GoodputRecord& g, int64_t now_ms, int64_t settle_ms, bool force,
                           bool* changed);

// The job's figures at `now_ms` (an unsettled ended attempt's time after the mark counted
// under its cause already).
v1::Goodput GoodputToProto(const GoodputRecord& g, int64_t now_ms);

// The jobs.goodput column: "v1", the 15 numbers and "end", space-separated ("" = a record of
// zeros, what jobs stored before goodput accounting get).
std::string EncodeGoodput(const GoodputRecord& g);
absl::StatusOr<GoodputRecord> DecodeGoodput(const std::string& text);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_GOODPUT_H_
