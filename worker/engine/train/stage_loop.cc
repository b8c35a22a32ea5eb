#include "worker/engine/train/stage_loop.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/memory_model.h"
#include "common/spec/model_math.h"
#include "common/status.h"
#include "common/stop.h"
#include "worker/engine/data/batches.h"
#include "worker/engine/train/checkpoint_saver.h"
#include "worker/engine/train/checkpoint_schedule.h"
#include "worker/engine/train/evaluate.h"
#include "worker/engine/train/preemption.h"
#include "worker/engine/train/step_meter.h"

namespace ulysses::engine::train {

using json = nlohmann::json;

absl::StatusOr<RankOutcome> RunStage(const RankOptions& o, RankInputs& in, RankState& s,
                                     RankReporter& report) {
  const spec::JobSpec& spec = in.spec;
  const spec::StageSpec& stage = spec.stages[in.stage];
  const int64_t sp = in.sp, dp = in.dp;
  ResumePlan& plan = in.plan;
  const std::string& root = in.checkpoint_root;
  const model::LlamaConfig& config = s.config;
  RankSetup& rs = s.setup;
  AdamW& adam = *s.adam;
  ZeroSharding* zero = s.zero.get();
  Trainer& trainer = *s.trainer;
  int64_t& global_step = s.global_step;
  const int64_t start_step = s.start_step;
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
  so.commit_timeout = s.collective_timeout;
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
        TrainingCheckpointState(spec, point, rs.model, adam, std::move(extra), zero);
    state.owner = CheckpointOwner{o.tenant, o.job_id};
    state.adopt = spec.checkpoint.adopt;
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
                     StepMicroBatches(*s.train_data, layout, cursor));
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
          spec::fields::PathOf(&spec::JobSpec::stages), "[", o.stage, "] step ", step + 1, ": ",
          skipped_in_a_row,
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

}  // namespace ulysses::engine::train
