// Gang placement: picks `world` idle workers for one stage's group, whole or not
// at all, preferring workers that share a node label (one NVLink domain per SP group).
// Pure functions over plain values; thread-compatible.
#ifndef ULYSSES_COORDINATOR_SCHEDULER_H_
#define ULYSSES_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ulysses::coordinator {

struct IdleWorker {
  std::string id;
  std::string node_label;
};

struct GangRequest {
  int sp = 1;                  // SP group size: ranks r*sp..r*sp+sp-1 form one group.
  int dp = 1;                  // Number of SP groups.
  std::string required_label;  // Only workers with this label ("" = any).
};

struct Placement {
  bool placed = false;
  std::vector<std::string> worker_ids;  // worker_ids[rank], size sp*dp when placed.
  std::string reason;                   // Why not placed ("needs 4 idle workers, 2 available").
};

// Places the gang. Strategy: each SP group (consecutive ranks) is filled from one node
// label when any label has sp idle workers (labels with the fewest spare workers that
// still fit are used first, to keep big labels whole); otherwise from the labels with
// the most idle workers. Deterministic for a given input order.
Placement PlaceGang(const GangRequest& request, const std::vector<IdleWorker>& idle);

// Queue ordering: higher priority first, then lower submission number (FIFO).
struct QueueKey {
  int64_t priority = 0;
  int64_t number = 0;
  bool operator<(const QueueKey& o) const {
    return priority != o.priority ? priority > o.priority : number < o.number;
  }
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_SCHEDULER_H_
