// Pure: the checkpoint interval the coordinator sends a job's ranks (spec.checkpoint.every_steps:
// auto; docs/JOBSPEC.md "Checkpoint interval"). Inputs in, decision out, no locks or I/O.
//
// Young/Daly: the interval T that minimises the expected time lost to checkpoints plus
// re-computation after failures is T = sqrt(2 C M), C the training time one checkpoint blocks,
// M the mean time between failures of the job's group.
//   - C: the measured blocking cost of the job's checkpoints (rank 0's checkpoint reports,
//     blocked_seconds). Until one is measured the interval is "every step": the first checkpoint
//     measures C (and protects the first step).
//   - M: failures are assumed independent per GPU, so a group of G GPUs fails G times as often
//     as one. The per-GPU rate is what the coordinator observed over every attempt of every job
//     (failures per GPU-second run), with the configured prior counted as one failure in
//     `prior_gpu_mtbf_s` GPU-seconds: M = (prior_gpu_mtbf_s + gpu_seconds) / (1 + failures) / G.
//     With no data this is the prior; with much data, the observed rate.
// Spec intervals (every_steps: N, every_seconds: N) are passed through with the reason "the job
// spec"; the choice then never changes.
#ifndef ULYSSES_COORDINATOR_CHECKPOINT_INTERVAL_H_
#define ULYSSES_COORDINATOR_CHECKPOINT_INTERVAL_H_

#include <cstdint>
#include <optional>
#include <string>

namespace ulysses::coordinator {

// Llama 3 (Meta, 2024): 419 unexpected interruptions in 54 days on 16,384 GPUs, i.e. one per
// 54 * 86400 * 16384 / 419 GPU-seconds.
inline constexpr double kLlama3GpuMtbfSeconds = 54.0 * 86400.0 * 16384.0 / 419.0;

struct IntervalInputs {
  bool auto_interval = false;  // spec.checkpoint.every_steps: auto
  int64_t spec_every_steps = 0;
  int64_t spec_every_seconds = 0;
  int64_t group_gpus = 1;              // the stage's sp x dp
  std::optional<double> cost_seconds;  // C: measured blocking seconds of a checkpoint
  double observed_gpu_seconds = 0;     // GPU-seconds run by every attempt observed
  int64_t observed_failures = 0;       // failed or lost attempts among them
  double prior_gpu_mtbf_s = kLlama3GpuMtbfSeconds;
};

struct IntervalChoice {
  int64_t every_steps = 0;
  double every_seconds = 0;
  double mtbf_seconds = 0;  // M of the group (auto only)
  std::string reason;
};

// sqrt(2 C M); 0 for a non-positive input.
double YoungDalySeconds(double cost_seconds, double mtbf_seconds);
// M of a group of `gpus` (see above).
double GroupMtbfSeconds(double prior_gpu_mtbf_s, double gpu_seconds, int64_t failures,
                        int64_t gpus);
IntervalChoice ChooseCheckpointInterval(const IntervalInputs& in);
// A new auto choice is sent to running ranks only when it moved by more than 10 % (or switched
// between by-steps and by-time): measurements jitter, and each change is a message per rank.
bool IntervalChanged(const IntervalChoice& sent, const IntervalChoice& next);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_CHECKPOINT_INTERVAL_H_
