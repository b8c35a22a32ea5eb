#include "coordinator/quota.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec_fields.h"
#include "yaml-cpp/yaml.h"

namespace ulysses::coordinator {
namespace {

constexpr int64_t kMaxQuota = 1000000;

absl::Status ParseTenantQuota(const YAML::Node& node, const std::string& path, TenantQuota* q) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": must be a mapping {max_queued_jobs: N, max_workers: N}"));
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    try {
      if (key == "max_queued_jobs") {
        q->max_queued_jobs = kv.second.as<int64_t>();
      } else if (key == "max_workers") {
        q->max_workers = kv.second.as<int64_t>();
      } else if (key == "max_jobs") {
        q->max_jobs = kv.second.as<int64_t>();
      } else if (key == "max_priority") {
        q->max_priority = kv.second.as<int64_t>();
      } else if (key == "max_bytes") {
        q->max_bytes = kv.second.as<int64_t>();
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ".", key,
                         ": unknown setting (known: max_queued_jobs, max_workers, max_jobs, "
                         "max_priority, max_bytes)"));
      }
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ".", key, ": ", YAML::Dump(kv.second), " is not an integer"));
    }
  }
  return absl::OkStatus();
}

void CheckTenantQuota(const TenantQuota& q, const std::string& path,
                      std::vector<std::string>* errors) {
  if (q.max_queued_jobs < 1 || q.max_queued_jobs > kMaxQuota) {
    errors->push_back(absl::StrCat(path, ".max_queued_jobs: ", q.max_queued_jobs,
                                   " is out of range (use 1..", kMaxQuota, ")"));
  }
  if (q.max_jobs < 1 || q.max_jobs > kMaxQuota) {
    errors->push_back(
        absl::StrCat(path, ".max_jobs: ", q.max_jobs, " is out of range (use 1..", kMaxQuota, ")"));
  }
  constexpr int64_t kMiB = int64_t{1} << 20;
  if (q.max_bytes != 0 && (q.max_bytes < kMiB || q.max_bytes > (kMiB << 20))) {
    errors->push_back(absl::StrCat(path, ".max_bytes: ", q.max_bytes,
                                   " is out of range (use 1048576 (1 MiB) .. 1099511627776 (1 "
                                   "TiB), or 0 for no limit)"));
  }
  if (q.max_priority < -1 || q.max_priority > kMaxQuota) {
    errors->push_back(absl::StrCat(path, ".max_priority: ", q.max_priority,
                                   " is out of range (use -1 for quotas.max_user_priority, or 0..",
                                   kMaxQuota, ")"));
  }
  if (q.max_workers < 0 || q.max_workers > kMaxQuota) {
    errors->push_back(absl::StrCat(path, ".max_workers: ", q.max_workers,
                                   " is out of range (use 0 for no limit, or up to ", kMaxQuota,
                                   ")"));
  }
}

}  // namespace

const TenantQuota& QuotaPolicy::For(const std::string& tenant) const {
  auto it = tenants.find(tenant);
  return it == tenants.end() ? default_quota : it->second;
}

int64_t QuotaPolicy::CrossTenantPreemptionPriority() const {
  return cross_tenant_preemption_priority >= 0 ? cross_tenant_preemption_priority
                                               : max_user_priority + 1;
}

int64_t QuotaPolicy::MaxPriority(const std::string& tenant) const {
  const int64_t own = For(tenant).max_priority;
  return own >= 0 ? own : max_user_priority;
}

absl::Status ParseQuotaPolicy(const YAML::Node& node, QuotaPolicy* policy) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        "quotas: must be a mapping (keys: max_user_priority, default, tenants)");
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (key == "cross_tenant_preemption_priority") {
      try {
        policy->cross_tenant_preemption_priority = kv.second.as<int64_t>();
      } catch (const std::exception&) {
        return absl::InvalidArgumentError(
            absl::StrCat("quotas.cross_tenant_preemption_priority: ", YAML::Dump(kv.second),
                         " is not an integer"));
      }
      continue;
    }
    if (key == "max_user_priority") {
      try {
        policy->max_user_priority = kv.second.as<int64_t>();
      } catch (const std::exception&) {
        return absl::InvalidArgumentError(absl::StrCat(
            "quotas.max_user_priority: ", YAML::Dump(kv.second), " is not an integer"));
      }
    } else if (key == "default") {
      absl::Status s = ParseTenantQuota(kv.second, "quotas.default", &policy->default_quota);
      if (!s.ok()) return s;
    } else if (key == "tenants") {
      if (!kv.second.IsMap()) {
        return absl::InvalidArgumentError(
            "quotas.tenants: must be a mapping of tenant name -> {max_queued_jobs, max_workers}");
      }
      for (const auto& t : kv.second) {
        const std::string tenant = t.first.as<std::string>();
        TenantQuota q = policy->default_quota;
        absl::Status s = ParseTenantQuota(t.second, "quotas.tenants." + tenant, &q);
        if (!s.ok()) return s;
        policy->tenants[tenant] = q;
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "quotas.", key, ": unknown setting (known: max_user_priority, default, tenants)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateQuotaPolicy(const QuotaPolicy& policy) {
  std::vector<std::string> errors;
  if (policy.max_user_priority < 0 || policy.max_user_priority > kMaxQuota) {
    errors.push_back(absl::StrCat("quotas.max_user_priority: ", policy.max_user_priority,
                                  " is out of range (use 0..", kMaxQuota, ")"));
  }
  if (policy.cross_tenant_preemption_priority < -1 ||
      policy.cross_tenant_preemption_priority > kMaxQuota + 1) {
    errors.push_back(absl::StrCat(
        "quotas.cross_tenant_preemption_priority: ", policy.cross_tenant_preemption_priority,
        " is out of range (use -1 for max_user_priority + 1, or 0..", kMaxQuota + 1, ")"));
  }
  CheckTenantQuota(policy.default_quota, "quotas.default", &errors);
  for (const auto& [tenant, q] : policy.tenants) {
    CheckTenantQuota(q, "quotas.tenants." + tenant, &errors);
  }
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  return absl::OkStatus();
}

absl::Status CheckPriority(int64_t priority, bool is_admin, const QuotaPolicy& policy,
                           const std::string& tenant) {
  const int64_t cap = policy.MaxPriority(tenant);
  if (is_admin || priority <= cap) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      spec::fields::PathOf(&spec::SchedulingSpec::priority), ": ", priority, " is above ", cap,
      ", the highest priority a non-admin ", tenant.empty() ? "" : "of this tenant ",
      "may set (lower it, or ask an admin to submit the job)"));
}

absl::Status CheckStoredJobsQuota(const std::string& tenant, int64_t stored,
                                  const QuotaPolicy& policy) {
  const TenantQuota& q = policy.For(tenant);
  if (stored < q.max_jobs) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant \"", tenant, "\" already has ", stored,
      " stored jobs, its quota (ended jobs count until ended_job_ttl_s deletes them; an admin "
      "can raise quotas.tenants.",
      tenant, ".max_jobs = ", q.max_jobs, ")"));
}

absl::Status CheckStoredBytesQuota(const std::string& tenant, int64_t stored, int64_t adding,
                                   const QuotaPolicy& policy) {
  const TenantQuota& q = policy.For(tenant);
  if (q.max_bytes == 0 || stored + adding <= q.max_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant \"", tenant, "\" stores ", stored,
      " bytes (specs, events and log files of its stored jobs; ended jobs count until "
      "ended_job_ttl_s deletes them), and this spec's ",
      adding, " would pass its byte quota quotas.tenants.", tenant, ".max_bytes = ", q.max_bytes,
      " (delete ended jobs' records by waiting for their TTL, or ask an admin to raise it)"));
}

absl::Status CheckPreemptible(bool preemptible, bool is_admin) {
  if (preemptible || is_admin) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      spec::fields::PathOf(&spec::SchedulingSpec::preemptible),
      ": false needs the admin role (leave it out to let higher-priority jobs preempt this one, "
      "or ask an admin to submit the job)"));
}

absl::Status CheckQueuedQuota(const std::string& tenant, int64_t queued,
                              const QuotaPolicy& policy) {
  const TenantQuota& q = policy.For(tenant);
  if (queued < q.max_queued_jobs) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("tenant \"", tenant, "\" already has ", queued,
                   " waiting jobs, its quota (wait for some to "
                   "start or cancel them; an admin can raise quotas.tenants.",
                   tenant, ".max_queued_jobs = ", q.max_queued_jobs, ")"));
}

bool FitsWorkerQuota(const std::string& tenant, int64_t in_use, int64_t needed,
                     const QuotaPolicy& policy, std::string* reason) {
  const TenantQuota& q = policy.For(tenant);
  if (q.max_workers == 0 || in_use + needed <= q.max_workers) return true;
  if (reason != nullptr) {
    *reason = absl::StrCat("tenant \"", tenant, "\" holds ", in_use, " of its ", q.max_workers,
                           " workers; this stage needs ", needed,
                           " (waits until the tenant's other jobs release workers)");
  }
  return false;
}

}  // namespace ulysses::coordinator
