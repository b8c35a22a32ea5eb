// One `ulysses-train rank` and one evaluation rank, as sequences of their pieces: the training
// rank resolves its inputs and resume plan (rank_state.h), builds its state (rank_state.h) and runs
// the stage loop (stage_loop.h); the evaluation rank loads weights and runs evaluate.h. Errors
// from libtorch are caught here (guard.h), at the engine's edge.
#include "worker/engine/train/engine.h"

#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/stop.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/train/guard.h"
#include "worker/engine/train/host_threads.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/rank_events.h"
#include "worker/engine/train/rank_setup.h"
#include "worker/engine/train/rank_state.h"
#include "worker/engine/train/resume.h"
#include "worker/engine/train/stage_loop.h"

namespace ulysses::engine::train {
namespace {

namespace fs = std::filesystem;
using model::LlamaConfig;

absl::StatusOr<RankOutcome> RunRankImpl(const RankOptions& o) {
  ASSIGN_OR_RETURN(RankInputs in, ResolveRankInputs(o));
  InstallStopSignalHandlers();
  if (o.intra_op_threads > 0) SetIntraOpThreads(o.intra_op_threads);
  RankReporter report(o.rank == 0, o.out_dir, o.rank == 0 || o.step_events_all_ranks,
                      o.progress_line);
  // Decide where we start before touching the network (bad input fails fast on every rank).
  ASSIGN_OR_RETURN(in.plan,
                   PlanResume(in.checkpoint_root, spec::SpecHash(in.spec), o.stage,
                              CheckpointOwner{o.tenant, o.job_id}, in.spec.checkpoint.adopt));
  if (in.plan.stage_done) {
    // The stage finished in an earlier run: its committed final checkpoint is this run's result
    // (rank 0 reports it; seconds 0, no blocked time: nothing was saved now).
    if (in.plan.state.has_value()) {
      report.Checkpoint(o.stage, in.plan.state->step_in_stage, in.plan.path, 0.0, std::nullopt);
    }
    report.Done(o.stage, /*with_peak_rss=*/false);
    return RankOutcome{};
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RankState> state, BuildRankState(o, in));
  return RunStage(o, in, *state, report);
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
    const std::string where = absl::StrCat("checkpoint ", o.checkpoint);
    ASSIGN_OR_RETURN(const TrainingState training, TrainingState::FromJson(st.extra, where));
    ASSIGN_OR_RETURN(config, training.ModelConfig(where));
    state = std::move(st);
  } else {
    std::string init = o.init_from.empty() ? spec.model.init_from : o.init_from;
    if (!init.empty()) spec.model.init_from = init;
    ASSIGN_OR_RETURN(config, ResolveModelConfig(spec, init));
    spec.ApplyStageRope(spec.stages.size() - 1, &config);  // Evaluated at the last stage's.
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
