#include "worker/engine/parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#ifdef ULYSSES_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "worker/engine/parallel/alltoall_clock.h"
#include "worker/engine/parallel/group_health.h"

namespace ulysses::engine::internal {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<ncclDataType_t> NcclType(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return ncclFloat32;
    case c10::kDouble:
      return ncclFloat64;
    case c10::kHalf:
      return ncclFloat16;
    case c10::kBFloat16:
      return ncclBfloat16;
    case c10::kInt:
      return ncclInt32;
    case c10::kLong:
      return ncclInt64;
    case c10::kByte:
      return ncclUint8;
    case c10::kBool:
      return ncclUint8;
    case c10::kChar:
      return ncclInt8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("nccl: dtype ", c10::toString(t), " is not supported"));
  }
}

absl::Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

// The stream libtorch runs the caller's kernels on (its current stream on `device`): every
// collective is enqueued there, so it is ordered after the kernels that produced its inputs and
// before those that read its outputs, and the caching allocator's stream-ordered reuse covers its
// buffers. Without a CUDA libtorch (compile-only builds) there are no CUDA tensors; the legacy
// default stream, libtorch's default, stands in.
cudaStream_t ComputeStream(int device) {
#ifdef ULYSSES_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}

// Collectives are asynchronous: each is enqueued on the compute stream and returns at once (no
// host wait). A watchdog thread follows them through a CUDA event recorded after each one: a
// collective not done by its deadline, an asynchronous NCCL error or Abort() aborts the
// communicator (ncclCommAbort, which also ends kernels stuck waiting for a dead peer) and the next
// call on this group returns the failure. All-to-all time is measured between two CUDA events
// around the exchange (device time, not host waits) and added to the SeqAllToAll clock when the
// watchdog sees the second event complete.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::string name, int rank, int size, int device,
                   std::chrono::milliseconds timeout)
      : name_(name),
        rank_(rank),
        size_(size),
        device_(device),
        timeout_(timeout),
        health_("nccl", std::move(name)) {}
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() override {
    {
      // Collectives still in flight finish first (the peers wait on them), within the timeout;
      // the watchdog aborts the communicator if they do not.
      absl::MutexLock lock(&mu_);
      if (watchdog_.joinable()) {
        mu_.AwaitWithTimeout(absl::Condition(this, &NcclCommunicator::SettledLocked),
                             absl::FromChrono(timeout_ + std::chrono::seconds(1)));
      }
      stop_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    bool pending = false;
    {
      absl::MutexLock lock(&mu_);
      for (Pending& p : pending_) {
        pending = pending || cudaEventQuery(p.done) == cudaErrorNotReady;
        ReleaseEvents(p);
      }
    }
    absl::MutexLock comm_lock(&comm_mu_);
    if (comm_ != nullptr) {
      // Unfinished work at destruction means a peer is gone: abort rather than wait on it.
      if (pending || health_.broken() || health_.aborted() || failed_.load()) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    absl::MutexLock events_lock(&events_mu_);
    for (cudaEvent_t e : free_plain_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_timed_) cudaEventDestroy(e);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  // Creates the communicator (the unique id comes from the store) and starts the watchdog.
  absl::Status Init(c10d::Store& store) {
    // Held throughout (no other thread exists yet): Check reads comm_.
    absl::MutexLock comm_lock(&comm_mu_);
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(device_), absl::StrCat("cudaSetDevice(", device_, ")")));
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc"));
    ncclUniqueId id;
    const std::string key = "nccl_unique_id";
    try {
      if (rank_ == 0) {
        RETURN_IF_ERROR(Check(ncclGetUniqueId(&id), "ncclGetUniqueId"));
        std::vector<uint8_t> bytes(sizeof(id));
        std::memcpy(bytes.data(), &id, sizeof(id));
        store.set(key, bytes);
      } else {
        std::vector<uint8_t> bytes = store.get(key);  // waits up to the store timeout
        if (bytes.size() != sizeof(id)) {
          return absl::InternalError("nccl: unique id from the store has the wrong size");
        }
        std::memcpy(&id, bytes.data(), sizeof(id));
      }
    } catch (const std::exception& e) {
      std::string msg = e.what();
      return absl::UnavailableError(absl::StrCat(
          "nccl group '", name_, "': unique id exchange: ", msg.substr(0, msg.find('\n'))));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // Init and enqueues return at once: the deadline and Abort() apply.
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) return Check(r, "ncclCommInitRankConfig");
    RETURN_IF_ERROR(WaitEnqueued("init"));
    watchdog_ = std::thread([this] { Watch(); });
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllToAll(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(Usable("alltoall"));
    if (!in.is_contiguous() || !out.is_contiguous() || in.sizes() != out.sizes() ||
        in.scalar_type() != out.scalar_type() || in.dim() == 0 || in.size(0) % size_ != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllToAll(", name_,
                       "): in/out must be contiguous with equal shape and dtype and dim 0 "
                       "divisible by the group size (",
                       size_, ")"));
    }
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.scalar_type()));
    const size_t chunk = static_cast<size_t>(in.numel() / size_);
    const size_t chunk_bytes = chunk * in.element_size();
    auto* src = static_cast<char*>(in.data_ptr());
    auto* dst = static_cast<char*>(out.data_ptr());
    const cudaStream_t stream = ComputeStream(device_);
    cudaEvent_t start = TakeEvent(/*timed=*/true);
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start, stream), "cudaEventRecord"));
    absl::MutexLock comm_lock(&comm_mu_);
    RETURN_IF_ERROR(Check(ncclGroupStart(), "ncclGroupStart"));
    for (int peer = 0; peer < size_; ++peer) {
      ncclSend(src + peer * chunk_bytes, chunk, type, peer, comm_, stream);
      ncclRecv(dst + peer * chunk_bytes, chunk, type, peer, comm_, stream);
    }
    RETURN_IF_ERROR(Enqueued(ncclGroupEnd(), "alltoall", stream, start));
    bytes_sent_ += static_cast<int64_t>(chunk_bytes) * (size_ - 1);
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(std::vector<torch::Tensor>& tensors) override {
    RETURN_IF_ERROR(Usable("allreduce"));
    std::vector<ncclDataType_t> types;
    for (auto& t : tensors) {
      if (!t.is_contiguous()) {
        return absl::InvalidArgumentError("AllReduceSum(nccl): tensors must be contiguous");
      }
      ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(t.scalar_type()));
      types.push_back(type);
    }
    const cudaStream_t stream = ComputeStream(device_);
    absl::MutexLock comm_lock(&comm_mu_);
    RETURN_IF_ERROR(Check(ncclGroupStart(), "ncclGroupStart"));
    for (size_t i = 0; i < tensors.size(); ++i) {
      ncclAllReduce(tensors[i].data_ptr(), tensors[i].data_ptr(), tensors[i].numel(), types[i],
                    ncclSum, comm_, stream);
    }
    return Enqueued(ncclGroupEnd(), "allreduce", stream);
  }

  absl::Status ReduceScatterSum(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(Usable("reduce_scatter"));
    if (!in.is_contiguous() || !out.is_contiguous() || in.scalar_type() != out.scalar_type() ||
        in.numel() != out.numel() * size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReduceScatterSum(", name_, "): tensors must be contiguous, one dtype, in = ", size_,
          " x out elements"));
    }
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.scalar_type()));
    const cudaStream_t stream = ComputeStream(device_);
    absl::MutexLock comm_lock(&comm_mu_);
    return Enqueued(
        ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), type, ncclSum, comm_, stream),
        "reduce_scatter", stream);
  }

  absl::Status AllGather(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(Usable("allgather"));
    if (!in.is_contiguous() || !out.is_contiguous() || in.scalar_type() != out.scalar_type() ||
        out.numel() != in.numel() * size_) {
      return absl::InvalidArgumentError(absl::StrCat("AllGather(", name_,
                                                     "): tensors must be contiguous, one dtype, "
                                                     "out = ",
                                                     size_, " x in elements"));
    }
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.scalar_type()));
    const cudaStream_t stream = ComputeStream(device_);
    absl::MutexLock comm_lock(&comm_mu_);
    return Enqueued(ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), type, comm_, stream),
                    "allgather", stream);
  }

  absl::Status AllReduceMax(torch::Tensor& t) override {
    RETURN_IF_ERROR(Usable("allreduce_max"));
    if (!t.is_contiguous()) return absl::InvalidArgumentError("AllReduceMax: not contiguous");
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(t.scalar_type()));
    const cudaStream_t stream = ComputeStream(device_);
    absl::MutexLock comm_lock(&comm_mu_);
    return Enqueued(
        ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), type, ncclMax, comm_, stream),
        "allreduce_max", stream);
  }

  absl::Status Broadcast(torch::Tensor& t, int root) override {
    RETURN_IF_ERROR(Usable("broadcast"));
    if (!t.is_contiguous() || root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("Broadcast(", name_,
                                                     "): tensor must be contiguous and root ", root,
                                                     " in [0, ", size_, ")"));
    }
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(t.scalar_type()));
    const cudaStream_t stream = ComputeStream(device_);
    absl::MutexLock comm_lock(&comm_mu_);
    return Enqueued(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), type, root, comm_, stream),
                    "broadcast", stream);
  }

  // The one host wait: a barrier returns when every rank reached it (and this rank's earlier
  // work on the compute stream is done).
  absl::Status Barrier() override {
    RETURN_IF_ERROR(Usable("barrier"));
    const cudaStream_t stream = ComputeStream(device_);
    cudaEvent_t done = nullptr;
    {
      absl::MutexLock comm_lock(&comm_mu_);
      RETURN_IF_ERROR(
          Enqueued(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream),
                   "barrier", stream, nullptr, &done));
    }
    {
      absl::MutexLock lock(&mu_);
      auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return failed_.load() || !IsPendingLocked(done);
      };
      mu_.Await(absl::Condition(&released));
    }
    return Usable("barrier");
  }

  void Abort() override {
    health_.Abort();
    // Releasing mu_ makes the watchdog re-evaluate its wait: it aborts the communicator
    // (cancelling pending collectives).
    absl::MutexLock lock(&mu_);
  }

  int64_t bytes_sent() const override { return bytes_sent_; }
  bool times_alltoall() const override { return true; }

 private:
  struct Pending {
    cudaEvent_t start = nullptr;  // Timed events around an all-to-all, else null.
    cudaEvent_t done = nullptr;
    Clock::time_point deadline;
    std::string op;
  };

  absl::Status Check(ncclResult_t r, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_) {
    if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
    health_.MarkBroken();
    return absl::UnavailableError(absl::StrCat("nccl ", what, " on group '", name_,
                                               "': ", ncclGetErrorString(r), " ",
                                               ncclGetLastError(comm_)));
  }

  // OK when the group can take another collective; else the watchdog's failure (timeout, NCCL
  // error, abort) or GroupHealth's.
  absl::Status Usable(const std::string& op) {
    if (failed_.load()) {
      health_.MarkBroken();
      absl::MutexLock lock(&mu_);
      if (health_.aborted()) return health_.AbortedError(op);
      return failure_;
    }
    return health_.CheckUsable(op);
  }

  // A non-blocking communicator may still be enqueueing when the call returns (ncclInProgress,
  // rare): wait for the enqueue, not for the collective. Holds comm_mu_.
  absl::Status WaitEnqueued(const std::string& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_) {
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return Check(r, op);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return Check(state, op);
      if (health_.aborted() || Clock::now() > deadline) {
        health_.MarkBroken();
        ncclCommAbort(comm_);
        comm_ = nullptr;
        if (health_.aborted()) return health_.AbortedError(op);
        return absl::DeadlineExceededError(
            absl::StrCat("nccl ", op, " on group '", name_, "': enqueue timed out after ",
                         timeout_.count(), " ms (communicator aborted)"));
      }
      std::this_thread::yield();
    }
  }

  // After an enqueue call (comm_mu_ held): records the completion event on `stream` and hands it
  // to the watchdog. `start`: the all-to-all's timed start event (else null). `done_out`: the
  // completion event, for Barrier's wait.
  absl::Status Enqueued(ncclResult_t enqueue, const std::string& op, cudaStream_t stream,
                        cudaEvent_t start = nullptr, cudaEvent_t* done_out = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_) {
    Pending p;
    p.start = start;
    p.op = op;
    absl::Status status = Check(enqueue, op);
    if (status.ok()) status = WaitEnqueued(op);
    if (status.ok()) {
      p.done = TakeEvent(/*timed=*/start != nullptr);
      status = CudaStatus(cudaEventRecord(p.done, stream), absl::StrCat("nccl ", op, " record"));
    }
    if (!status.ok()) {
      ReleaseEvents(p);
      return status;
    }
    p.deadline = Clock::now() + timeout_;
    if (done_out != nullptr) *done_out = p.done;
    absl::MutexLock lock(&mu_);  // Order: comm_mu_, then mu_.
    pending_.push_back(std::move(p));
    return absl::OkStatus();
  }

  bool IsPendingLocked(cudaEvent_t done) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Pending& p : pending_) {
      if (p.done == done) return true;
    }
    return false;
  }

  cudaEvent_t TakeEvent(bool timed) {
    absl::MutexLock lock(&events_mu_);
    std::vector<cudaEvent_t>& pool = timed ? free_timed_ : free_plain_;
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cudaEventCreateWithFlags(&e, timed ? cudaEventDefault : cudaEventDisableTiming);
    return e;
  }

  void ReleaseEvents(Pending& p) {
    absl::MutexLock lock(&events_mu_);
    if (p.start != nullptr) {
      free_timed_.push_back(p.start);
      if (p.done != nullptr) free_timed_.push_back(p.done);
    } else if (p.done != nullptr) {
      free_plain_.push_back(p.done);
    }
    p.start = p.done = nullptr;
  }

  // Records the first failure and wakes Barrier; the caller then calls AbortComm (without mu_).
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failed_.load()) failure_ = std::move(status);
    failed_.store(true);  // Barrier's wait re-evaluates as mu_ is released.
  }

  // Kernels waiting on a dead peer end; the stream moves on. Takes comm_mu_ (never under mu_).
  void AbortComm() {
    absl::MutexLock comm_lock(&comm_mu_);
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  // The watchdog: retires completed collectives in order (adding all-to-all device time to the
  // SeqAllToAll clock) and fails the group on a deadline, an NCCL error or Abort(). Only this
  // thread pops pending_ (the issuing thread only appends), so `front` stays valid while mu_ is
  // released around the calls that take comm_mu_ (lock order: comm_mu_, then mu_).
  void Watch() {
    cudaSetDevice(device_);
    mu_.Lock();
    while (!stop_) {
      if (health_.aborted() && !failed_.load()) {
        FailLocked(health_.AbortedError("collective"));
        mu_.Unlock();
        AbortComm();
        mu_.Lock();
        continue;
      }
      if (pending_.empty() || failed_.load()) {
        mu_.Await(absl::Condition(this, &NcclCommunicator::WatchdogHasWorkLocked));
        continue;
      }
      Pending& front = pending_.front();
      const cudaError_t q = cudaEventQuery(front.done);
      if (q == cudaSuccess) {
        if (front.start != nullptr) {
          float ms = 0;
          if (cudaEventElapsedTime(&ms, front.start, front.done) == cudaSuccess) {
            AddSeqAllToAllSeconds(ms / 1e3);
          }
        }
        ReleaseEvents(front);
        pending_.pop_front();  // Barrier's wait for its event re-evaluates as mu_ is released.
        continue;
      }
      absl::Status failure;
      if (q != cudaErrorNotReady) {
        failure = CudaStatus(q, absl::StrCat("nccl ", front.op, " on group '", name_, "'"));
      } else if (Clock::now() > front.deadline) {
        failure = absl::DeadlineExceededError(absl::StrCat("nccl ", front.op, " on group '", name_,
                                                           "' timed out after ", timeout_.count(),
                                                           " ms (communicator aborted)"));
      } else {
        const std::string op = front.op;
        mu_.Unlock();
        ncclResult_t state = ncclSuccess;
        {
          absl::MutexLock comm_lock(&comm_mu_);
          if (comm_ != nullptr) ncclCommGetAsyncError(comm_, &state);
        }
        mu_.Lock();
        if (state != ncclSuccess && state != ncclInProgress) {
          failure = absl::UnavailableError(
              absl::StrCat("nccl ", op, " on group '", name_, "': ", ncclGetErrorString(state)));
        }
      }
      if (!failure.ok()) {
        FailLocked(std::move(failure));
        mu_.Unlock();
        AbortComm();
        mu_.Lock();
        continue;
      }
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(1));  // Polls the event.
    }
    mu_.Unlock();
  }

  // The destructor's wait: nothing in flight, or the group failed.
  bool SettledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.empty() || failed_.load();
  }
  // The watchdog's wait: stopping, a collective to retire, or an Abort() to act on.
  bool WatchdogHasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (!pending_.empty() && !failed_.load()) ||
           (health_.aborted() && !failed_.load());
  }

  std::string name_;
  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  // Lock order: comm_mu_, then mu_, then events_mu_ (ACQUIRED_AFTER below).
  absl::Mutex comm_mu_;  // The issuing thread's enqueues and the watchdog's abort.
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_) = nullptr;
  void* scratch_ = nullptr;
  GroupHealth health_;
  int64_t bytes_sent_ = 0;

  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(comm_mu_);
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;

  absl::Mutex events_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<cudaEvent_t> free_plain_ ABSL_GUARDED_BY(events_mu_);
  std::vector<cudaEvent_t> free_timed_ ABSL_GUARDED_BY(events_mu_);
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& name, int rank, int size,
    int device_index, std::chrono::milliseconds timeout) {
  if (device_index >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl group '", name, "': device cuda:", device_index, " not present (",
                     CudaDeviceCount(), " CUDA devices visible); fix comm.device or use gloo"));
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store);
  auto comm = std::make_unique<NcclCommunicator>(name, rank, size, device_index, timeout);
  RETURN_IF_ERROR(comm->Init(*prefixed));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace ulysses::engine::internal
