// What a training rank and an evaluation rank both build: the job spec with its --set
// overrides, the process groups and model of one rank (parallelize.h, model_io.h), and the
// small conversions between the spec, AdamW and a checkpoint's extra. Internal to the engine
// (engine.cc, rank_state.cc, stage_loop.cc).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_RANK_SETUP_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_RANK_SETUP_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/parallelize.h"
#include "worker/engine/parallel/ulysses_attention.h"
#include "worker/engine/train/optimizer.h"
#include "worker/engine/train/train_step.h"
#include "worker/engine/train/training_state.h"

namespace ulysses::engine::train {

// The job file with its --set overrides applied, validated (common/spec).
absl::StatusOr<spec::JobSpec> LoadSpec(const std::string& path,
                                       const std::vector<std::string>& overrides);

AdamWConfig AdamWConfigFromSpec(const spec::OptimizerSpec& o);

// The model and parallelism of one rank, ready to train or evaluate.
struct RankSetup {
  ParallelRuntime rt;
  model::LlamaForCausalLM model{nullptr};
  AttentionCallback attention;
};

// Rendezvous (pc) and the model in spec.model.dtype on pc.device. structure_only: the model's
// parameters are allocated, not written (ZeRO-3 sharded init).
absl::StatusOr<RankSetup> SetUpRank(const spec::JobSpec& spec, const model::LlamaConfig& config,
                                    const ParallelConfig& pc, bool structure_only = false);

// Ranks sharing this host's memory: a CPU run's ranks are processes of one host (the launcher, or
// one worker's CPU slots); CUDA ranks share a node with at most one rank per visible device.
int RanksOnThisHost(const torch::Device& device, int world_size);

// Sets this rank's intra-op threads (threads >= 1): libtorch's pool (at::set_num_threads) and,
// when the BLAS library in the process is OpenBLAS (Debian's libopenblas0-pthread, found by
// symbol), OpenBLAS's own thread pool, which at::set_num_threads does not reach: without it every
// rank's matmuls ran one OpenBLAS thread per core whatever --intra-op-threads said. Returns
// OpenBLAS's thread count after the call, or 0 when the BLAS library is not OpenBLAS.
int SetIntraOpThreads(int threads);

// A training checkpoint's state (training_state.h) as of now: seed, layout, model config,
// dtype, init_from and the float16 loss scale (the data cursor and adam_steps are the caller's).
TrainingState TrainingStateOf(const spec::JobSpec& spec, const model::LlamaConfig& config,
                              const ParallelRuntime& rt, const LossScaler& scaler);

// Restores the float16 loss scale from a checkpoint's state (absent: keep the initial scale).
void RestoreLossScale(const TrainingState& training, LossScaler& scaler);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_RANK_SETUP_H_
