// Internal: a Communicator that runs another (CPU-only) Communicator's collectives on tensors of
// any device by staging them through host memory: device tensors are copied to CPU, reduced or
// exchanged there, and copied back in place. This is how several ranks share one GPU with Gloo
// (NCCL refuses two ranks on one device); it costs two host copies per collective, so it is for
// correctness on a shared GPU, not for speed. CPU tensors pass straight through.
// Ownership: owns `inner`. Thread-compatible like every Communicator.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_HOST_STAGING_COMMUNICATOR_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_HOST_STAGING_COMMUNICATOR_H_

#include <memory>

#include "worker/engine/parallel/communicator.h"

namespace ulysses::engine::internal {

std::unique_ptr<Communicator> WrapWithHostStaging(std::unique_ptr<Communicator> inner);

}  // namespace ulysses::engine::internal

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_HOST_STAGING_COMMUNICATOR_H_
