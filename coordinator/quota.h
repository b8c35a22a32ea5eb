// Per-tenant limits of ulysses-coordinator (docs/SECURITY.md, "Quotas"): how far a
// non-admin may raise a job's priority, how many jobs a tenant may have queued, and
// how many workers its running jobs may hold at once. The config section:
//
//   quotas:
//     max_user_priority: 100        # priorities above need the admin role
//     cross_tenant_preemption_priority: 101   # default: max_user_priority + 1
//     default: {max_queued_jobs: 100, max_workers: 0, max_jobs: 10000, max_bytes: 268435456}
//     tenants:
//       research: {max_queued_jobs: 20, max_workers: 16, max_priority: 50}
//
// Pure functions over plain values; thread-compatible.
#ifndef ULYSSES_COORDINATOR_QUOTA_H_
#define ULYSSES_COORDINATOR_QUOTA_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"

namespace YAML {
class Node;
}

namespace ulysses::coordinator {

struct TenantQuota {
  int64_t max_queued_jobs = 100;  // PENDING/QUEUED/BACKOFF jobs at once (>= 1).
  int64_t max_workers = 0;        // Workers held by its running jobs (0 = no limit).
  // Jobs the store keeps for the tenant, ended ones included until ended_job_ttl_s deletes
  // them (1..1000000).
  int64_t max_jobs = 10000;
  // The highest priority its non-admins may set (-1 = quotas.max_user_priority).
  int64_t max_priority = -1;
  // Bytes the coordinator stores for it: specs, events and log files of its stored jobs
  // (ended ones until ended_job_ttl_s). 1 MiB .. 1 TiB, 0 = no limit. At the quota its
  // submits are refused and its jobs' new log lines stay in memory only. Keep the tenants'
  // quotas together below state_max_bytes so that none can fill the store for the others.
  int64_t max_bytes = int64_t{256} << 20;
};

struct QuotaPolicy {
  int64_t max_user_priority = 100;  // Higher spec priorities need the admin role.
  // A job preempts another tenant's jobs only with at least this priority (-1 =
  // max_user_priority + 1: only a priority an admin granted). Within a tenant, any higher
  // priority preempts.
  int64_t cross_tenant_preemption_priority = -1;
  TenantQuota default_quota;  // For tenants not listed.
  std::map<std::string, TenantQuota> tenants;

  const TenantQuota& For(const std::string& tenant) const;
  // cross_tenant_preemption_priority with its default filled in.
  int64_t CrossTenantPreemptionPriority() const;
  // The priority cap of `tenant`'s non-admins.
  int64_t MaxPriority(const std::string& tenant) const;
};

// Reads the `quotas` mapping (unknown keys are errors naming them).
absl::Status ParseQuotaPolicy(const YAML::Node& node, QuotaPolicy* policy);
// Range checks, one line per problem: `quotas.<path>: <value> <problem> (<fix>)`.
absl::Status ValidateQuotaPolicy(const QuotaPolicy& policy);

// PERMISSION_DENIED when a non-admin asks for a priority above the cap (of `tenant`:
// its max_priority, else max_user_priority).
absl::Status CheckPriority(int64_t priority, bool is_admin, const QuotaPolicy& policy,
                           const std::string& tenant = "");

// RESOURCE_EXHAUSTED when `tenant` already stores `stored` jobs (its max_jobs).
absl::Status CheckStoredJobsQuota(const std::string& tenant, int64_t stored,
                                  const QuotaPolicy& policy);

// RESOURCE_EXHAUSTED when `tenant`, storing `stored` bytes, would pass its max_bytes by
// `adding` (a new spec).
absl::Status CheckStoredBytesQuota(const std::string& tenant, int64_t stored, int64_t adding,
                                   const QuotaPolicy& policy);

// PERMISSION_DENIED when a non-admin opts a job out of preemption
// (spec.scheduling.preemptible: false).
absl::Status CheckPreemptible(bool preemptible, bool is_admin);

// RESOURCE_EXHAUSTED when `tenant` already has `queued` waiting jobs (its quota full).
absl::Status CheckQueuedQuota(const std::string& tenant, int64_t queued, const QuotaPolicy& policy);

// Whether a gang of `needed` workers for `tenant`, which already holds `in_use`,
// stays within its max_workers. When not, `*reason` says why (shown as the job's
// pending reason; the scheduler goes on to the next job, no head-of-line blocking).
bool FitsWorkerQuota(const std::string& tenant, int64_t in_use, int64_t needed,
                     const QuotaPolicy& policy, std::string* reason);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_QUOTA_H_
