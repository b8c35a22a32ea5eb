// The differentiable sequence all-to-all of Ulysses sequence parallelism.
//
// SeqAllToAll(x, comm, scatter_dim, gather_dim) splits `x` into comm->size() equal chunks along
// scatter_dim, sends chunk j to rank j, and concatenates the received chunks along gather_dim in
// source-rank order. With x [b, s/p, h, d], scatter_dim=2, gather_dim=1 it gives [b, s, h/p, d]
// (heads scattered, sequence gathered); SeqAllToAll(y, comm, 1, 2) is the inverse.
// It is one autograd Function whose backward is the same exchange with the dims swapped.
//
// Every rank of `comm` must call it with the same shapes in the same order. `comm` is borrowed
// and must outlive the autograd graph. Throws std::runtime_error on a communication failure (the
// communicator is then unusable) and c10::Error on bad shapes.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_SEQUENCE_ALL_TO_ALL_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_SEQUENCE_ALL_TO_ALL_H_

#include <torch/torch.h>

#include <cstdint>

#include "worker/engine/parallel/communicator.h"

namespace ulysses::engine {

torch::Tensor SeqAllToAll(const torch::Tensor& x, Communicator* comm, int64_t scatter_dim,
                          int64_t gather_dim);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_SEQUENCE_ALL_TO_ALL_H_
