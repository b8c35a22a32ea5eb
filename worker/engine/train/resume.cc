#include "worker/engine/train/resume.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/memory_model.h"
#include "common/status.h"
#include "worker/engine/train/model_io.h"

namespace ulysses::engine::train {

int64_t EstimatedCheckpointBytes(const spec::ModelShape& shape, const std::string& dtype) {
  const double state = spec::CheckpointStateBytes(spec::CountParameters(shape), dtype);
  return static_cast<int64_t>(state * 1.01) + kCheckpointMetadataBytes;
}

int64_t ScaledCollectiveTimeoutSeconds(int64_t base_s, int64_t checkpoint_bytes) {
  constexpr int64_t kMaxSeconds = 7 * 24 * 3600;
  const int64_t bytes = std::max<int64_t>(0, checkpoint_bytes);
  const int64_t transfer_s =
      (bytes + kCheckpointFloorBytesPerSecond - 1) / kCheckpointFloorBytesPerSecond;
  return std::min(kMaxSeconds, std::max<int64_t>(0, base_s) + transfer_s);
}

absl::StatusOr<std::optional<std::string>> FindLatestCheckpoint(const std::string& root) {
  absl::StatusOr<std::string> latest = LatestCommittedCheckpoint(root);
  if (latest.ok()) return std::optional<std::string>(*latest);
  if (latest.status().code() == absl::StatusCode::kNotFound) return std::optional<std::string>();
  return latest.status();
}

absl::StatusOr<ResumePlan> PlanResume(const std::string& root, const std::string& spec_hash,
                                      int stage, const CheckpointOwner& me, bool adopt) {
  ResumePlan plan;
  ASSIGN_OR_RETURN(std::optional<std::string> latest, FindLatestCheckpoint(root));
  if (!latest) {
    if (stage > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--stage ", stage, ": no committed checkpoint under ", root, " (run stage 0 first)"));
    }
    return plan;
  }
  ASSIGN_OR_RETURN(CheckpointState st, ReadCheckpointInfo(*latest, spec_hash));
  const std::string where = absl::StrCat("checkpoint ", *latest);
  RETURN_IF_ERROR(CheckCheckpointOwner(*latest, st.owner, me, adopt));
  if (st.stage > stage || (st.stage == stage && st.stage_complete)) {
    plan.stage_done = true;
    if (st.stage == stage) {  // this stage's own final checkpoint: the caller reports it
      plan.state = std::move(st);
      plan.path = *latest;
    }
    return plan;
  }
  if (st.stage < stage && !(st.stage == stage - 1 && st.stage_complete)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", *latest, " is stage ", st.stage, " step ", st.step_in_stage,
                     " (complete=", st.stage_complete, "); run stage ", st.stage, " first"));
  }
  ASSIGN_OR_RETURN(plan.training, TrainingState::FromJson(st.extra, where));
  plan.state = std::move(st);
  plan.path = *latest;
  return plan;
}

ShareRequest ResumeShare(model::LlamaForCausalLM& model, int zero_stage, int rank, int world) {
  ShareRequest request;
  for (auto& [name, p] : Params(model)) {
    const ElementRange own = ZeroOwnedRange(p.numel(), rank, world);
    const std::vector<int64_t> shape = p.sizes().vec();
    auto share = [&own, &shape](bool whole) {
      TensorShare t;
      t.shape = shape;
      if (!whole) {
        t.begin = own.begin;
        t.end = own.end;
      }
      return t;
    };
    request[kModelPrefix + name] = share(zero_stage < 3);
    for (const char* prefix : {"optim/exp_avg/", "optim/exp_avg_sq/", kMasterPrefix}) {
      request[prefix + name] = share(zero_stage == 0);
    }
  }
  return request;
}

ShareRequest ImportShare(model::LlamaForCausalLM& model, int rank, int world) {
  ShareRequest request;
  for (auto& [name, share] : ResumeShare(model, /*zero_stage=*/3, rank, world)) {
    if (name.rfind(kModelPrefix, 0) == 0) request[name.substr(sizeof(kModelPrefix) - 1)] = share;
  }
  return request;
}

absl::Status RestoreModel(const CheckpointState& state, const std::string& path,
                          model::LlamaForCausalLM& model) {
  return LoadParams(model, ModelTensors(state), absl::StrCat("checkpoint ", path));
}

absl::Status RestoreOptimizer(const CheckpointState& state, const TrainingState& training,
                              model::LlamaForCausalLM& model, AdamW& optimizer,
                              ZeroSharding* zero) {
  const int64_t adam_steps = training.adam_steps.value_or(0);
  if (zero != nullptr) return zero->LoadOwnedState(state.tensors, adam_steps);
  std::map<std::string, torch::Tensor> named;
  for (const auto& t : state.tensors) named[t.name] = t.tensor;
  return optimizer.LoadState(Params(model), named, adam_steps);
}

absl::Status RestoreTraining(const CheckpointState& state, const std::string& path,
                             model::LlamaForCausalLM& model, AdamW& optimizer) {
  RETURN_IF_ERROR(RestoreModel(state, path, model));
  ASSIGN_OR_RETURN(TrainingState training,
                   TrainingState::FromJson(state.extra, absl::StrCat("checkpoint ", path)));
  return RestoreOptimizer(state, training, model, optimizer, nullptr);
}

}  // namespace ulysses::engine::train
