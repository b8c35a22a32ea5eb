// Process-wide time spent in SeqAllToAll's exchanges (forward and backward), for the
// per-rank step figures (worker/engine/train/step_meter.h). Gloo (blocking): host wall time
// around the communicator call. NCCL (asynchronous, on the compute stream): device time
// between CUDA events around each exchange, added by the communicator's watchdog when the
// exchange completes (so up to a millisecond after it ends). Thread-safe.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_ALLTOALL_CLOCK_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_ALLTOALL_CLOCK_H_

namespace ulysses::engine {

// Seconds spent in SeqAllToAll exchanges since the process started (monotonic).
double SeqAllToAllSeconds();

// Adds `seconds` to the clock (communicators that time their own exchanges).
void AddSeqAllToAllSeconds(double seconds);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_ALLTOALL_CLOCK_H_
