// What a rank shares with the other processes of its host: the ranks on it and the threads each
// may use (libtorch's pool and OpenBLAS's own).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_HOST_THREADS_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_HOST_THREADS_H_

#include <torch/torch.h>

namespace ulysses::engine::train {

// Ranks sharing this host's memory: a CPU run's ranks are processes of one host (the launcher, or
// one worker's CPU slots); CUDA ranks share a node with at most one rank per visible device.
int RanksOnThisHost(const torch::Device& device, int world_size);

// Sets this rank's intra-op threads (threads >= 1): libtorch's pool (at::set_num_threads) and,
// when the BLAS library in the process is OpenBLAS (Debian's libopenblas0-pthread, found by
// symbol), OpenBLAS's own thread pool, which at::set_num_threads does not reach: without it every
// rank's matmuls ran one OpenBLAS thread per core whatever --intra-op-threads said. Returns
// OpenBLAS's thread count after the call, or 0 when the BLAS library is not OpenBLAS.
int SetIntraOpThreads(int threads);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_HOST_THREADS_H_
