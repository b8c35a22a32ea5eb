#include "coordinator/pool_demand.h"

#include <algorithm>

namespace ulysses::coordinator {

int64_t PoolOrdinal(std::string_view name) {
  const size_t dash = name.rfind('-');
  if (dash == std::string_view::npos || dash + 1 >= name.size() || name.size() - dash > 10) {
    return -1;
  }
  int64_t n = 0;
  for (size_t i = dash + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

int64_t WantedWorkers(const std::vector<PoolWorker>& workers,
                      const std::vector<int64_t>& queued_worlds, int64_t slots_per_worker) {
  const int64_t slots = std::max<int64_t>(1, slots_per_worker);
  int64_t busy = 0;
  int64_t highest = 0;  // Highest busy ordinal + 1.
  for (const PoolWorker& w : workers) {
    if (!w.busy) continue;
    ++busy;
    highest = std::max(highest, PoolOrdinal(w.name) + 1);
  }
  int64_t need = 0;
  for (int64_t world : queued_worlds) need += (std::max<int64_t>(world, 0) + slots - 1) / slots;
  return std::max(busy + need, highest);
}

}  // namespace ulysses::coordinator
