#include "worker/engine/train/stage_loop.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

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
#include "worker/engine/train/commit.h"
#include "worker/engine/train/evaluate.h"
#include "worker/engine/train/host_threads.h"
#include "worker/engine/train/preemption.h"
#include "worker/engine/train/step_agreement.h"
#include "worker/engine/train/step_meter.h"

namespace ulysses::engine::train {

namespace {

// One stage of one rank: Init() opens what the stage needs (its data cursor, validation set,
// saver, checkpoint schedule); Run() steps to the end, committing and evaluating on the way.
class StageRun {
 public:
  StageRun(const RankOptions& o, RankInputs& in, RankState& s, RankReporter& report)
      : o_(o),
        spec_(in.spec),
        stage_(in.spec.stages[in.stage]),
        eval_(in.spec.StageEval(o.stage)),
        in_(in),
        s_(s),
        rs_(s.setup),
        report_(report),
        world_(*s.setup.rt.groups.world),
        flops_per_token_(spec::ModelFlopsPerToken(s.config, stage_.seq_len)) {}

  absl::Status Init();
  absl::StatusOr<RankOutcome> Run();

 private:
  // The data cursor: from the checkpoint when it recorded one (the layout may have changed
  // since), else derived from the step.
  absl::Status RestoreCursor();
  absl::Status OpenSaver();
  // One optimizer step and its report (the agreement's figures not yet in it).
  absl::StatusOr<StepReport> Step(int64_t step, StepMeter& meter);
  // The step's agreement (step_agreement.h) into r; whether the ranks agreed to stop and
  // whether the schedule takes a periodic checkpoint now.
  absl::Status Agree(int64_t step, StepReport& r, bool& stopping, bool& periodic);
  absl::Status Diverged(int64_t step, const StepStats& stats) const;
  // periodic: may return before the files are written (asynchronous); else committed on return.
  absl::Status Commit(int64_t step_in_stage, bool complete, bool periodic);
  absl::Status Evaluate(int64_t step_in_stage);

  const RankOptions& o_;
  const spec::JobSpec& spec_;
  const spec::StageSpec& stage_;
  const spec::EvalSpec& eval_;
  RankInputs& in_;
  RankState& s_;
  RankSetup& rs_;
  RankReporter& report_;
  Communicator& world_;
  const double flops_per_token_;
  BatchLayout layout_;
  int64_t cursor_ = 0;
  std::unique_ptr<TokenDataset> val_;
  int64_t n_val_ = 0;
  std::unique_ptr<CheckpointSaver> saver_;
  std::unique_ptr<CheckpointSchedule> schedule_;
  // A preemption notice shorter than a step (preemption.h): leave within the grace.
  std::unique_ptr<PreemptionWatch> watch_;
  int64_t skipped_in_a_row_ = 0;
};

absl::Status StageRun::Init() {
  layout_.seq_len = stage_.seq_len;
  layout_.sp_rank = rs_.rt.groups.sp_rank;
  layout_.sp = in_.sp;
  layout_.dp_rank = rs_.rt.groups.dp_rank;
  layout_.dp = in_.dp;
  layout_.grad_accum = std::max<int64_t>(1, spec_.optimizer.grad_accum_steps);
  layout_.micro_batch = std::max<int64_t>(1, spec_.optimizer.micro_batch_size);
  RETURN_IF_ERROR(RestoreCursor());
  ASSIGN_OR_RETURN(val_, OpenDataset(spec_, Split::kValidation, s_.config.vocab_size));
  ASSIGN_OR_RETURN(n_val_, ValidationSequences(spec_, *val_, stage_.seq_len, eval_.max_sequences));
  RETURN_IF_ERROR(OpenSaver());
  // Periodic checkpoints by steps, time or the supervisor's interval (checkpoint_schedule.h).
  ASSIGN_OR_RETURN(schedule_,
                   CheckpointSchedule::Create(spec_.checkpoint, o_.control_stdin, o_.rank));
  watch_ = std::make_unique<PreemptionWatch>(o_.stop_grace_s, o_.rank, saver_.get(), &report_);
  return absl::OkStatus();
}

absl::Status StageRun::RestoreCursor() {
  cursor_ = s_.start_step * layout_.GlobalBatch();
  const ResumePlan& plan = in_.plan;  // its extra checked by PlanResume (training_state.h)
  if (plan.state && plan.state->stage == o_.stage && plan.training.data_cursor) {
    cursor_ = *plan.training.data_cursor;
  }
  return absl::OkStatus();
}

// Synchronous or asynchronous saves (checkpoint_saver.h), agreed by every rank.
absl::Status StageRun::OpenSaver() {
  CheckpointSaver::Options so;
  so.root = in_.checkpoint_root;
  so.keep_last = spec_.checkpoint.keep_last;
  so.async = spec_.checkpoint.async;
  so.snapshot_bytes =
      spec::SnapshotBytesPerRank(spec::CountParameters(s_.config), spec_.model.dtype, o_.world_size,
                                 spec_.parallelism.zero_stage);
  so.ranks_on_host = RanksOnThisHost(rs_.rt.device, o_.world_size);
  so.zero = s_.zero != nullptr;
  so.device = rs_.rt.device;
  so.commit_timeout = s_.collective_timeout;
  ASSIGN_OR_RETURN(saver_, CheckpointSaver::Create(so, world_));
  return absl::OkStatus();
}

absl::StatusOr<StepReport> StageRun::Step(int64_t step, StepMeter& meter) {
  auto t0 = std::chrono::steady_clock::now();
  watch_->NoteStepBegin();
  HangAtFailpoint("train.step", s_.global_step + 1);  // tests: a step that does not end
  meter.Begin();
  ASSIGN_OR_RETURN(std::vector<LocalShard> batches,
                   StepMicroBatches(*s_.train_data, layout_, cursor_));
  meter.BatchesReady();
  const double lr =
      ScheduledLr(spec_.optimizer.schedule, spec_.StageLr(o_.stage), spec_.optimizer.min_lr_ratio,
                  spec_.StageWarmup(o_.stage), stage_.steps, step);
  ASSIGN_OR_RETURN(StepStats stats, s_.trainer->Step(batches, lr, step));
  ++s_.global_step;
  const int64_t step_cursor = cursor_;
  cursor_ += layout_.GlobalBatch();
  skipped_in_a_row_ = stats.skipped ? skipped_in_a_row_ + 1 : 0;
  StepReport r;
  r.stage = o_.stage;
  r.step_in_stage = step + 1;
  r.steps = stage_.steps;
  r.global_step = s_.global_step;
  r.seq_len = stage_.seq_len;
  r.sp = in_.sp;
  r.dp = in_.dp;
  r.lr = lr;
  r.data_cursor = step_cursor;
  r.stats = stats;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  watch_->NoteStepEnd(r.seconds);
  const double tokens = static_cast<double>(stage_.seq_len * layout_.GlobalBatch());
  r.tokens_per_s = tokens / std::max(r.seconds, 1e-9);
  r.rank = meter.Finish(stats, tokens / o_.world_size);
  return r;
}

absl::Status StageRun::Agree(int64_t step, StepReport& r, bool& stopping, bool& periodic) {
  // One collective per step, after the timed phases (the figures above exclude it).
  std::array<float, CheckpointSchedule::kSlots> slots{};
  schedule_->Fill(slots.data(), std::chrono::steady_clock::now());
  torch::Tensor agreed =
      StepAgreement::Pack(StopRequested(), o_.rank, o_.world_size, r.rank->step_seconds, slots)
          .to(rs_.rt.device);
  RETURN_IF_ERROR(world_.AllReduceMax(agreed));
  const StepAgreement a = StepAgreement::Unpack(agreed, o_.world_size);
  stopping = a.stop;
  periodic = schedule_->Decide(a.schedule.data(), /*step_in_stage=*/step + 1);
  r.group = GroupFigures(a.rank_seconds);
  r.mfu = spec::Mfu(flops_per_token_, r.tokens_per_s, o_.world_size, o_.peak_flops);
  return absl::OkStatus();
}

absl::Status StageRun::Diverged(int64_t step, const StepStats& stats) const {
  if (skipped_in_a_row_ < kMaxConsecutiveSkippedSteps) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      spec::fields::PathOf(&spec::JobSpec::stages), "[", o_.stage, "] step ", step + 1, ": ",
      skipped_in_a_row_, " consecutive steps had a non-finite loss or gradient norm (last: loss ",
      stats.loss, ", grad_norm ", stats.grad_norm,
      ") and were skipped; the run diverged (lower optimizer.lr, raise warmup_steps, set "
      "optimizer.grad_clip, use bfloat16 instead of float16, or check the data)"));
}

absl::Status StageRun::Commit(int64_t step_in_stage, bool complete, bool periodic) {
  CommitPoint point{o_.stage, step_in_stage, s_.global_step, complete};
  TrainingState training =
      TrainingStateOf(spec_, s_.config, rs_.rt.sp, rs_.rt.dp, s_.trainer->loss_scaler());
  training.data_cursor = cursor_;
  CheckpointState state = TrainingCheckpointState(spec_, point, rs_.model, *s_.adam,
                                                  std::move(training), s_.zero.get());
  state.owner = CheckpointOwner{o_.tenant, o_.job_id};
  state.adopt = spec_.checkpoint.adopt;
  return periodic ? saver_->Periodic(std::move(state), report_)
                  : saver_->Commit(std::move(state), report_);
}

absl::Status StageRun::Evaluate(int64_t step_in_stage) {
  ZeroSharding* zero = s_.zero.get();
  if (zero) RETURN_IF_ERROR(zero->GatherOuter());  // ZeRO-3: layers are gathered by their hooks
  ASSIGN_OR_RETURN(EvalResult ev,
                   train::Evaluate(rs_.model, rs_.attention, rs_.rt, *val_, n_val_, stage_.seq_len,
                                   spec_.data.synthetic.has_value()));
  if (zero) zero->ReleaseOuter();
  report_.Eval(o_.stage, step_in_stage, stage_.seq_len, ev);
  return absl::OkStatus();
}

absl::StatusOr<RankOutcome> StageRun::Run() {
  const int64_t steps = stage_.steps;
  StepMeter meter(rs_.rt.device, rs_.rt.groups.sp.get(), flops_per_token_);
  for (int64_t step = s_.start_step; step < steps; ++step) {
    ASSIGN_OR_RETURN(StepReport r, Step(step, meter));
    bool stopping = false, periodic = false;
    RETURN_IF_ERROR(Agree(step, r, stopping, periodic));
    RETURN_IF_ERROR(saver_->Poll(report_));  // a background save that committed meanwhile
    if (saver_->last_commit().has_value()) {
      r.checkpoint_age_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *saver_->last_commit())
              .count();
    }
    report_.Step(r);
    RETURN_IF_ERROR(Diverged(step, r.stats));
    const bool last = step + 1 == steps;
    if (stopping && !last) {
      RETURN_IF_ERROR(Commit(step + 1, false, /*periodic=*/false));
      return RankOutcome{true};
    }
    if (periodic && !last) {
      watch_->NoteOtherBegin();
      schedule_->Saved(std::chrono::steady_clock::now());
      RETURN_IF_ERROR(Commit(step + 1, false, /*periodic=*/true));
    }
    if (eval_.every_steps > 0 && (step + 1) % eval_.every_steps == 0 && !last) {
      RETURN_IF_ERROR(Evaluate(step + 1));
    }
  }
  RETURN_IF_ERROR(Evaluate(steps));  // the stage's evaluation, bounded by eval.max_sequences
  RETURN_IF_ERROR(Commit(steps, true, /*periodic=*/false));
  report_.Done(o_.stage, /*with_peak_rss=*/true);
  return RankOutcome{};
}

}  // namespace

absl::StatusOr<RankOutcome> RunStage(const RankOptions& o, RankInputs& in, RankState& s,
                                     RankReporter& report) {
  StageRun run(o, in, s, report);
  RETURN_IF_ERROR(run.Init());
  return run.Run();
}

}  // namespace ulysses::engine::train
