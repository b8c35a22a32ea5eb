#include "worker/engine/parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <cstring>
#include <exception>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
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
    if (comm_ != nullptr) {
      if (health_.broken() || health_.aborted()) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Creates the stream and the communicator; the unique id comes from the store.
  absl::Status Init(c10d::Store& store) {
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(device_), absl::StrCat("cudaSetDevice(", device_, ")")));
    // A blocking stream: ordered after prior work on the legacy default stream (libtorch's
    // default).
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreate(&stream_), "cudaStreamCreate"));
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
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) return Check(r, "ncclCommInitRankConfig");
    return WaitComm("init");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllToAll(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(health_.CheckUsable("alltoall"));
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
    RETURN_IF_ERROR(Check(ncclGroupStart(), "ncclGroupStart"));
    for (int peer = 0; peer < size_; ++peer) {
      ncclSend(src + peer * chunk_bytes, chunk, type, peer, comm_, stream_);
      ncclRecv(dst + peer * chunk_bytes, chunk, type, peer, comm_, stream_);
    }
    RETURN_IF_ERROR(Finish(ncclGroupEnd(), "alltoall"));
    bytes_sent_ += static_cast<int64_t>(chunk_bytes) * (size_ - 1);
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(std::vector<torch::Tensor>& tensors) override {
    RETURN_IF_ERROR(health_.CheckUsable("allreduce"));
    for (auto& t : tensors) {
      if (!t.is_contiguous()) {
        return absl::InvalidArgumentError("AllReduceSum(nccl): tensors must be contiguous");
      }
    }
    RETURN_IF_ERROR(Check(ncclGroupStart(), "ncclGroupStart"));
    for (auto& t : tensors) {
      auto type = NcclType(t.scalar_type());
      if (!type.ok()) {
        ncclGroupEnd();
        return type.status();
      }
      ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), *type, ncclSum, comm_, stream_);
    }
    return Finish(ncclGroupEnd(), "allreduce");
  }

  absl::Status ReduceScatterSum(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(health_.CheckUsable("reduce_scatter"));
    if (!in.is_contiguous() || !out.is_contiguous() || in.scalar_type() != out.scalar_type() ||
        in.numel() != out.numel() * size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReduceScatterSum(", name_, "): tensors must be contiguous, one dtype, in = ", size_,
          " x out elements"));
    }
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.scalar_type()));
    return Finish(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), type, ncclSum,
                                    comm_, stream_),
                  "reduce_scatter");
  }

  absl::Status AllGather(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(health_.CheckUsable("allgather"));
    if (!in.is_contiguous() || !out.is_contiguous() || in.scalar_type() != out.scalar_type() ||
        out.numel() != in.numel() * size_) {
      return absl::InvalidArgumentError(absl::StrCat("AllGather(", name_,
                                                     "): tensors must be contiguous, one dtype, "
                                                     "out = ",
                                                     size_, " x in elements"));
    }
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.scalar_type()));
    return Finish(ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), type, comm_, stream_),
                  "allgather");
  }

  absl::Status AllReduceMax(torch::Tensor& t) override {
    RETURN_IF_ERROR(health_.CheckUsable("allreduce_max"));
    if (!t.is_contiguous()) return absl::InvalidArgumentError("AllReduceMax: not contiguous");
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(t.scalar_type()));
    return Finish(
        ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), type, ncclMax, comm_, stream_),
        "allreduce_max");
  }

  absl::Status Broadcast(torch::Tensor& t, int root) override {
    RETURN_IF_ERROR(health_.CheckUsable("broadcast"));
    if (!t.is_contiguous() || root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("Broadcast(", name_,
                                                     "): tensor must be contiguous and root ", root,
                                                     " in [0, ", size_, ")"));
    }
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(t.scalar_type()));
    return Finish(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), type, root, comm_, stream_),
                  "broadcast");
  }

  absl::Status Barrier() override {
    RETURN_IF_ERROR(health_.CheckUsable("barrier"));
    return Finish(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_),
                  "barrier");
  }

  void Abort() override {
    health_.Abort();
    // ncclCommAbort is documented as safe to call while other operations are pending.
  }

  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  absl::Status Check(ncclResult_t r, const std::string& what) {
    if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
    health_.MarkBroken();
    return absl::UnavailableError(absl::StrCat("nccl ", what, " on group '", name_,
                                               "': ", ncclGetErrorString(r), " ",
                                               ncclGetLastError(comm_)));
  }

  // Polls the communicator's async state until it leaves ncclInProgress, or the timeout.
  absl::Status WaitComm(const std::string& op) {
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return Check(r, op);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return Check(state, op);
      if (health_.aborted() || Clock::now() > deadline) return TimeOut(op);
      std::this_thread::yield();
    }
  }

  // Waits for an enqueued operation: first the (non-blocking) enqueue, then the stream, polling the
  // async error so that a dead peer or the timeout ends the wait.
  absl::Status Finish(ncclResult_t enqueue, const std::string& op) {
    RETURN_IF_ERROR(Check(enqueue, op));
    RETURN_IF_ERROR(WaitComm(op));
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        health_.MarkBroken();
        return CudaStatus(q, absl::StrCat("nccl ", op, " on group '", name_, "'"));
      }
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) return Check(state, op);
      if (health_.aborted() || Clock::now() > deadline) return TimeOut(op);
      std::this_thread::yield();
    }
  }

  absl::Status TimeOut(const std::string& op) {
    health_.MarkBroken();
    ncclCommAbort(comm_);
    comm_ = nullptr;
    if (health_.aborted()) return health_.AbortedError(op);
    return absl::DeadlineExceededError(absl::StrCat("nccl ", op, " on group '", name_,
                                                    "' timed out after ", timeout_.count(),
                                                    " ms (communicator aborted)"));
  }

  std::string name_;
  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  GroupHealth health_;
  int64_t bytes_sent_ = 0;
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
