// What rank 0 of a stage reports: event lines on stdout (the `ulysses-train rank` event
// protocol read by the worker agent) and the run's metrics.jsonl (one object per optimizer step,
// one {"eval": ...} per stage). Other ranks report nothing. Not thread-safe.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_RANK_EVENTS_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_RANK_EVENTS_H_

#include <cstdint>
#include <string>

#include "worker/engine/train/evaluate.h"
#include "worker/engine/train/train_step.h"

namespace ulysses::engine::train {

// Peak resident set of this process (VmHWM), bytes.
int64_t PeakRssBytes();

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
};

class RankReporter {
 public:
  // Reports only when `enabled` (rank 0); metrics.jsonl goes under out_dir.
  RankReporter(bool enabled, std::string out_dir);

  void Step(const StepReport& r);
  // `step`: steps of the stage done when the evaluation ran.
  void Eval(int stage, int64_t step, int64_t seq_len, const EvalResult& r);
  void Checkpoint(int stage, int64_t step_in_stage, const std::string& path, double seconds);
  void Done(int stage, bool with_peak_rss);

 private:
  bool enabled_;
  std::string out_dir_;
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_RANK_EVENTS_H_
