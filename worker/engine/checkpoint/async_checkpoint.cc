#include "worker/engine/checkpoint/async_checkpoint.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/failpoint.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/engine/checkpoint/save_parts.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string FailedMarkerName(int rank, int world) {
  return absl::StrCat("shard-", rank, "-of-", world, ".failed");
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Rank 0's wait for the other ranks' shards: short enough not to delay a commit noticeably,
// long enough that an idle wait costs no CPU worth measuring.
constexpr auto kShardPollInterval = std::chrono::milliseconds(5);

}  // namespace

struct AsyncCheckpointer::Job {
  CheckpointState state;  // the tensors this rank writes are host copies; the others undefined
  std::vector<const NamedTensor*> mine;
  // CUDA copies are issued non-blocking on the current stream; each event marks the end of one
  // device's copies and the writer waits for it before reading the buffers.
  std::vector<c10::Event> copies_done;
  std::string dir;
  Clock::time_point begun;
  double blocked_seconds = 0;
};

AsyncCheckpointer::AsyncCheckpointer(AsyncCheckpointOptions options)
    : options_(std::move(options)) {
  writer_ = std::thread([this] { WriterLoop(); });
}

AsyncCheckpointer::~AsyncCheckpointer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  writer_.join();
}

absl::StatusOr<double> AsyncCheckpointer::Begin(CheckpointState state,
                                                const std::function<absl::Status()>& barrier) {
  const Clock::time_point t0 = Clock::now();
  const int rank = options_.rank, world = options_.world;
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("async checkpoint: rank ", rank, " not in [0, ", world, ")"));
  }
  // 1. At most one save in flight: wait for the previous one (counted).
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &AsyncCheckpointer::IdleLocked));
    if (finished_.has_value() && !finished_->ok()) {
      absl::Status failed = finished_->status();
      finished_.reset();
      return Annotate(failed, "the previous asynchronous checkpoint failed");
    }
  }
  waited_seconds_ += SecondsSince(t0);

  // 2. No file of an earlier attempt at this step survives the barrier.
  const fs::path dir = fs::path(options_.root) / StepDirName(state.global_step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create checkpoint dir ", dir.string(), ": ", ec.message()));
  }
  absl::Status status;
  if (rank == 0 && fs::exists(dir / kManifestName)) {
    fs::remove(dir / kManifestName, ec);
    status = ec ? absl::InternalError(absl::StrCat("cannot remove ", (dir / kManifestName).string(),
                                                   ": ", ec.message()))
                : checkpoint_internal::SyncDirectory(dir.string());
  }
  const std::string shard = checkpoint_internal::ShardFileName(rank, world);
  for (const std::string& stale : {shard, shard + ".tmp", FailedMarkerName(rank, world)}) {
    fs::remove(dir / stale, ec);
    if (ec && status.ok()) {
      status = absl::InternalError(
          absl::StrCat("cannot remove ", (dir / stale).string(), ": ", ec.message()));
    }
  }
  // The barrier is reached even after a failure above, so the peers do not wait for this rank;
  // its shard then never appears and rank 0 does not commit.
  RETURN_IF_ERROR(Annotate(barrier(), "checkpoint barrier (before an asynchronous save)"));
  RETURN_IF_ERROR(status);

  // 3. Snapshot what this rank writes into host memory.
  auto job = std::make_unique<Job>();
  job->dir = dir.string();
  job->begun = t0;
  ASSIGN_OR_RETURN(std::vector<const NamedTensor*> mine,
                   checkpoint_internal::TensorsOfRank(state, rank, world, options_.mode));
  std::vector<bool> owned(state.tensors.size(), false);
  for (const NamedTensor* nt : mine) owned[nt - state.tensors.data()] = true;
  std::vector<c10::Device> cuda_devices;
  size_t slot = 0;
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    NamedTensor& nt = state.tensors[i];
    if (!owned[i]) {
      nt.tensor = torch::Tensor();  // the manifest needs only its name; drop the live reference
      continue;
    }
    const torch::Tensor src = nt.tensor.detach();
    const bool cuda = src.is_cuda();
    if (slot == buffers_.size()) {
      buffers_.emplace_back();
      pinned_.push_back(false);
    }
    torch::Tensor& buf = buffers_[slot];
    // Pinned host memory only for device sources (it makes the copy asynchronous); pinning needs
    // a CUDA runtime, which a CPU-only libtorch does not have, and CPU sources never ask for it.
    if (!buf.defined() || buf.sizes() != src.sizes() || buf.scalar_type() != src.scalar_type() ||
        pinned_[slot] != cuda) {
      buf = torch::empty(src.sizes(),
                         torch::TensorOptions().dtype(src.scalar_type()).pinned_memory(cuda));
      pinned_[slot] = cuda;
    }
    ++slot;
    buf.copy_(src, /*non_blocking=*/cuda);
    if (cuda &&
        std::find(cuda_devices.begin(), cuda_devices.end(), src.device()) == cuda_devices.end()) {
      cuda_devices.push_back(src.device());
    }
    nt.tensor = buf;
  }
  for (const c10::Device& device : cuda_devices) {
    // Recorded on the stream the copies were issued on: the training thread's current stream.
    const c10::Stream stream =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
    job->copies_done.emplace_back(c10::DeviceType::CUDA);
    job->copies_done.back().record(stream);
  }
  job->state = std::move(state);
  for (size_t i = 0; i < job->state.tensors.size(); ++i) {
    if (owned[i]) job->mine.push_back(&job->state.tensors[i]);
  }
  job->blocked_seconds = SecondsSince(t0);
  const double blocked = job->blocked_seconds;
  {
    absl::MutexLock lock(&mu_);
    pending_ = std::move(job);
    busy_ = true;
  }
  return blocked;
}

std::optional<absl::StatusOr<AsyncSaveDone>> AsyncCheckpointer::Poll() {
  absl::MutexLock lock(&mu_);
  std::optional<absl::StatusOr<AsyncSaveDone>> out = std::move(finished_);
  finished_.reset();
  return out;
}

std::optional<absl::StatusOr<AsyncSaveDone>> AsyncCheckpointer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &AsyncCheckpointer::IdleLocked));
  std::optional<absl::StatusOr<AsyncSaveDone>> out = std::move(finished_);
  finished_.reset();
  return out;
}

bool AsyncCheckpointer::WaitIdleUntil(std::chrono::steady_clock::time_point deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(this, &AsyncCheckpointer::IdleLocked),
      absl::Now() + absl::FromChrono(deadline - std::chrono::steady_clock::now()));
}

void AsyncCheckpointer::WriterLoop() {
  while (true) {
    std::unique_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &AsyncCheckpointer::WriterHasWorkLocked));
      if (pending_ == nullptr) return;  // stopping with nothing to write
      job = std::move(pending_);
    }
    const absl::Status status = WriteAndCommit(*job);
    AsyncSaveDone done;
    done.path = job->dir;
    done.stage = job->state.stage;
    done.step_in_stage = job->state.step_in_stage;
    done.global_step = job->state.global_step;
    done.blocked_seconds = job->blocked_seconds;
    done.total_seconds = SecondsSince(job->begun);
    absl::StatusOr<AsyncSaveDone> result = std::move(done);
    if (!status.ok()) {
      ULOG(ERROR) << "asynchronous checkpoint " << job->dir << " failed: " << status;
      result = status;
    }
    job.reset();  // drops the references to the host buffers before the next Begin reuses them
    {
      absl::MutexLock lock(&mu_);
      finished_ = std::move(result);
      busy_ = false;
    }
  }
}

absl::Status AsyncCheckpointer::WriteAndCommit(Job& job) {
  for (c10::Event& event : job.copies_done) {
    while (!event.query()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const int rank = options_.rank, world = options_.world;
  const fs::path dir(job.dir);
  absl::Status written = checkpoint_internal::WriteShardFile(
      (dir / checkpoint_internal::ShardFileName(rank, world)).string(), job.mine, rank, world);
  if (!written.ok()) {
    // Tells rank 0 at once instead of after its commit timeout.
    absl::Status marked = checkpoint_internal::WriteSmallFileAtomic(
        (dir / FailedMarkerName(rank, world)).string(), written.ToString());
    if (!marked.ok()) ULOG(ERROR) << "cannot mark the failed shard: " << marked;
    return written;
  }
  if (rank != 0) return absl::OkStatus();
  RETURN_IF_ERROR(AwaitShards(job.dir, job.state.global_step));
  // The failpoint (tests only, common/failpoint.h) holds rank 0's writer here with every shard on
  // disk and no manifest, while the training thread goes on.
  HangAtFailpoint("checkpoint.before_manifest", job.state.global_step);
  RETURN_IF_ERROR(checkpoint_internal::WriteManifest(job.dir, job.state, world, options_.mode));
  checkpoint_internal::AfterCommit(options_.root, job.dir, world, options_.keep_last, job.state);
  return absl::OkStatus();
}

absl::Status AsyncCheckpointer::AwaitShards(const std::string& dir, int64_t step) {
  const Clock::time_point deadline = Clock::now() + options_.commit_timeout;
  for (int r = 1; r < options_.world; ++r) {
    const fs::path shard = fs::path(dir) / checkpoint_internal::ShardFileName(r, options_.world);
    const fs::path failed = fs::path(dir) / FailedMarkerName(r, options_.world);
    while (!fs::exists(shard)) {
      if (fs::exists(failed)) {
        return absl::InternalError(absl::StrCat("checkpoint step ", step, ": rank ", r,
                                                " could not write its shard: ", ReadText(failed)));
      }
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) {
          return absl::CancelledError(absl::StrCat("checkpoint step ", step,
                                                   ": abandoned while waiting for rank ", r,
                                                   "'s shard (the rank is shutting down)"));
        }
      }
      if (Clock::now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "checkpoint step ", step, ": rank ", r, "'s shard ", shard.string(),
            " did not appear within ",
            std::chrono::duration_cast<std::chrono::seconds>(options_.commit_timeout).count(),
            " s (is the checkpoint root shared by every rank?)"));
      }
      std::this_thread::sleep_for(kShardPollInterval);
    }
  }
  return absl::OkStatus();
}

}  // namespace ulysses::engine
