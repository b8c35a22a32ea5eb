// Internal: Communicator over libtorch's c10d ProcessGroupGloo (CPU tensors).
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_GLOO_COMMUNICATOR_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_GLOO_COMMUNICATOR_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/parallel/communicator.h"

namespace ulysses::engine::internal {

// Builds the Gloo group `name` over `store` (keys are prefixed with name). Every member must call
// it; blocks until all connected or `timeout`. `loopback` binds Gloo to 127.0.0.1 (single-host
// jobs); otherwise to the address the hostname resolves to.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& name, int rank, int size,
    std::chrono::milliseconds timeout, bool loopback);

}  // namespace ulysses::engine::internal

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_GLOO_COMMUNICATOR_H_
