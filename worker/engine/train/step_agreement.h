// What every rank of a stage agrees on after each step, in one max all-reduce: a stop requested
// on any rank, every rank's step seconds (each rank fills only its own slot, the others are 0,
// so the max is an all-gather) and the periodic-checkpoint slots of checkpoint_schedule.h
// (reduced with max). Pack and Unpack are the one definition of the tensor's layout:
//   [0]                 stop flag (1 = this rank asks to stop)
//   [1, 1 + world)      step seconds of rank r at 1 + r
//   [1 + world, + kSlots)  CheckpointSchedule::Fill's values
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_STEP_AGREEMENT_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_STEP_AGREEMENT_H_

#include <array>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "worker/engine/train/checkpoint_schedule.h"

namespace ulysses::engine::train {

struct StepAgreement {
  bool stop = false;                                         // some rank asked to stop
  std::vector<double> rank_seconds;                          // step seconds of every rank, by rank
  std::array<float, CheckpointSchedule::kSlots> schedule{};  // for CheckpointSchedule::Decide

  // Elements of the agreed tensor for a world of `world` ranks.
  static int64_t Size(int world) { return 1 + world + CheckpointSchedule::kSlots; }
  // This rank's contribution: a float32 CPU tensor of Size(world) elements.
  static torch::Tensor Pack(bool stop, int rank, int world, double step_seconds,
                            const std::array<float, CheckpointSchedule::kSlots>& schedule);
  // The max-reduced tensor (any device) read back.
  static StepAgreement Unpack(const torch::Tensor& reduced, int world);
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_STEP_AGREEMENT_H_
