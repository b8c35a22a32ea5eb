#include "worker/engine/train/checkpoint_saver.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/process/host_memory.h"
#include "common/spec/memory_model.h"
#include "common/status.h"

namespace ulysses::engine::train {

absl::StatusOr<std::unique_ptr<CheckpointSaver>> CheckpointSaver::Create(const Options& options,
                                                                         Communicator& world) {
  const double per_rank = static_cast<double>(process::AvailableHostMemoryBytes()) /
                          static_cast<double>(std::max(1, options.ranks_on_host));
  spec::CheckpointModeChoice choice =
      spec::ChooseCheckpointMode(options.async, options.snapshot_bytes, per_rank);
  // Every rank must save the same way: one that cannot afford the snapshot makes all synchronous.
  torch::Tensor sync_votes = torch::zeros({1}, torch::kFloat32);
  sync_votes[0] = choice.async ? 0.0f : 1.0f;
  sync_votes = sync_votes.to(options.device);  // NCCL reduces device tensors
  RETURN_IF_ERROR(Annotate(world.AllReduceMax(sync_votes), "agreeing on the checkpoint mode"));
  if (choice.async && sync_votes.cpu().item<float>() > 0) {
    choice.async = false;
    choice.reason = "synchronous: another rank's host cannot hold its snapshot (see its log)";
  }
  std::unique_ptr<CheckpointSaver> saver(new CheckpointSaver(options, world));
  saver->reason_ = choice.reason;
  if (choice.async) {
    AsyncCheckpointOptions o;
    o.root = options.root;
    o.rank = world.rank();
    o.world = world.size();
    o.keep_last = options.keep_last;
    o.mode = options.zero ? SaveMode::kOwned : SaveMode::kReplicated;
    o.commit_timeout = options.commit_timeout;
    saver->async_ = std::make_unique<AsyncCheckpointer>(o);
  }
  ULOG(INFO) << "rank " << world.rank() << ": checkpoints are "
             << (choice.async ? "asynchronous" : "synchronous") << " (" << choice.reason << ")";
  return saver;
}

absl::Status CheckpointSaver::SaveSync(CheckpointState state, RankReporter& report) {
  const auto t0 = std::chrono::steady_clock::now();
  Communicator* w = &world_;
  ASSIGN_OR_RETURN(std::string path, SaveCheckpoint(
                                         options_.root, state, w->rank(), w->size(),
                                         options_.keep_last, [w] { return w->Barrier(); },
                                         options_.zero ? SaveMode::kOwned : SaveMode::kReplicated));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report.Checkpoint(static_cast<int>(state.stage), state.step_in_stage, path, seconds, seconds);
  last_save_seconds_ = seconds;
  last_commit_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::Status CheckpointSaver::Report(std::optional<absl::StatusOr<AsyncSaveDone>> done,
                                     RankReporter& report) {
  if (!done.has_value()) return absl::OkStatus();
  if (!done->ok()) return Annotate(done->status(), "asynchronous checkpoint");
  const AsyncSaveDone& d = **done;
  // Only rank 0's report is printed (RankReporter); its save finished with the commit.
  report.Checkpoint(static_cast<int>(d.stage), d.step_in_stage, d.path, d.total_seconds,
                    d.blocked_seconds);
  last_save_seconds_ = d.total_seconds;
  last_commit_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

absl::Status CheckpointSaver::Periodic(CheckpointState state, RankReporter& report) {
  if (!async_) return SaveSync(std::move(state), report);
  Communicator* w = &world_;
  ASSIGN_OR_RETURN(double blocked, async_->Begin(std::move(state), [w] { return w->Barrier(); }));
  (void)blocked;  // reported with the commit (AsyncSaveDone::blocked_seconds)
  // Begin may have waited for the previous save: report it now.
  return Report(async_->Poll(), report);
}

absl::Status CheckpointSaver::Commit(CheckpointState state, RankReporter& report) {
  if (async_) RETURN_IF_ERROR(Report(async_->Wait(), report));
  return SaveSync(std::move(state), report);
}

bool CheckpointSaver::DrainBeforeExit(std::chrono::steady_clock::time_point deadline,
                                      RankReporter& report) {
  if (!async_) return true;
  const bool idle = async_->WaitIdleUntil(deadline);
  std::optional<absl::StatusOr<AsyncSaveDone>> done = async_->Poll();
  if (done.has_value() && done->ok()) {
    const AsyncSaveDone& d = **done;
    report.Checkpoint(static_cast<int>(d.stage), d.step_in_stage, d.path, d.total_seconds,
                      d.blocked_seconds);
  } else if (done.has_value()) {
    ULOG(ERROR) << "the asynchronous checkpoint in flight failed: " << done->status();
  }
  return idle;
}

absl::Status CheckpointSaver::Poll(RankReporter& report) {
  if (!async_) return absl::OkStatus();
  return Report(async_->Poll(), report);
}

}  // namespace ulysses::engine::train
