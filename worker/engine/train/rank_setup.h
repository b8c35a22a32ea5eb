// What a training rank and an evaluation rank both build: the job spec with its --set
// overrides, the AdamW config it names, the process groups and model of one rank
// (parallelize.h, model_io.h). Internal to the engine (engine.cc, rank_state.cc, stage_loop.cc);
// the host's threads are host_threads.h, the checkpoint's training state training_state.h.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_RANK_SETUP_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_RANK_SETUP_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/parallelize.h"
#include "worker/engine/parallel/ulysses_attention.h"
#include "worker/engine/train/optimizer.h"
#include "worker/engine/train/train_step.h"

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

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_RANK_SETUP_H_
