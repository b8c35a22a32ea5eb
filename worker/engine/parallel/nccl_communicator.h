// Internal: Communicator over the raw NCCL C API (CUDA tensors). Only built with ULYSSES_HAVE_CUDA.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/parallel/communicator.h"

namespace ulysses::engine::internal {

// Number of visible CUDA devices; 0 when the runtime or driver is missing.
int CudaDeviceCount();

// Builds the NCCL group `name` on CUDA device `device_index`; the unique id travels through
// `store` (rank 0 of the group publishes it). Collectives are enqueued on libtorch's current CUDA
// stream and return without waiting; a watchdog thread aborts the communicator when one is not
// done within `timeout`, on an asynchronous NCCL error or on Abort(), and the group's next call
// returns that failure. Barrier() alone waits on the host.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& name, int rank, int size,
    int device_index, std::chrono::milliseconds timeout);

}  // namespace ulysses::engine::internal

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_
