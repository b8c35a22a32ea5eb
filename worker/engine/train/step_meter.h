// Per-rank figures of one optimizer step: what every rank adds to its step event (the
// optional fields of common/contract/rank_event.h's StepEvent) for the worker agent's
// per-rank metrics. Cheap: clock reads, the all-to-all clock and byte counter, and the
// allocator's (or the kernel's) memory counters; no device synchronisation. Not
// thread-safe (one meter per training loop).
//
//   StepMeter meter(device, sp_group, spec::ModelFlopsPerToken(config, seq_len));
//   meter.Begin();             // before reading the step's batches
//   ... batches ...
//   meter.BatchesReady();
//   ... trainer.Step ...
//   RankStepFigures f = meter.Finish(stats, rank_tokens);
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_STEP_METER_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_STEP_METER_H_

#include <torch/types.h>

#include <chrono>
#include <cstdint>

#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"

namespace ulysses::engine::train {

struct StepStats;

struct RankStepFigures {
  double step_seconds = 0;
  double data_wait_seconds = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double optimizer_seconds = 0;  // step - data wait - forward - backward
  double alltoall_seconds = 0;
  int64_t alltoall_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t memory_limit_bytes = 0;  // 0 = unknown
  double rank_tokens_per_s = 0;
  double model_flops_per_s = 0;  // 0 = FLOPs per token unknown
};

// Memory the rank can use: the CUDA device's total memory; on CPU the cgroup limit when
// set, else the physical memory. 0 when unknown.
int64_t MemoryLimitBytes(const torch::Device& device);

class StepMeter {
 public:
  // `alltoall_comm`: the group whose all-to-all bytes count (the SP group; may be null).
  // `flops_per_token`: spec::ModelFlopsPerToken (common/spec/model_math.h; 0 = unknown:
  // model_flops_per_s stays 0).
  StepMeter(torch::Device device, const Communicator* alltoall_comm, double flops_per_token);

  void Begin();
  void BatchesReady();
  // `rank_tokens`: tokens this rank trained in the step.
  RankStepFigures Finish(const StepStats& stats, double rank_tokens);

 private:
  using Clock = std::chrono::steady_clock;
  torch::Device device_;
  const Communicator* comm_;
  double flops_per_token_;
  int64_t memory_limit_;
  Clock::time_point begin_, batches_ready_;
  double alltoall_seconds_begin_ = 0;
  int64_t alltoall_bytes_begin_ = 0;
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_STEP_METER_H_
