#include "worker/engine/train/commit.h"

#include <chrono>
#include <utility>

#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "worker/engine/train/model_io.h"

namespace ulysses::engine::train {

CheckpointState TrainingCheckpointState(const spec::JobSpec& spec, const CommitPoint& point,
                                        model::LlamaForCausalLM& model, const AdamW& optimizer,
                                        TrainingState training, const ZeroSharding* zero) {
  CheckpointState state;
  state.stage = point.stage;
  state.step_in_stage = point.step_in_stage;
  state.global_step = point.global_step;
  state.stage_complete = point.stage_complete;
  state.spec_hash = spec::SpecHash(spec);
  if (zero != nullptr) {
    state.tensors = zero->OwnedCheckpointTensors();
  } else {
    // Views of the live tensors: a save copies only the ones its rank writes to the host.
    for (auto& [name, t] : Params(model))
      state.tensors.push_back({kModelPrefix + name, t.detach()});
    for (auto& [name, t] : optimizer.StateTensors()) state.tensors.push_back({name, t.detach()});
  }
  training.adam_steps = optimizer.step_count();
  state.extra = training.ToJson();
  return state;
}

absl::StatusOr<CommitResult> CommitTraining(const spec::JobSpec& spec, const std::string& root,
                                            const CommitPoint& point,
                                            model::LlamaForCausalLM& model, const AdamW& optimizer,
                                            TrainingState training, Communicator& world,
                                            const ZeroSharding* zero) {
  auto t0 = std::chrono::steady_clock::now();
  CheckpointState state =
      TrainingCheckpointState(spec, point, model, optimizer, std::move(training), zero);
  Communicator* w = &world;
  ASSIGN_OR_RETURN(std::string path,
                   SaveCheckpoint(
                       root, state, world.rank(), world.size(), spec.checkpoint.keep_last,
                       [w] { return w->Barrier(); },
                       zero != nullptr ? SaveMode::kOwned : SaveMode::kReplicated));
  CommitResult r;
  r.path = std::move(path);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace ulysses::engine::train
