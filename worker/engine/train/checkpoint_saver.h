// How the rank loop saves checkpoints: synchronously (CommitTraining, resume.h) or in the
// background (AsyncCheckpointer, worker/engine/checkpoint/async_checkpoint.h). The mode is
// chosen once per run, by every rank together: spec.checkpoint.async when set, else
// spec::ChooseCheckpointMode on this rank's snapshot bytes against the host memory per rank
// (MemAvailable / the ranks this host runs); if any rank cannot, all save synchronously (the two
// modes' barriers differ, so every rank must use the same one).
//
// Periodic saves go through Periodic(): asynchronous ones return after the host snapshot and
// are reported (rank 0's checkpoint event, with blocked_seconds) by Poll() once committed, at a
// later step boundary. The stage-end and stop saves go through Commit(), which first waits for
// the save in flight (reporting it) and then commits synchronously: when it returns the
// checkpoint is on disk on every rank.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_CHECKPOINT_SAVER_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_CHECKPOINT_SAVER_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/engine/checkpoint/async_checkpoint.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/train/optimizer.h"
#include "worker/engine/train/rank_events.h"
#include "worker/engine/train/resume.h"
#include "worker/engine/train/zero.h"

namespace ulysses::engine::train {

class CheckpointSaver {
 public:
  struct Options {
    std::string root;
    int64_t keep_last = 2;
    std::optional<bool> async;           // spec.checkpoint.async
    double snapshot_bytes = 0;           // spec::SnapshotBytesPerRank for this job and layout
    int ranks_on_host = 1;               // ranks sharing this host's memory
    bool zero = false;                   // ZeRO: each rank saves its own pieces (SaveMode::kOwned)
    torch::Device device = torch::kCPU;  // the training device (the mode vote's tensor lives there)
    std::chrono::milliseconds commit_timeout{std::chrono::minutes(10)};
  };

  // Collective over `world` (one small all-reduce).
  static absl::StatusOr<std::unique_ptr<CheckpointSaver>> Create(const Options& options,
                                                                 Communicator& world);

  bool async() const { return async_ != nullptr; }
  const std::string& reason() const { return reason_; }
  // When this run last committed a checkpoint (or learned that it had), if it has.
  std::optional<std::chrono::steady_clock::time_point> last_commit() const { return last_commit_; }

  // Collective: a periodic save of `state` (TrainingCheckpointState).
  absl::Status Periodic(CheckpointState state, RankReporter& report);
  // Collective: a save that is committed on every rank when it returns.
  absl::Status Commit(CheckpointState state, RankReporter& report);
  // Reports a background save that finished since the last call; its error if it failed.
  absl::Status Poll(RankReporter& report);

  // Seconds of the last save from start to durable (synchronous or background; 0 = none yet).
  // Any thread.
  double last_save_seconds() const { return last_save_seconds_.load(); }
  // The preemption watch's thread (preemption.h), with the training thread stuck in a step:
  // waits until `deadline` for the background save in flight, if any, and reports it when it
  // committed. True when no save is left in flight. The process exits right after.
  bool DrainBeforeExit(std::chrono::steady_clock::time_point deadline, RankReporter& report);

 private:
  CheckpointSaver(const Options& options, Communicator& world) : options_(options), world_(world) {}
  absl::Status Report(std::optional<absl::StatusOr<AsyncSaveDone>> done, RankReporter& report);
  absl::Status SaveSync(CheckpointState state, RankReporter& report);

  const Options options_;
  Communicator& world_;
  std::unique_ptr<AsyncCheckpointer> async_;
  std::string reason_;
  std::optional<std::chrono::steady_clock::time_point> last_commit_;
  std::atomic<double> last_save_seconds_{0};
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_CHECKPOINT_SAVER_H_
