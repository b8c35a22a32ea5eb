// How many workers the pool wants (ulysses_wanted_workers, the metric a KEDA ScaledObject
// scales the worker StatefulSet on: deploy/k8s/components/keda, docs/DEPLOY.md "A pool that
// scales"). Pure function over plain values.
//
// wanted = max(busy workers + the workers the queued gangs need, the highest pool ordinal of a
// busy worker + 1). The second term is the idle-only scale-in rule: a StatefulSet scales in by
// removing its highest ordinals first (ulysses-worker-N, N = replicas-1 down), so while
// ulysses-worker-5 runs ranks the pool never goes below 6 and only idle pods above it are
// removed (their SIGTERM finds no rank to checkpoint).
#ifndef ULYSSES_COORDINATOR_POOL_DEMAND_H_
#define ULYSSES_COORDINATOR_POOL_DEMAND_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace ulysses::coordinator {

struct PoolWorker {
  std::string_view name;  // ulysses-worker-3: pool ordinal 3.
  bool busy = false;      // Runs (or is ending) a rank.
};

// The trailing "-N" of a StatefulSet pod name; -1 when there is none.
int64_t PoolOrdinal(std::string_view name);

// `queued_worlds`: the world size of each queued gang; `slots_per_worker`: the slots of one
// worker (a node's GPUs), at least 1.
int64_t WantedWorkers(const std::vector<PoolWorker>& workers,
                      const std::vector<int64_t>& queued_worlds, int64_t slots_per_worker);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_POOL_DEMAND_H_
