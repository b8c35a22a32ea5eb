// The rank loop: ties model (model_io), parallelism (parallelize), data (batches), one optimizer
// step (train_step), evaluation (evaluate) and checkpoints (resume) together. Each piece is
// testable alone; this file only sequences them.
#include "worker/engine/train/engine.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "common/logging.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/memory_model.h"
#include "common/spec/model_math.h"
#include "common/status.h"
#include "common/stop.h"
#include "worker/engine/data/batches.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/parallel/parallelize.h"
#include "worker/engine/parallel/ulysses_attention.h"
#include "worker/engine/train/checkpoint_saver.h"
#include "worker/engine/train/checkpoint_schedule.h"
#include "worker/engine/train/guard.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/preemption.h"
#include "worker/engine/train/rank_events.h"
#include "worker/engine/train/resume.h"
#include "worker/engine/train/train_step.h"

namespace ulysses::engine::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using model::LlamaConfig;
using model::LlamaForCausalLM;

absl::StatusOr<spec::JobSpec> LoadSpec(const std::string& path,
                                       const std::vector<std::string>& overrides) {
  spec::ParseOptions opts;
  opts.overrides = overrides;
  return spec::LoadJobSpecFile(path, opts);
}

AdamWConfig AdamWConfigFromSpec(const spec::OptimizerSpec& o) {
  AdamWConfig c;
  c.beta1 = o.beta1;
  c.beta2 = o.beta2;
  c.eps = o.eps;
  c.weight_decay = o.weight_decay;
  return c;
}

// The model and parallelism of one rank, ready to train or evaluate.
struct RankSetup {
  ParallelRuntime rt;
  LlamaForCausalLM model{nullptr};
  AttentionCallback attention;
};

// structure_only: the model's parameters are allocated, not written (ZeRO-3 sharded init).
absl::StatusOr<RankSetup> SetUpRank(const spec::JobSpec& spec, const LlamaConfig& config,
                                    const ParallelConfig& pc, bool structure_only = false) {
  RETURN_IF_ERROR(CheckUlyssesHeads(config.num_attention_heads, config.num_key_value_heads, pc.sp));
  ASSIGN_OR_RETURN(torch::Dtype dtype, model::ParseDtype(spec.model.dtype));
  if (dtype == torch::kHalf && pc.device == "cpu") {
    return absl::InvalidArgumentError(
        "spec.model.dtype: float16 on a CPU device: libtorch has no float16 matrix products on "
        "CPU (use bfloat16 or float32 on CPU; float16 runs on cuda devices)");
  }
  if (spec.memory.attention_block_size <= 0) {
    return absl::InvalidArgumentError("spec.memory.attention_block_size: must be > 0");
  }
  RankSetup s;
  ASSIGN_OR_RETURN(s.rt, Parallelize(pc));
  if (structure_only) {
    ASSIGN_OR_RETURN(s.model, BuildModelStructure(config, MemoryOptionsFromSpec(spec)));
  } else {
    ASSIGN_OR_RETURN(
        s.model, BuildModel(config, MemoryOptionsFromSpec(spec), spec.seed, s.rt.device, dtype));
  }
  AttentionOptions attn;
  attn.block_size = spec.memory.attention_block_size;
  s.attention = UlyssesAttentionFn(s.rt.groups.sp.get(), attn);
  return s;
}

// Ranks sharing this host's memory: a CPU run's ranks are processes of one host (the launcher, or
// one worker's CPU slots); CUDA ranks share a node with at most one rank per visible device.
int RanksOnThisHost(const torch::Device& device, int world_size) {
  if (!device.is_cuda()) return world_size;
  return std::max(1, std::min<int>(world_size, static_cast<int>(torch::cuda::device_count())));
}

json CheckpointExtra(const spec::JobSpec& spec, const LlamaConfig& config,
                     const ParallelRuntime& rt, const LossScaler& scaler) {
  json extra{{"seed", spec.seed},
             {"sp_degree", rt.sp},
             {"dp_degree", rt.dp},
             {"model_config", ModelConfigToJson(config)},
             {"dtype", spec.model.dtype}};
  if (scaler.enabled) {
    extra["loss_scale"] = scaler.scale;
    extra["loss_scale_good_steps"] = scaler.good_steps;
  }
  return extra;
}

// Restores the float16 loss scale from a checkpoint's extra (absent: keep the initial scale).
absl::Status RestoreLossScale(const json& extra, LossScaler& scaler) {
  if (!scaler.enabled || !extra.contains("loss_scale")) return absl::OkStatus();
  const json& scale = extra["loss_scale"];
  const json& good = extra.value("loss_scale_good_steps", json(0));
  if (!scale.is_number() || !good.is_number_integer() || !(scale.get<double>() > 0) ||
      !std::isfinite(scale.get<double>()) || good.get<int64_t>() < 0) {
    return absl::DataLossError(absl::StrCat("checkpoint extra.loss_scale: ", scale.dump(),
                                            " / loss_scale_good_steps: ", good.dump(),
                                            " are not a positive finite scale and a count"));
  }
  scaler.scale = scale.get<double>();
  scaler.good_steps = good.get<int64_t>();
  return absl::OkStatus();
}

absl::StatusOr<RankOutcome> RunRankImpl(const RankOptions& o) {
  ASSIGN_OR_RETURN(spec::JobSpec spec, LoadSpec(o.job_file, o.overrides));
  if (o.stage < 0 || o.stage >= static_cast<int>(spec.stages.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stage: ", o.stage, " is out of range (job has ", spec.stages.size(), " stages)"));
  }
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out: required");
  const spec::StageSpec& stage = spec.stages[o.stage];
  const int64_t sp = spec.StageSp(o.stage), dp = spec.StageDp(o.stage);
  if (stage.seq_len % sp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.stages[", o.stage, "].seq_len: ", stage.seq_len,
                     " is not divisible by sp_degree ", sp, " (use a multiple of ", sp, ")"));
  }
  InstallStopSignalHandlers();
  if (o.intra_op_threads > 0) at::set_num_threads(o.intra_op_threads);
  const std::string root = CheckpointRoot(spec, o.out_dir);
  RankReporter report(o.rank == 0, o.out_dir, o.rank == 0 || o.step_events_all_ranks,
                      o.progress_line);

  // Decide where we start before touching the network (bad input fails fast on every rank).
  ASSIGN_OR_RETURN(ResumePlan plan, PlanResume(root, spec::SpecHash(spec), o.stage));
  if (plan.stage_done) {
    report.Done(o.stage, /*with_peak_rss=*/false);
    return RankOutcome{};
  }
  LlamaConfig config;
  if (plan.state && plan.state->extra.contains("model_config")) {
    ASSIGN_OR_RETURN(config, ModelConfigFromJson(plan.state->extra["model_config"]));
  } else {
    ASSIGN_OR_RETURN(config, ResolveModelConfig(spec, spec.model.init_from));
  }
  ASSIGN_OR_RETURN(auto train_data, OpenDataset(spec, Split::kTrain, config.vocab_size));
  // Fail fast on a data file too short for one sequence.
  RETURN_IF_ERROR(train_data->Get(0, stage.seq_len).status());

  ParallelConfig pc;
  pc.sp = sp;
  pc.dp = dp;
  pc.rank = o.rank;
  pc.world_size = o.world_size;
  pc.master_addr = o.master_addr;
  pc.master_port = o.master_port;
  pc.device = o.device;
  pc.backend = o.backend;
  // The peers wait for the slowest rank's checkpoint load (before the rendezvous) and write
  // (between a save's barriers): the timeout grows with the checkpoint (resume.h).
  int64_t checkpoint_bytes = EstimatedCheckpointBytes(config);
  if (plan.state) {
    ASSIGN_OR_RETURN(int64_t loaded, CheckpointBytes(plan.path));
    checkpoint_bytes = std::max(checkpoint_bytes, loaded);
  }
  pc.timeout = std::chrono::seconds(
      ScaledCollectiveTimeoutSeconds(o.collective_timeout_s, checkpoint_bytes));
  const int zero_stage = static_cast<int>(spec.parallelism.zero_stage);
  // ZeRO-3: no rank writes the whole model; each makes, imports or loads its chunks (zero.h).
  const bool sharded_init = zero_stage == 3;
  const bool import_hf = !plan.state && !spec.model.init_from.empty();
  ASSIGN_OR_RETURN(RankSetup rs, SetUpRank(spec, config, pc, sharded_init));
  AdamW adam(AdamWConfigFromSpec(spec.optimizer));
  int64_t global_step = 0, start_step = 0;
  if (plan.state) {
    // This rank's share only (resume.h ResumeShare): its ZeRO chunks, or whole tensors it keeps.
    LoadStats read;
    ASSIGN_OR_RETURN(
        CheckpointState share,
        LoadCheckpointShare(plan.path, spec::SpecHash(spec),
                            ResumeShare(rs.model, zero_stage, rs.rt.groups.world->rank(),
                                        rs.rt.groups.world->size()),
                            &read));
    ULOG(INFO) << "rank " << o.rank << " resumed from " << plan.path << ": read " << read.data_bytes
               << " tensor bytes + " << read.metadata_bytes << " metadata bytes";
    plan.state->tensors = std::move(share.tensors);
    if (zero_stage < 3) RETURN_IF_ERROR(RestoreModel(*plan.state, plan.path, rs.model));
    global_step = plan.state->global_step;
    if (plan.state->stage == o.stage) start_step = plan.state->step_in_stage;
  } else if (import_hf && !sharded_init) {
    RETURN_IF_ERROR(LoadInitFrom(rs.model, spec.model.init_from));
  }
  // ZeRO-3 import: the byte ranges of this rank's chunks, by HF name (taken before the sharding
  // frees the parameters' shapes).
  ShareRequest import_share;
  if (import_hf && sharded_init) {
    import_share = ImportShare(rs.model, rs.rt.groups.world->rank(), rs.rt.groups.world->size());
  }
  // ZeRO (zero.h): shard the now-loaded weights over every rank of the stage.
  std::unique_ptr<ZeroSharding> zero;
  if (zero_stage > 0) {
    ZeroOptions zo;
    zo.stage = zero_stage;
    zo.offload_optimizer = spec.parallelism.offload_optimizer;
    zo.activation_checkpointing = spec.memory.activation_checkpointing;
    zo.sharded_init = sharded_init;
    if (!plan.state && !import_hf) zo.init_seed = spec.seed;  // else loaded over the chunks
    ASSIGN_OR_RETURN(zo.dtype, model::ParseDtype(spec.model.dtype));
    ASSIGN_OR_RETURN(
        zero, ZeroSharding::Create(rs.model, rs.rt.groups.world.get(), &adam, zo, rs.rt.device));
  }
  if (!import_share.empty()) {
    LoadStats read;
    ASSIGN_OR_RETURN(std::vector<NamedTensor> pieces,
                     LoadHfWeightsShare(spec.model.init_from, import_share, &read));
    for (NamedTensor& nt : pieces) nt.name = kModelPrefix + nt.name;
    RETURN_IF_ERROR(zero->LoadOwnedState(pieces, /*adam_steps=*/0));
    ULOG(INFO) << "rank " << o.rank << " imported " << spec.model.init_from << ": read "
               << read.data_bytes << " tensor bytes + " << read.metadata_bytes << " header bytes";
  }
  if (plan.state) {
    RETURN_IF_ERROR(RestoreOptimizer(*plan.state, rs.model, adam, zero.get()));
    // Weights and optimizer state live in the model and AdamW now: drop the loaded host copy
    // (this rank's share) instead of holding it for the rest of the run.
    std::vector<NamedTensor>().swap(plan.state->tensors);
  }
  // The start-up peak (ulyssesctl plan's init/import/resume columns; bench/state_memory.sh).
  ULOG(INFO) << "rank " << o.rank << " state ready ("
             << (plan.state ? "resume" : (import_hf ? "import" : "init")) << "): peak RSS "
             << PeakRssBytes() << " bytes";

  Trainer trainer(rs.model, rs.attention, rs.rt.groups.world.get(), &adam, spec.optimizer.grad_clip,
                  rs.rt.device, zero.get());
  if (plan.state) RETURN_IF_ERROR(RestoreLossScale(plan.state->extra, trainer.loss_scaler()));
  BatchLayout layout;
  layout.seq_len = stage.seq_len;
  layout.sp_rank = rs.rt.groups.sp_rank;
  layout.sp = sp;
  layout.dp_rank = rs.rt.groups.dp_rank;
  layout.dp = dp;
  layout.grad_accum = std::max<int64_t>(1, spec.optimizer.grad_accum_steps);
  layout.micro_batch = std::max<int64_t>(1, spec.optimizer.micro_batch_size);
  // The stage's data cursor (batches.h): from the checkpoint when it recorded one (the layout may
  // have changed since), else derived from the step.
  int64_t cursor = start_step * layout.GlobalBatch();
  if (plan.state && plan.state->stage == o.stage && plan.state->extra.contains("data_cursor")) {
    const json& c = plan.state->extra["data_cursor"];
    if (!c.is_number_integer() || c.get<int64_t>() < 0) {
      return absl::DataLossError(absl::StrCat("checkpoint ", plan.path, " extra.data_cursor: ",
                                              c.dump(), " is not a sequence count >= 0"));
    }
    cursor = c.get<int64_t>();
  }
  const spec::EvalSpec& eval = spec.StageEval(o.stage);
  ASSIGN_OR_RETURN(auto val, OpenDataset(spec, Split::kValidation, config.vocab_size));
  ASSIGN_OR_RETURN(int64_t n_val,
                   ValidationSequences(spec, *val, stage.seq_len, eval.max_sequences));
  auto evaluate = [&](int64_t step_in_stage) -> absl::Status {
    if (zero) RETURN_IF_ERROR(zero->GatherOuter());  // ZeRO-3: layers are gathered by their hooks
    ASSIGN_OR_RETURN(EvalResult ev, Evaluate(rs.model, rs.attention, rs.rt, *val, n_val,
                                             stage.seq_len, spec.data.synthetic.has_value()));
    if (zero) zero->ReleaseOuter();
    report.Eval(o.stage, step_in_stage, stage.seq_len, ev);
    return absl::OkStatus();
  };
  const int64_t steps = stage.steps;
  const double peak = spec.StageLr(o.stage);
  const int64_t warmup = spec.StageWarmup(o.stage);
  Communicator& world = *rs.rt.groups.world;
  // Synchronous or asynchronous saves (checkpoint_saver.h), agreed by every rank.
  CheckpointSaver::Options so;
  so.root = root;
  so.keep_last = spec.checkpoint.keep_last;
  so.async = spec.checkpoint.async;
  so.snapshot_bytes = spec::SnapshotBytesPerRank(spec::CountParameters(config), spec.model.dtype,
                                                 o.world_size, spec.parallelism.zero_stage);
  so.ranks_on_host = RanksOnThisHost(rs.rt.device, o.world_size);
  so.zero = zero != nullptr;
  so.device = rs.rt.device;
  so.commit_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(pc.timeout);
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointSaver> saver, CheckpointSaver::Create(so, world));
  // Periodic checkpoints by steps, time or the supervisor's interval (checkpoint_schedule.h).
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointSchedule> schedule,
                   CheckpointSchedule::Create(spec.checkpoint, o.control_stdin, o.rank));
  // A preemption notice shorter than a step (preemption.h): leave within the grace.
  PreemptionWatch watch(o.stop_grace_s, o.rank, saver.get(), &report);
  // periodic: may return before the files are written (asynchronous); else committed on return.
  auto commit = [&](int64_t step_in_stage, bool complete, bool periodic) -> absl::Status {
    CommitPoint point{o.stage, step_in_stage, global_step, complete};
    json extra = CheckpointExtra(spec, config, rs.rt, trainer.loss_scaler());
    extra["data_cursor"] = cursor;
    CheckpointState state =
        TrainingCheckpointState(spec, point, rs.model, adam, std::move(extra), zero.get());
    return periodic ? saver->Periodic(std::move(state), report)
                    : saver->Commit(std::move(state), report);
  };

  int64_t skipped_in_a_row = 0;
  const double flops_per_token = spec::ModelFlopsPerToken(config, stage.seq_len);
  StepMeter meter(rs.rt.device, rs.rt.groups.sp.get(), flops_per_token);
  for (int64_t step = start_step; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    watch.NoteStepBegin();
    HangAtFailpoint("train.step", global_step + 1);  // tests: a step that does not end
    meter.Begin();
    ASSIGN_OR_RETURN(std::vector<LocalShard> batches,
                     StepMicroBatches(*train_data, layout, cursor));
    meter.BatchesReady();
    const double lr = ScheduledLr(spec.optimizer.schedule, peak, spec.optimizer.min_lr_ratio,
                                  warmup, steps, step);
    ASSIGN_OR_RETURN(StepStats stats, trainer.Step(batches, lr, step));
    ++global_step;
    const int64_t step_cursor = cursor;
    cursor += layout.GlobalBatch();
    skipped_in_a_row = stats.skipped ? skipped_in_a_row + 1 : 0;
    StepReport r;
    r.stage = o.stage;
    r.step_in_stage = step + 1;
    r.steps = steps;
    r.global_step = global_step;
    r.seq_len = stage.seq_len;
    r.sp = sp;
    r.dp = dp;
    r.lr = lr;
    r.data_cursor = step_cursor;
    r.stats = stats;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    watch.NoteStepEnd(r.seconds);
    r.tokens_per_s =
        static_cast<double>(stage.seq_len * layout.GlobalBatch()) / std::max(r.seconds, 1e-9);
    r.rank = meter.Finish(stats,
                          static_cast<double>(stage.seq_len * layout.GlobalBatch()) / o.world_size);
    // One collective per step, after the timed phases (the figures above exclude it): agree on
    // a stop (slot 0, max of the flags), learn every rank's step seconds (slot 1 + rank; the
    // others' slots are 0, so the max is an all-gather) and agree on the periodic checkpoint
    // (the schedule's slots after those).
    const int64_t sched_slot = 1 + o.world_size;
    torch::Tensor agreed = torch::zeros({sched_slot + CheckpointSchedule::kSlots}, torch::kFloat32);
    agreed[0] = StopRequested() ? 1.0f : 0.0f;
    agreed[1 + o.rank] = static_cast<float>(r.rank->step_seconds);
    {
      float slots[CheckpointSchedule::kSlots];
      schedule->Fill(slots, std::chrono::steady_clock::now());
      for (int i = 0; i < CheckpointSchedule::kSlots; ++i) agreed[sched_slot + i] = slots[i];
    }
    agreed = agreed.to(rs.rt.device);
    RETURN_IF_ERROR(world.AllReduceMax(agreed));
    agreed = agreed.cpu().contiguous();
    const bool stopping = agreed[0].item<float>() > 0;
    const bool periodic =
        schedule->Decide(agreed.data_ptr<float>() + sched_slot, /*step_in_stage=*/step + 1);
    std::vector<double> rank_seconds(o.world_size);
    for (int i = 0; i < o.world_size; ++i) rank_seconds[i] = agreed[1 + i].item<float>();
    r.group = GroupFigures(rank_seconds);
    r.mfu = spec::Mfu(flops_per_token, r.tokens_per_s, o.world_size, o.peak_flops);
    RETURN_IF_ERROR(saver->Poll(report));  // a background save that committed meanwhile
    if (saver->last_commit().has_value()) {
      r.checkpoint_age_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *saver->last_commit())
              .count();
    }
    report.Step(r);
    if (skipped_in_a_row >= kMaxConsecutiveSkippedSteps) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spec.stages[", o.stage, "] step ", step + 1, ": ", skipped_in_a_row,
          " consecutive steps had a non-finite loss or gradient norm (last: loss ", stats.loss,
          ", grad_norm ", stats.grad_norm,
          ") and were skipped; the run diverged (lower optimizer.lr, raise warmup_steps, set "
          "optimizer.grad_clip, use bfloat16 instead of float16, or check the data)"));
    }
    const bool last = step + 1 == steps;
    if (stopping && !last) {
      RETURN_IF_ERROR(commit(step + 1, false, /*periodic=*/false));
      return RankOutcome{true};
    }
    if (periodic && !last) {
      watch.NoteOtherBegin();
      schedule->Saved(std::chrono::steady_clock::now());
      RETURN_IF_ERROR(commit(step + 1, false, /*periodic=*/true));
    }
    if (eval.every_steps > 0 && (step + 1) % eval.every_steps == 0 && !last) {
      RETURN_IF_ERROR(evaluate(step + 1));
    }
  }

  RETURN_IF_ERROR(evaluate(steps));  // the stage's evaluation, bounded by eval.max_sequences
  RETURN_IF_ERROR(commit(steps, true, /*periodic=*/false));
  report.Done(o.stage, /*with_peak_rss=*/true);
  return RankOutcome{};
}

absl::StatusOr<EvalResult> RunEvalRankImpl(const EvalOptions& o) {
  ASSIGN_OR_RETURN(spec::JobSpec spec, LoadSpec(o.job_file, o.overrides));
  if (!o.checkpoint.empty() && !o.init_from.empty()) {
    return absl::InvalidArgumentError("eval: give --checkpoint or --init-from, not both");
  }
  const int64_t seq_len = o.seq_len > 0 ? o.seq_len : spec.stages.back().seq_len;
  if (seq_len % o.world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq-len: ", seq_len, " is not divisible by --nproc ", o.world_size));
  }
  std::optional<CheckpointState> state;
  LlamaConfig config;
  if (!o.checkpoint.empty()) {
    ASSIGN_OR_RETURN(CheckpointState st, ReadCheckpointInfo(o.checkpoint, ""));
    if (!st.extra.contains("model_config")) {
      return absl::DataLossError(absl::StrCat("checkpoint ", o.checkpoint, ": no model_config"));
    }
    ASSIGN_OR_RETURN(config, ModelConfigFromJson(st.extra["model_config"]));
    state = std::move(st);
  } else {
    std::string init = o.init_from.empty() ? spec.model.init_from : o.init_from;
    if (!init.empty()) spec.model.init_from = init;
    ASSIGN_OR_RETURN(config, ResolveModelConfig(spec, init));
  }
  ParallelConfig pc;
  pc.sp = o.world_size;
  pc.dp = 1;
  pc.rank = o.rank;
  pc.world_size = o.world_size;
  pc.master_addr = o.master_addr;
  pc.master_port = o.master_port;
  pc.device = o.device;
  ASSIGN_OR_RETURN(RankSetup rs, SetUpRank(spec, config, pc));
  if (state) {
    // The weights alone (no optimizer state): every rank of an evaluation holds the whole model.
    ShareRequest weights = ResumeShare(rs.model, /*zero_stage=*/0, 0, 1);
    for (auto it = weights.begin(); it != weights.end();) {
      it = it->first.rfind(kModelPrefix, 0) == 0 ? std::next(it) : weights.erase(it);
    }
    ASSIGN_OR_RETURN(CheckpointState loaded, LoadCheckpointShare(o.checkpoint, "", weights));
    RETURN_IF_ERROR(
        LoadParams(rs.model, ModelTensors(loaded), absl::StrCat("checkpoint ", o.checkpoint)));
  } else if (!spec.model.init_from.empty()) {
    RETURN_IF_ERROR(LoadInitFrom(rs.model, spec.model.init_from));
  }
  ASSIGN_OR_RETURN(auto val, OpenDataset(spec, Split::kValidation, config.vocab_size));
  ASSIGN_OR_RETURN(int64_t n_val,
                   ValidationSequences(spec, *val, seq_len,
                                       spec.StageEval(spec.stages.size() - 1).max_sequences));
  return Evaluate(rs.model, rs.attention, rs.rt, *val, n_val, seq_len,
                  spec.data.synthetic.has_value());
}

}  // namespace

std::string CheckpointRoot(const spec::JobSpec& spec, const std::string& out_dir) {
  return spec.checkpoint.dir.empty() ? (fs::path(out_dir) / "checkpoints").string()
                                     : spec.checkpoint.dir;
}

absl::StatusOr<int> FirstStageToRun(const spec::JobSpec& spec, const std::string& out_dir) {
  ASSIGN_OR_RETURN(std::optional<std::string> latest,
                   FindLatestCheckpoint(CheckpointRoot(spec, out_dir)));
  if (!latest) return 0;
  ASSIGN_OR_RETURN(CheckpointState st, ReadCheckpointInfo(*latest, spec::SpecHash(spec)));
  return static_cast<int>(st.stage + (st.stage_complete ? 1 : 0));
}

absl::StatusOr<RankOutcome> RunRank(const RankOptions& options) {
  absl::StatusOr<RankOutcome> result;
  absl::Status s = Guard("ulysses-train rank", [&] {
    result = RunRankImpl(options);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return result;
}

absl::StatusOr<EvalResult> RunEvalRank(const EvalOptions& options) {
  absl::StatusOr<EvalResult> result;
  absl::Status s = Guard("ulysses-train eval", [&] {
    result = RunEvalRankImpl(options);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return result;
}

}  // namespace ulysses::engine::train
