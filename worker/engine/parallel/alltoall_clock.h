// Process-wide time spent in SeqAllToAll's exchanges (forward and backward), for the
// per-rank step figures (worker/engine/train/step_meter.h). Host wall time around the
// communicator call: exact with Gloo (blocking); with NCCL it includes the wait for the
// stream only where the communicator synchronises. Thread-safe.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_ALLTOALL_CLOCK_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_ALLTOALL_CLOCK_H_

namespace ulysses::engine {

// Seconds spent in SeqAllToAll exchanges since the process started (monotonic).
double SeqAllToAllSeconds();

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_ALLTOALL_CLOCK_H_
