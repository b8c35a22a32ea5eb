// The stage loop of one training rank: from RankState's first step to the stage's end. Each
// step: its micro-batches (batches.h), one optimizer step (train_step.h), the step's report, one
// agreed all-reduce (a stop requested on any rank, every rank's step seconds, the periodic
// checkpoint decision of checkpoint_schedule.h); then a checkpoint when the schedule or a stop
// says so (checkpoint_saver.h, synchronous or asynchronous), periodic evaluations; at the end the
// stage's evaluation and its final commit. A SIGTERM shorter than a step is handled by
// preemption.h.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_STAGE_LOOP_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_STAGE_LOOP_H_

#include "absl/status/statusor.h"
#include "worker/engine/train/engine.h"
#include "worker/engine/train/rank_events.h"
#include "worker/engine/train/rank_state.h"

namespace ulysses::engine::train {

// Runs the rest of in.stage on s. RankOutcome{preempted = true} after an agreed stop that
// committed a checkpoint.
absl::StatusOr<RankOutcome> RunStage(const RankOptions& o, RankInputs& in, RankState& s,
                                     RankReporter& report);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_STAGE_LOOP_H_
