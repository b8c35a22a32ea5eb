#include "worker/engine/train/rank_state.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/rank_events.h"

namespace ulysses::engine::train {

absl::StatusOr<RankInputs> ResolveRankInputs(const RankOptions& o) {
  RankInputs in;
  ASSIGN_OR_RETURN(in.spec, LoadSpec(o.job_file, o.overrides));
  if (o.stage < 0 || o.stage >= static_cast<int>(in.spec.stages.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stage: ", o.stage, " is out of range (job has ", in.spec.stages.size(), " stages)"));
  }
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out: required");
  in.stage = o.stage;
  const spec::StageSpec& stage = in.spec.stages[o.stage];
  in.sp = in.spec.StageSp(o.stage);
  in.dp = in.spec.StageDp(o.stage);
  if (stage.seq_len % in.sp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec::fields::PathOf(&spec::StageSpec::seq_len, o.stage), ": ", stage.seq_len,
                     " is not divisible by sp_degree ", in.sp, " (use a multiple of ", in.sp, ")"));
  }
  in.checkpoint_root = CheckpointRoot(in.spec, o.out_dir);
  return in;
}

absl::StatusOr<std::unique_ptr<RankState>> BuildRankState(const RankOptions& o, RankInputs& in) {
  auto state = std::make_unique<RankState>();
  RankState& s = *state;
  const spec::StageSpec& stage = in.spec.stages[in.stage];
  const int64_t sp = in.sp, dp = in.dp;
  if (in.plan.state && in.plan.training.model_config) {
    s.config = *in.plan.training.model_config;
  } else {
    ASSIGN_OR_RETURN(s.config, ResolveModelConfig(in.spec, in.spec.model.init_from));
  }
  ASSIGN_OR_RETURN(s.train_data, OpenDataset(in.spec, Split::kTrain, s.config.vocab_size));
  // Fail fast on a data file too short for one sequence.
  RETURN_IF_ERROR(s.train_data->Get(0, stage.seq_len).status());

  ParallelConfig pc;
  pc.sp = sp;
  pc.dp = dp;
  pc.rank = o.rank;
  pc.world_size = o.world_size;
  pc.master_addr = o.master_addr;
  pc.master_port = o.master_port;
  pc.device = o.device;
  pc.backend = o.backend;
  if (!o.job_id.empty() || !o.rendezvous_secret.empty()) {
    pc.attempt = absl::StrCat(o.job_id, " generation ", o.generation);
    pc.secret = o.rendezvous_secret;
  }
  // The peers wait for the slowest rank's checkpoint load (before the rendezvous) and write
  // (between a save's barriers): the timeout grows with the checkpoint (resume.h).
  int64_t checkpoint_bytes = EstimatedCheckpointBytes(s.config, in.spec.model.dtype);
  if (in.plan.state) {
    ASSIGN_OR_RETURN(int64_t loaded, CheckpointBytes(in.plan.path));
    checkpoint_bytes = std::max(checkpoint_bytes, loaded);
  }
  pc.timeout = std::chrono::seconds(
      ScaledCollectiveTimeoutSeconds(o.collective_timeout_s, checkpoint_bytes));
  s.collective_timeout = pc.timeout;
  const int zero_stage = static_cast<int>(in.spec.parallelism.zero_stage);
  // ZeRO-3: no rank writes the whole model; each makes, imports or loads its chunks (zero.h).
  const bool sharded_init = zero_stage == 3;
  const bool import_hf = !in.plan.state && !in.spec.model.init_from.empty();
  ASSIGN_OR_RETURN(s.setup, SetUpRank(in.spec, s.config, pc, sharded_init));
  RankSetup& rs = s.setup;
  s.adam = std::make_unique<AdamW>(AdamWConfigFromSpec(in.spec.optimizer));
  AdamW& adam = *s.adam;
  if (in.plan.state) {
    // This rank's share only (resume.h ResumeShare): its ZeRO chunks, or whole tensors it keeps.
    LoadStats read;
    ASSIGN_OR_RETURN(
        CheckpointState share,
        LoadCheckpointShare(in.plan.path, spec::SpecHash(in.spec),
                            ResumeShare(rs.model, zero_stage, rs.rt.groups.world->rank(),
                                        rs.rt.groups.world->size()),
                            &read));
    ULOG(INFO) << "rank " << o.rank << " resumed from " << in.plan.path << ": read "
               << read.data_bytes << " tensor bytes + " << read.metadata_bytes << " metadata bytes";
    in.plan.state->tensors = std::move(share.tensors);
    if (zero_stage < 3) RETURN_IF_ERROR(RestoreModel(*in.plan.state, in.plan.path, rs.model));
    s.global_step = in.plan.state->global_step;
    if (in.plan.state->stage == o.stage) s.start_step = in.plan.state->step_in_stage;
  } else if (import_hf && !sharded_init) {
    RETURN_IF_ERROR(LoadInitFrom(rs.model, in.spec.model.init_from));
  }
  // ZeRO-3 import: the byte ranges of this rank's chunks, by HF name (taken before the sharding
  // frees the parameters' shapes).
  ShareRequest import_share;
  if (import_hf && sharded_init) {
    import_share = ImportShare(rs.model, rs.rt.groups.world->rank(), rs.rt.groups.world->size());
  }
  // ZeRO (zero.h): shard the now-loaded weights over every rank of the stage.
  if (zero_stage > 0) {
    ZeroOptions zo;
    zo.stage = zero_stage;
    zo.offload_optimizer = in.spec.parallelism.offload_optimizer;
    zo.activation_checkpointing = in.spec.memory.activation_checkpointing;
    zo.sharded_init = sharded_init;
    if (!in.plan.state && !import_hf) zo.init_seed = in.spec.seed;  // else loaded over the chunks
    ASSIGN_OR_RETURN(zo.dtype, model::ParseDtype(in.spec.model.dtype));
    ASSIGN_OR_RETURN(
        s.zero, ZeroSharding::Create(rs.model, rs.rt.groups.world.get(), &adam, zo, rs.rt.device));
  }
  if (!import_share.empty()) {
    LoadStats read;
    ASSIGN_OR_RETURN(std::vector<NamedTensor> pieces,
                     LoadHfWeightsShare(in.spec.model.init_from, import_share, &read));
    for (NamedTensor& nt : pieces) nt.name = kModelPrefix + nt.name;
    RETURN_IF_ERROR(s.zero->LoadOwnedState(pieces, /*adam_steps=*/0));
    ULOG(INFO) << "rank " << o.rank << " imported " << in.spec.model.init_from << ": read "
               << read.data_bytes << " tensor bytes + " << read.metadata_bytes << " header bytes";
  }
  if (in.plan.state) {
    RETURN_IF_ERROR(
        RestoreOptimizer(*in.plan.state, in.plan.training, rs.model, adam, s.zero.get()));
    // Weights and optimizer state live in the model and AdamW now: drop the loaded host copy
    // (this rank's share) instead of holding it for the rest of the run.
    std::vector<NamedTensor>().swap(in.plan.state->tensors);
  }
  // The start-up peak (ulyssesctl plan's init/import/resume columns; bench/state_memory.sh).
  ULOG(INFO) << "rank " << o.rank << " state ready ("
             << (in.plan.state ? "resume" : (import_hf ? "import" : "init")) << "): peak RSS "
             << PeakRssBytes() << " bytes";

  s.trainer = std::make_unique<Trainer>(rs.model, rs.attention, rs.rt.groups.world.get(), &adam,
                                        in.spec.optimizer.grad_clip, rs.rt.device, s.zero.get());
  if (in.plan.state) RestoreLossScale(in.plan.training, s.trainer->loss_scaler());
  return state;
}

}  // namespace ulysses::engine::train
