// Scheduling decisions, pure functions over plain values (thread-compatible); the policy
// as a whole is described in docs/COORDINATOR.md "Scheduling policy":
// - gang placement: picks `world` free slots (a slot = one device of a worker: a GPU, or a
//   CPU rank in tests) for one stage's group, whole or not at all, each SP group inside one
//   worker when it fits, else inside one node label, across labels only when necessary;
// - the queue: which queued jobs start now, in priority/FIFO order with head-of-line
//   blocking, a reservation for the head job and backfill around it;
// - priority preemption: which running lower-priority jobs to stop (checkpoint now,
//   requeue) so that the head job can be placed, losing the least work.
#ifndef ULYSSES_COORDINATOR_SCHEDULER_H_
#define ULYSSES_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "coordinator/quota.h"

namespace ulysses::coordinator {

// One free slot of a worker (a worker of capacity 8 with nothing running is 8 of these).
// The name stays from when every worker had one slot.
struct IdleWorker {
  std::string id;
  std::string node_label;
  int slot = 0;
  // The worker's CUDA slots reach other nodes only over TCP sockets (it reported
  // FABRIC_SOCKETS): a group that needs a fabric spans no such worker (GangRequest).
  bool tcp_only = false;
  // Identifies the slot: "<id>#<slot>".
  std::string key() const;
};

// The free slots of one worker, as the coordinator's scheduling pass lists them: one entry
// per worker instead of one IdleWorker per slot (a quiet 25,000 x 8 cluster is 25,000
// entries, not 200,000 with two strings each). Views into the caller's state, which must
// outlive the PlanQueue call.
struct FreeWorker {
  std::string_view id;
  std::string_view node_label;
  absl::InlinedVector<int, 8> slots;  // In slot order.
  bool tcp_only = false;              // As IdleWorker::tcp_only.
};

struct GangRequest {
  int sp = 1;                  // SP group size: ranks r*sp..r*sp+sp-1 form one group.
  int dp = 1;                  // Number of SP groups.
  std::string required_label;  // Only workers with this label ("" = any).
  // The group may span workers only over a fabric (EFA / TCPXO / IB): it is placed on one
  // worker that holds it whole, or on workers that are not tcp_only, else it waits with the
  // reason. false: spec.parallelism.allow_tcp_fabric (or a caller that does not ask).
  bool fabric_required = false;
};

struct Placement {
  bool placed = false;
  std::vector<std::string> worker_ids;  // worker_ids[rank], size sp*dp when placed.
  std::vector<int> slots;               // slots[rank]: the slot of worker_ids[rank].
  std::string reason;                   // Why not placed ("needs 4 free slots, 2 available").
};

// Places the gang. Strategy, for each SP group (consecutive ranks) in turn:
// 1. inside one worker (one NVLink domain, no network in the all-to-all) when a worker has
//    sp free slots: the worker with the fewest free slots that still fit (best fit, ties:
//    the smaller label, then input order), to keep big workers whole;
// 2. else inside one node label when a label has sp free slots (best fit: the smallest
//    such label), taking the workers with the most free slots first;
// 3. else spread over the labels with the most free slots.
// DP replicas (different SP groups) may land anywhere. Deterministic for a given input
// order. With request.fabric_required and tcp_only slots free: first one worker that holds
// the whole gang (best fit), else one node label that does (agents of one node share it), else
// the steps above over the workers that are not tcp_only,
// else not placed (the reason names the tcp_only workers and allow_tcp_fabric).
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
  int stage_index = 0;      // The stage to place (0-based; named 1-based in reasons).
  GangRequest gang;         // Its group.
  bool in_backoff = false;  // Restart backoff still running (not_before_ms in the future).
  std::string tenant;       // For the tenant's max_workers quota.
  bool may_preempt = true;  // false: a non-preempting priority class (waits instead).
  int stage_count = 1;      // The job's stages ("stage 2 of 3" in reasons).
};

// A job whose attempt holds workers now, as the queue sees it.
struct RunningJob {
  std::string id;
  int64_t priority = 0;
  int64_t number = 0;               // Submission order (higher = younger).
  std::vector<IdleWorker> workers;  // The slots its attempt holds.
  // World size x seconds since its last committed checkpoint (or since its attempt started,
  // when that is later): the work a failed preemption checkpoint would lose.
  double gpu_seconds_at_risk = 0;
  bool preemptible = false;  // RUNNING and spec.scheduling.preemptible.
  std::string tenant;        // Another tenant's job is preempted only by an admin-granted priority.
};

// One job to preempt for the head job.
struct Victim {
  std::string job_id;
  int64_t priority = 0;
  double gpu_seconds_at_risk = 0;
  std::string tenant;
};

struct QueueDecision {
  enum class Kind {
    kLaunch,    // Start now on worker_ids.
    kBackoff,   // Waits for its restart backoff; keeps its reason; blocks no one.
    kBlocked,   // Could be placed but a job ahead of it waits for workers (head of line).
    kUnplaced,  // Not enough free slots.
    kPreempt,   // The head job: preempt `victims` now; it is placed once their workers free up.
  };
  std::string job_id;
  Kind kind = Kind::kUnplaced;
  std::vector<std::string> worker_ids;  // kLaunch: worker_ids[rank].
  std::vector<int> slots;               // kLaunch: slots[rank].
  std::string reason;                   // kBlocked / kUnplaced / kPreempt: why it waits.
  bool backfill = false;                // kLaunch behind a waiting head job, off its reservation.
  std::vector<Victim> victims;          // kPreempt.
};

// Decides the queue, one decision per job in queue order (higher priority first, then
// FIFO). Jobs are placed from `idle` in that order. The first job that cannot be placed
// but could be with the workers that exist (`live`: every worker not LOST, idle or not)
// is the head: it gets a reservation and every job behind it waits (kBlocked) unless it
// fits on idle workers outside that reservation (backfill), so a big gang is never
// delayed by small ones. The reservation: when the head fits on the idle workers plus
// those `freeing` (busy with an attempt that is ending: preempted, aborted), the idle
// workers of that placement; otherwise every idle worker the head could use. A job that
// could never be placed with the live workers, or is in backoff, blocks no one.
//
// Preemption: when the head does not fit on idle + freeing workers and may preempt (its
// priority class is not non-preempting), the `running` jobs of
// lower priority that are preemptible are candidates (PlanPreemption); when preempting
// some of them makes room, the head's decision is kPreempt with those victims, and their
// workers count as freeing for the reservation.
//
// With `quotas`, a job whose gang would take its tenant past quotas.max_workers
// (`in_use`: workers each tenant's running attempts hold) waits (kUnplaced, the quota
// named) and blocks no one: one tenant's quota never holds up another tenant.
//
// Cost: O(queue + idle slots x placed jobs' workers), the free slots grouped once per call
// without comparing strings (bench/schedule_pass: 25,000 nodes x 8 slots, idle with one job
// submitted, or full with 10,000 queued jobs; docs/BENCHMARKS.md "Scheduling pass at
// cluster scale").
struct LiveSlots {
  int64_t total = 0;                                  // Slots of workers not LOST.
  std::unordered_map<std::string, int64_t> by_label;  // The same by node label.
  int64_t tcp_only = 0;       // Slots of tcp_only workers (counted in total too).
  int64_t largest_label = 0;  // The most slots of one node label.
  static LiveSlots Of(const std::vector<IdleWorker>& live);
  void Add(const std::string& label, int64_t slots, bool tcp_only = false);
  int64_t Eligible(const std::string& required_label) const;  // "" = every label.
  // The slots `request` could ever be placed on: Eligible, or with fabric_required (tcp_only
  // workers live, no required label) the larger of the slots not tcp_only and the largest
  // label (one worker or node label may hold a group whole).
  int64_t EligibleFor(const GangRequest& request) const;
};

// How a person reads a stage (docs/CONTRACTS.md "Stage numbers"): 1-based, "stage 2 of 3"
// for the 0-based `index` of `count` stages.
std::string StageName(int index, int count);

// A stage no cluster of the registered workers could ever hold: its group is larger than
// every slot they have (LiveSlots::EligibleFor).
struct UnschedulableStage {
  int stage = 0;          // 0-based index.
  int64_t needed = 0;     // sp x dp.
  int64_t available = 0;  // EligibleFor its gang.
  std::string message;    // The stage, what it needs, what the cluster has, and the fix.
};
// The first of stages[from..] that `live` cannot hold, or nullopt when each fits.
std::optional<UnschedulableStage> FirstUnschedulableStage(const std::vector<GangRequest>& stages,
                                                          int from, const LiveSlots& live);

std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue, std::vector<IdleWorker> idle,
                                     const LiveSlots& live, const QuotaPolicy* quotas = nullptr,
                                     std::map<std::string, int64_t> in_use = {},
                                     const std::vector<RunningJob>& running = {},
                                     const std::vector<IdleWorker>& freeing = {});
// The same with the free slots listed per worker (the coordinator's pass). Equal decisions
// to listing each of their slots as an IdleWorker, in the same order.
std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue,
                                     const std::vector<FreeWorker>& free, const LiveSlots& live,
                                     const QuotaPolicy* quotas = nullptr,
                                     std::map<std::string, int64_t> in_use = {},
                                     const std::vector<RunningJob>& running = {},
                                     const std::vector<IdleWorker>& freeing = {});
// The same with the live slots listed one by one (tests).
std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue, std::vector<IdleWorker> idle,
                                     const std::vector<IdleWorker>& live,
                                     const QuotaPolicy* quotas = nullptr,
                                     std::map<std::string, int64_t> in_use = {},
                                     const std::vector<RunningJob>& running = {},
                                     const std::vector<IdleWorker>& freeing = {});

// The running jobs to preempt so that `job` can be placed on `available` (idle and freeing
// workers) plus the victims' workers: only jobs of lower priority that are preemptible;
// those that lose the least work first (fewest GPU-seconds at risk; tie: lowest priority,
// then the youngest), and only as many as needed (a victim whose workers turn out not to be
// needed is dropped again). Empty when no set of candidates makes room (or none is needed).
// Victims of another tenant than `job`'s only when job.priority >= `cross_tenant_priority`
// (QuotaPolicy::CrossTenantPreemptionPriority; PlanQueue without quotas: no restriction).
std::vector<Victim> PlanPreemption(const QueuedJob& job, const std::vector<IdleWorker>& available,
                                   std::vector<RunningJob> running,
                                   int64_t cross_tenant_priority = INT64_MIN);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_SCHEDULER_H_
