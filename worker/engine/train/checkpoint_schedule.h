// When the rank loop takes a periodic checkpoint: by steps (spec.checkpoint.every_steps), by
// time (spec.checkpoint.every_seconds), or by the interval the supervisor sends to a running
// rank (`ulysses-train rank --control stdin`, common/contract/rank_control.h), the only source
// under every_steps: auto (the coordinator picks it: docs/JOBSPEC.md "Checkpoint interval").
//
// A save is collective, so every rank must decide the same. The per-step agreement all-reduce
// (max) of engine.cc carries kSlots values from here: "a checkpoint is due by time" (any rank's
// clock: all save), and the newest interval version this rank holds, plus and minus (max and
// min over the ranks). A new interval is applied at the first step boundary where every rank
// holds it (max == min), on every rank at once; it counts from the next step on.
//
// Thread-safety: one reader thread reads stdin (detached: a blocking read cannot be cancelled;
// it only touches the shared mailbox); every method is called by the training thread.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_CHECKPOINT_SCHEDULE_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_CHECKPOINT_SCHEDULE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/contract/rank_control.h"
#include "common/spec/job_spec.h"

namespace ulysses::engine::train {

class CheckpointSchedule {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kSlots = 3;

  // `control_stdin`: read interval updates from stdin. Refuses every_steps: auto without it
  // (nothing would ever set the interval).
  static absl::StatusOr<std::unique_ptr<CheckpointSchedule>> Create(
      const spec::CheckpointSpec& spec, bool control_stdin, int rank);
  ~CheckpointSchedule();
  CheckpointSchedule(const CheckpointSchedule&) = delete;
  CheckpointSchedule& operator=(const CheckpointSchedule&) = delete;

  // Before the agreement: this rank's kSlots values (reduced with max over the ranks).
  void Fill(float* slots, Clock::time_point now) const;
  // After it: whether the step just finished (`step_in_stage`, 1-based) takes a periodic
  // checkpoint. Applies an interval every rank holds (and logs it, with its reason).
  bool Decide(const float* slots, int64_t step_in_stage);
  // A periodic checkpoint began now: the time interval counts from here.
  void Saved(Clock::time_point now) { last_save_ = now; }

  const contract::CheckpointIntervalControl& interval() const { return applied_; }

  // Tests: deliver a control line as if read from stdin.
  void DeliverForTesting(const std::string& line);

  struct Mailbox;

 private:
  CheckpointSchedule(int rank, std::shared_ptr<Mailbox> mailbox)
      : rank_(rank), mailbox_(std::move(mailbox)) {}
  int64_t HeldVersion() const;

  const int rank_;
  std::shared_ptr<Mailbox> mailbox_;
  contract::CheckpointIntervalControl applied_;  // version 0: the spec's own interval
  Clock::time_point last_save_ = Clock::now();
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_CHECKPOINT_SCHEDULE_H_
