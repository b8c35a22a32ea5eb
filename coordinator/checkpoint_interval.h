// Pure: the checkpoint interval the coordinator sends a job's ranks (spec.checkpoint.every_steps:
// auto; docs/JOBSPEC.md "Checkpoint interval"). Inputs in, decision out, no locks or I/O.
//
// Young/Daly: the interval T that minimises the expected time lost to checkpoints plus
// re-computation after failures is T = sqrt(2 C M), C the training time one checkpoint blocks,
// M the mean time between failures of the job's group.
//   - C: the measured blocking cost of the job's checkpoints (rank 0's checkpoint reports,
//     blocked_seconds; source "measured"); before one, the configured prior (coordinator config
//     checkpoint_cost_prior_s; source "prior"). With neither, the interval is "every step": the
//     first checkpoint measures C (and protects the first step).
//   - M: failures are assumed independent per GPU, so a group of G GPUs fails G times as often
//     as one. The per-GPU rate is what the coordinator observed over the attempts of groups of
//     the job's size (failures per GPU-second run), with the configured prior counted as one
//     failure in `prior_gpu_mtbf_s` GPU-seconds: M = (prior_gpu_mtbf_s + gpu_seconds) /
//     (1 + failures) / G. With no failure observed the source is "prior" (the GPU-seconds run
//     without one still raise it); with failures, "measured" (the observed rate dominates).
// T is sent in steps (round(T / step seconds), at least 1) once a step time is measured, in
// seconds before. Spec intervals (every_steps: N, every_seconds: N) are passed through with the
// reason "the job spec"; the choice then never changes.
#ifndef ULYSSES_COORDINATOR_CHECKPOINT_INTERVAL_H_
#define ULYSSES_COORDINATOR_CHECKPOINT_INTERVAL_H_

#include <cstdint>
#include <optional>
#include <string>

namespace ulysses::coordinator {

// Llama 3 (Meta, 2024): 419 unexpected interruptions in 54 days on 16,384 GPUs, i.e. one per
// 54 * 86400 * 16384 / 419 GPU-seconds.
inline constexpr double kLlama3GpuMtbfSeconds = 54.0 * 86400.0 * 16384.0 / 419.0;
// The bounds of what is sent (common/contract/rank_control.h checks the same on the way in).
inline constexpr double kMaxIntervalSeconds = 315360000;  // ten years
inline constexpr int64_t kMaxIntervalSteps = 2147483647;

struct IntervalInputs {
  bool auto_interval = false;  // spec.checkpoint.every_steps: auto
  int64_t spec_every_steps = 0;
  int64_t spec_every_seconds = 0;
  int64_t group_gpus = 1;                    // the stage's sp x dp
  std::optional<double> cost_seconds;        // C measured: blocking seconds of a checkpoint
  std::optional<double> prior_cost_seconds;  // C before a measurement (> 0), if configured
  std::optional<double> step_seconds;        // measured step time (> 0): T is sent in steps
  double observed_gpu_seconds = 0;           // GPU-seconds run by the attempts observed
  int64_t observed_failures = 0;             // failed or lost attempts among them
  double prior_gpu_mtbf_s = kLlama3GpuMtbfSeconds;
};

struct IntervalChoice {
  int64_t every_steps = 0;
  double every_seconds = 0;
  // auto only: T and its inputs (0 / "" when not chosen by Young/Daly).
  double interval_seconds = 0;
  double cost_seconds = 0;
  std::string cost_source;  // "measured", "prior" or "none" (every step until measured)
  double mtbf_seconds = 0;  // M of the group
  std::string mtbf_source;  // "measured" or "prior"
  double step_seconds = 0;  // the step time T was converted with (0: sent in seconds)
  std::string reason;
};

// sqrt(2 C M); 0 for a non-positive input.
double YoungDalySeconds(double cost_seconds, double mtbf_seconds);
// M of a group of `gpus` (see above).
double GroupMtbfSeconds(double prior_gpu_mtbf_s, double gpu_seconds, int64_t failures,
                        int64_t gpus);
IntervalChoice ChooseCheckpointInterval(const IntervalInputs& in);
// A new auto choice is sent to running ranks only when it moved by more than this fraction of
// the one they hold (or switched between by-steps and by-time): step times jitter and warm up,
// and each change is a message per rank. The expected waste C/T + T/(2M) is flat near its
// minimum: at T = k sqrt(2CM) it is (k + 1/k)/2 of the minimum, so keeping an interval 25 %
// off (k = 1.25 or 0.8) wastes at most 2.5 % more than the optimum.
inline constexpr double kIntervalResendFraction = 0.25;
bool IntervalChanged(const IntervalChoice& sent, const IntervalChoice& next);

// A job's interval state in the coordinator's memory (JobRt::interval; job_interval.cc). Not
// persisted: after a coordinator restart the next checkpoint measures the cost again.
struct JobIntervalState {
  std::optional<bool> auto_interval;   // spec.checkpoint.every_steps: auto (read once)
  int64_t version = 0;                 // of `sent`; 0 = none sent yet
  std::optional<IntervalChoice> sent;  // what the current attempt's ranks were given
  double cost_sum = 0;                 // C: the mean blocking seconds of the periodic
  int64_t cost_samples = 0;            // checkpoints rank 0 reported (every attempt)
  std::optional<double> step_seconds;  // the current attempt's rank-0 step seconds (smoothed)
  int64_t group_gpus = 1;              // the current attempt's group size
  double observed_gpu_seconds = 0;     // failure data for groups of that size, refreshed at
  int64_t observed_failures = 0;       // each launch and checkpoint report
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_CHECKPOINT_INTERVAL_H_
