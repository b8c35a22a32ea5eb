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

const char* StatePlan::Name() const {
  switch (source) {
    case StateSource::kResume:
      return "resume";
    case StateSource::kImport:
      return "import";
    case StateSource::kInit:
      break;
  }
  return "init";
}

StatePlan PlanRankState(const spec::JobSpec& spec, const ResumePlan& resume) {
  StatePlan p;
  p.zero_stage = static_cast<int>(spec.parallelism.zero_stage);
  p.sharded_init = p.zero_stage == 3;
  if (resume.state) {
    p.source = StateSource::kResume;
  } else if (!spec.model.init_from.empty()) {
    p.source = StateSource::kImport;
  }
  p.config_from_checkpoint = resume.state && resume.training.model_config.has_value();
  p.restore_whole_model = p.source == StateSource::kResume && !p.sharded_init;
  p.import_whole_model = p.source == StateSource::kImport && !p.sharded_init;
  p.import_chunks = p.source == StateSource::kImport && p.sharded_init;
  p.seed_chunks = p.source == StateSource::kInit && p.zero_stage > 0;
  p.restore_optimizer = p.source == StateSource::kResume;
  return p;
}

namespace {

// The communicators' configuration: the layout, the rendezvous and its attempt, and the
// collective timeout grown with the checkpoint the ranks read and write (resume.h).
absl::StatusOr<ParallelConfig> ParallelConfigFor(const RankOptions& o, const RankInputs& in,
                                                 const model::LlamaConfig& config) {
  ParallelConfig pc;
  pc.sp = in.sp;
  pc.dp = in.dp;
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
  int64_t checkpoint_bytes = EstimatedCheckpointBytes(config, in.spec.model.dtype);
  if (in.plan.state) {
    ASSIGN_OR_RETURN(int64_t loaded, CheckpointBytes(in.plan.path));
    checkpoint_bytes = std::max(checkpoint_bytes, loaded);
  }
  pc.timeout = std::chrono::seconds(
      ScaledCollectiveTimeoutSeconds(o.collective_timeout_s, checkpoint_bytes));
  return pc;
}

// Resume: this rank's share of the checkpoint (resume.h ResumeShare: its ZeRO chunks, or the
// whole tensors it keeps), into the model below ZeRO-3, and where the stage starts.
absl::Status ReadResumeShare(const RankOptions& o, RankInputs& in, const StatePlan& plan,
                             RankState& s) {
  RankSetup& rs = s.setup;
  LoadStats read;
  ASSIGN_OR_RETURN(
      CheckpointState share,
      LoadCheckpointShare(in.plan.path, spec::SpecHash(in.spec),
                          ResumeShare(rs.model, plan.zero_stage, rs.rt.groups.world->rank(),
                                      rs.rt.groups.world->size()),
                          &read));
  ULOG(INFO) << "rank " << o.rank << " resumed from " << in.plan.path << ": read "
             << read.data_bytes << " tensor bytes + " << read.metadata_bytes << " metadata bytes";
  in.plan.state->tensors = std::move(share.tensors);
  if (plan.restore_whole_model)
    RETURN_IF_ERROR(RestoreModel(*in.plan.state, in.plan.path, rs.model));
  s.global_step = in.plan.state->global_step;
  if (in.plan.state->stage == o.stage) s.start_step = in.plan.state->step_in_stage;
  return absl::OkStatus();
}

// ZeRO (zero.h): shard the loaded (or, at ZeRO-3, the not yet made) weights over every rank.
absl::Status Shard(const RankInputs& in, const StatePlan& plan, RankState& s) {
  ZeroOptions zo;
  zo.stage = plan.zero_stage;
  zo.offload_optimizer = in.spec.parallelism.offload_optimizer;
  zo.activation_checkpointing = in.spec.memory.activation_checkpointing;
  zo.sharded_init = plan.sharded_init;
  if (plan.seed_chunks) zo.init_seed = in.spec.seed;  // Else loaded over the chunks.
  ASSIGN_OR_RETURN(zo.dtype, model::ParseDtype(in.spec.model.dtype));
  RankSetup& rs = s.setup;
  ASSIGN_OR_RETURN(s.zero, ZeroSharding::Create(rs.model, rs.rt.groups.world.get(), s.adam.get(),
                                                zo, rs.rt.device));
  return absl::OkStatus();
}

// ZeRO-3 import: the byte ranges of this rank's chunks, read by HF name into its shards.
absl::Status ImportChunks(const RankOptions& o, const RankInputs& in, const ShareRequest& share,
                          RankState& s) {
  LoadStats read;
  ASSIGN_OR_RETURN(std::vector<NamedTensor> pieces,
                   LoadHfWeightsShare(in.spec.model.init_from, share, &read));
  for (NamedTensor& nt : pieces) nt.name = kModelPrefix + nt.name;
  RETURN_IF_ERROR(s.zero->LoadOwnedState(pieces, /*adam_steps=*/0));
  ULOG(INFO) << "rank " << o.rank << " imported " << in.spec.model.init_from << ": read "
             << read.data_bytes << " tensor bytes + " << read.metadata_bytes << " header bytes";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankState>> BuildRankState(const RankOptions& o, RankInputs& in) {
  const StatePlan plan = PlanRankState(in.spec, in.plan);
  auto state = std::make_unique<RankState>();
  RankState& s = *state;
  const spec::StageSpec& stage = in.spec.stages[in.stage];
  if (plan.config_from_checkpoint) {
    s.config = *in.plan.training.model_config;
  } else {
    ASSIGN_OR_RETURN(s.config, ResolveModelConfig(in.spec, in.spec.model.init_from));
  }
  // The RoPE this stage trains with (stages[i].rope, from this stage on), over the model's or
  // the earlier stage's checkpoint's; the checkpoints of this stage record it.
  in.spec.ApplyStageRope(in.stage, &s.config);
  ASSIGN_OR_RETURN(s.train_data, OpenDataset(in.spec, Split::kTrain, s.config.vocab_size));
  // Fail fast on a data file too short for one sequence.
  RETURN_IF_ERROR(s.train_data->Get(0, stage.seq_len).status());
  ASSIGN_OR_RETURN(ParallelConfig pc, ParallelConfigFor(o, in, s.config));
  s.collective_timeout = pc.timeout;
  ASSIGN_OR_RETURN(s.setup, SetUpRank(in.spec, s.config, pc, plan.sharded_init));
  RankSetup& rs = s.setup;
  s.adam = std::make_unique<AdamW>(AdamWConfigFromSpec(in.spec.optimizer));
  if (plan.source == StateSource::kResume) RETURN_IF_ERROR(ReadResumeShare(o, in, plan, s));
  if (plan.import_whole_model) RETURN_IF_ERROR(LoadInitFrom(rs.model, in.spec.model.init_from));
  // Taken before the sharding frees the parameters' shapes.
  ShareRequest import_share;
  if (plan.import_chunks) {
    std::vector<std::string> names;  // Every rank checks the whole file set: nothing dropped.
    for (auto& [name, p] : Params(rs.model)) names.push_back(name);
    RETURN_IF_ERROR(CheckHfTensorsConsumed(in.spec.model.init_from, names));
    import_share = ImportShare(rs.model, rs.rt.groups.world->rank(), rs.rt.groups.world->size());
  }
  if (plan.zero_stage > 0) RETURN_IF_ERROR(Shard(in, plan, s));
  // A rank that owns no chunk has nothing to read.
  if (plan.import_chunks && !import_share.empty()) {
    RETURN_IF_ERROR(ImportChunks(o, in, import_share, s));
  }
  if (plan.restore_optimizer) {
    RETURN_IF_ERROR(
        RestoreOptimizer(*in.plan.state, in.plan.training, rs.model, *s.adam, s.zero.get()));
    // Weights and optimizer state live in the model and AdamW now: drop the loaded host copy
    // (this rank's share) instead of holding it for the rest of the run.
    std::vector<NamedTensor>().swap(in.plan.state->tensors);
  }
  // The start-up peak (ulyssesctl plan's init/import/resume columns; bench/state_memory.sh).
  ULOG(INFO) << "rank " << o.rank << " state ready (" << plan.Name() << "): peak RSS "
             << PeakRssBytes() << " bytes";
  s.trainer =
      std::make_unique<Trainer>(rs.model, rs.attention, rs.rt.groups.world.get(), s.adam.get(),
                                in.spec.optimizer.grad_clip, rs.rt.device, s.zero.get());
  if (plan.restore_optimizer) RestoreLossScale(in.plan.training, s.trainer->loss_scaler());
  return state;
}

}  // namespace ulysses::engine::train
