// How many intra-op (libtorch/OpenMP) threads each rank on a machine gets: its share of the
// cores this process may run on, so that N ranks on one machine do not each start a thread
// per core and oversubscribe it N times. The engine's local launcher (`ulysses-train train`)
// and the worker agent compute it and pass it as `ulysses-train rank --intra-op-threads`.
#ifndef ULYSSES_COMMON_PROCESS_CPU_SHARE_H_
#define ULYSSES_COMMON_PROCESS_CPU_SHARE_H_

#include <string>
#include <vector>

namespace ulysses::process {

// The CPUs this process may run on (sched_getaffinity, which cpusets and `taskset` narrow),
// else the online CPUs; at least 1.
int UsableCores();

// max(1, cores / local_ranks): each of `local_ranks` ranks sharing `cores` CPUs gets the same
// whole number of threads (local_ranks < 1 counts as 1).
int IntraOpThreadShare(int cores, int local_ranks);

// The environment every rank starts with unless the variable is already set (SpawnOptions::
// env_defaults; the launchers of ranks pass it). OMP_WAIT_POLICY=PASSIVE: an OpenMP thread
// that reaches a barrier sleeps instead of spinning (libgomp's default spins first). Ranks share
// a machine's cores with each other, with their own Gloo and checkpoint-writer threads and with
// OpenBLAS's pool, so a spinning thread takes the core another needs: the needle job's first
// stage ran 7-12x faster with it on a 2-core machine at load ~10 (bench/omp_wait.sh,
// docs/BENCHMARKS.md "OpenMP wait policy"). libgomp reads it once when it loads, so it must be set
// before exec, not by the rank.
std::vector<std::string> RankEnvironmentDefaults();

// The largest --intra-op-threads a rank accepts.
inline constexpr int kMaxIntraOpThreads = 1024;

}  // namespace ulysses::process

#endif  // ULYSSES_COMMON_PROCESS_CPU_SHARE_H_
