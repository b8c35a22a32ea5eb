// Scheduling decisions, pure functions over plain values (thread-compatible):
// - gang placement: picks `world` idle workers for one stage's group, whole or not at
//   all, preferring workers that share a node label (one NVLink domain per SP group);
// - the queue: which queued jobs start now, in priority/FIFO order with head-of-line
//   blocking.
#ifndef ULYSSES_COORDINATOR_SCHEDULER_H_
#define ULYSSES_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/quota.h"

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

// One job waiting for placement.
struct QueuedJob {
  std::string id;
  int64_t priority = 0;
  int64_t number = 0;       // Submission order.
  int stage_index = 0;      // The stage to place (named in reasons).
  GangRequest gang;         // Its group.
  bool in_backoff = false;  // Restart backoff still running (not_before_ms in the future).
  std::string tenant;       // For the tenant's max_workers quota.
};

struct QueueDecision {
  enum class Kind {
    kLaunch,    // Start now on worker_ids.
    kBackoff,   // Waits for its restart backoff; keeps its reason; blocks no one.
    kBlocked,   // Could be placed but a job ahead of it waits for workers (head of line).
    kUnplaced,  // Not enough idle workers.
  };
  std::string job_id;
  Kind kind = Kind::kUnplaced;
  std::vector<std::string> worker_ids;  // kLaunch: worker_ids[rank].
  std::string reason;                   // kBlocked / kUnplaced: why it waits.
};

// Decides the queue, one decision per job in queue order (higher priority first, then
// FIFO). Jobs are placed from `idle` in that order; the first job that cannot be placed
// but could be with the workers that exist (`live`: every worker not LOST, idle or not)
// blocks every job behind it, so a big gang is not starved by small ones. A job that
// could never be placed with the live workers, or is in backoff, blocks no one.
//
// With `quotas`, a job whose gang would take its tenant past quotas.max_workers
// (`in_use`: workers each tenant's running attempts hold) waits (kUnplaced, the quota
// named) and blocks no one: one tenant's quota never holds up another tenant.
std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue, std::vector<IdleWorker> idle,
                                     const std::vector<IdleWorker>& live,
                                     const QuotaPolicy* quotas = nullptr,
                                     std::map<std::string, int64_t> in_use = {});

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_SCHEDULER_H_
