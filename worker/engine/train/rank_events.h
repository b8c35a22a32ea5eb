// What a rank reports: event lines on stdout (the `ulysses-train rank` event protocol read by
// the worker agent). Step events carry the rank's own per-rank figures; rank 0 prints them, and
// so does every rank run with `--step-events all` (the worker agent's per-rank metrics). Rank 0
// also prints eval, checkpoint and done events and writes the run's metrics.jsonl (one object
// per optimizer step, one {"eval": ...} per stage). Not thread-safe, except Checkpoint(), which
// the preemption watch (preemption.h) may call from its thread (stdout lines are serialised).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_RANK_EVENTS_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_RANK_EVENTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/contract/rank_event.h"

#include "worker/engine/train/evaluate.h"
#include "worker/engine/train/step_meter.h"
#include "worker/engine/train/train_step.h"

namespace ulysses::engine::train {

// Peak resident set of this process (VmHWM), bytes.
int64_t PeakRssBytes();

// The group figures of one step, from every rank's step seconds (index = rank).
struct GroupStepFigures {
  int slowest_rank = 0;  // The lowest rank with the largest step seconds.
  double slowest_step_seconds = 0;
  double median_step_seconds = 0;  // The mean of the middle two for an even count.
};
// Empty input: all 0. Non-finite or negative seconds count as 0.
GroupStepFigures GroupFigures(const std::vector<double>& step_seconds);

// The human progress line of `ulysses-train train` (stderr, rank 0), e.g.
//   stage 0 step 3/10 seq_len 256 loss 4.1523 tok/s 1234 mfu 12.3% slowest r1 0.520s
//   (median 0.480s) ckpt 12s ago
// (one line). Figures the event lacks are left out; `checkpoint_age_seconds` unset: "ckpt none".
std::string ProgressLine(const contract::StepEvent& e,
                         std::optional<double> checkpoint_age_seconds);

struct StepReport {
  int stage = 0;
  int64_t step_in_stage = 0;  // 1-based: optimizer steps completed in the stage
  int64_t steps = 0;          // steps of the stage
  int64_t global_step = 0;
  int64_t seq_len = 0;
  int64_t sp = 1, dp = 1;
  double lr = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  int64_t data_cursor = 0;  // First sequence of the stage's data stream this step read.
  StepStats stats;
  std::optional<RankStepFigures> rank;    // This rank's figures (the step event's optional fields).
  std::optional<GroupStepFigures> group;  // Slowest and median rank (every rank's step seconds).
  std::optional<double> mfu;              // spec::Mfu, when the peak FLOP/s is known.
  // Seconds since this run last committed a checkpoint (unset: none yet); progress line only.
  std::optional<double> checkpoint_age_seconds;
};

class RankReporter {
 public:
  // Eval, checkpoint and done events and metrics.jsonl (under out_dir) only when `enabled`
  // (rank 0); step events when `step_events` (rank 0, or every rank under the worker agent);
  // with `progress_line` (and `enabled`) also ProgressLine on stderr for every step.
  RankReporter(bool enabled, std::string out_dir, bool step_events, bool progress_line = false);

  void Step(const StepReport& r);
  // `step`: steps of the stage done when the evaluation ran.
  void Eval(int stage, int64_t step, int64_t seq_len, const EvalResult& r);
  // blocked_seconds: the part of `seconds` training waited for (contract::CheckpointEvent).
  void Checkpoint(int stage, int64_t step_in_stage, const std::string& path, double seconds,
                  std::optional<double> blocked_seconds = std::nullopt);
  void Done(int stage, bool with_peak_rss);

 private:
  bool enabled_;
  bool step_events_;
  bool progress_line_;
  std::string out_dir_;
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_RANK_EVENTS_H_
