#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ulysses::coordinator {

std::string IdleWorker::key() const { return absl::StrCat(id, "#", slot); }

Placement PlaceGang(const GangRequest& request, const std::vector<IdleWorker>& idle) {
  Placement out;
  const int world = request.sp * request.dp;
  // Free slots by label, then by worker, in input order.
  struct Free {
    std::string id;
    std::vector<int> slots;
  };
  std::map<std::string, std::vector<Free>> by_label;
  int available = 0;
  for (const IdleWorker& w : idle) {
    if (!request.required_label.empty() && w.node_label != request.required_label) continue;
    std::vector<Free>& workers = by_label[w.node_label];
    auto it =
        std::find_if(workers.begin(), workers.end(), [&](const Free& f) { return f.id == w.id; });
    if (it == workers.end()) it = workers.insert(workers.end(), Free{w.id, {}});
    it->slots.push_back(w.slot);
    ++available;
  }
  if (available < world) {
    out.reason = absl::StrCat("needs ", world, " free slot", world == 1 ? "" : "s");
    if (!request.required_label.empty()) {
      absl::StrAppend(&out.reason, " with node label \"", request.required_label, "\"");
    }
    absl::StrAppend(&out.reason, ", ", available, " available");
    return out;
  }
  auto label_free = [&](const std::string& label) {
    size_t n = 0;
    for (const Free& f : by_label[label]) n += f.slots.size();
    return n;
  };
  // Takes up to n slots of `label`, from its workers with the most free slots first.
  auto take_from = [&](const std::string& label, int n) {
    std::vector<Free>& workers = by_label[label];
    while (n > 0 && !workers.empty()) {
      auto most = std::max_element(
          workers.begin(), workers.end(),
          [](const Free& a, const Free& b) { return a.slots.size() < b.slots.size(); });
      while (n > 0 && !most->slots.empty()) {
        out.worker_ids.push_back(most->id);
        out.slots.push_back(most->slots.front());
        most->slots.erase(most->slots.begin());
        --n;
      }
      if (most->slots.empty()) workers.erase(most);
    }
    if (workers.empty()) by_label.erase(label);
  };
  const size_t sp = static_cast<size_t>(request.sp);
  for (int g = 0; g < request.dp; ++g) {
    // 1. Best-fit worker: the fewest free slots that still hold a whole SP group.
    std::string best_label;
    const Free* best = nullptr;
    size_t best_label_free = 0;
    for (auto& [label, workers] : by_label) {
      const size_t free_in_label = label_free(label);
      for (const Free& f : workers) {
        if (f.slots.size() < sp) continue;
        if (best == nullptr || f.slots.size() < best->slots.size() ||
            (f.slots.size() == best->slots.size() && free_in_label < best_label_free)) {
          best = &f;
          best_label = label;
          best_label_free = free_in_label;
        }
      }
    }
    if (best != nullptr) {
      std::vector<Free>& workers = by_label[best_label];
      Free& f = *std::find_if(workers.begin(), workers.end(),
                              [&](const Free& x) { return x.id == best->id; });
      for (size_t i = 0; i < sp; ++i) {
        out.worker_ids.push_back(f.id);
        out.slots.push_back(f.slots[i]);
      }
      f.slots.erase(f.slots.begin(), f.slots.begin() + static_cast<std::ptrdiff_t>(sp));
      if (f.slots.empty()) {
        workers.erase(std::find_if(workers.begin(), workers.end(),
                                   [&](const Free& x) { return x.slots.empty(); }));
      }
      if (workers.empty()) by_label.erase(best_label);
      continue;
    }
    // 2. Best-fit label: the fewest free slots that still hold a whole SP group.
    std::string label;
    size_t label_size = 0;
    for (const auto& [l, workers] : by_label) {
      const size_t n = label_free(l);
      if (n >= sp && (label_size == 0 || n < label_size)) {
        label = l;
        label_size = n;
      }
    }
    if (label_size > 0) {
      take_from(label, request.sp);
      continue;
    }
    // 3. No label fits a whole group: spread over the largest labels.
    int need = request.sp;
    while (need > 0) {
      std::string largest;
      size_t largest_size = 0;
      for (const auto& [l, workers] : by_label) {
        if (label_free(l) > largest_size) {
          largest = l;
          largest_size = label_free(l);
        }
      }
      const int take = std::min<int>(need, static_cast<int>(largest_size));
      take_from(largest, take);
      need -= take;
    }
  }
  out.placed = true;
  return out;
}

std::vector<Victim> PlanPreemption(const QueuedJob& job, const std::vector<IdleWorker>& available,
                                   std::vector<RunningJob> running, int64_t cross_tenant_priority) {
  std::vector<RunningJob> candidates;
  for (RunningJob& r : running) {
    const bool tenant_ok = r.tenant == job.tenant || job.priority >= cross_tenant_priority;
    if (r.preemptible && r.priority < job.priority && tenant_ok) {
      candidates.push_back(std::move(r));
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const RunningJob& a, const RunningJob& b) {
    if (a.gpu_seconds_at_risk != b.gpu_seconds_at_risk) {
      return a.gpu_seconds_at_risk < b.gpu_seconds_at_risk;
    }
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.number > b.number;  // The youngest first.
  });
  auto fits = [&](const std::vector<size_t>& chosen) {
    std::vector<IdleWorker> pool = available;
    for (size_t i : chosen) {
      pool.insert(pool.end(), candidates[i].workers.begin(), candidates[i].workers.end());
    }
    return PlaceGang(job.gang, pool).placed;
  };
  std::vector<size_t> chosen;
  bool placed = false;
  for (size_t i = 0; i < candidates.size() && !placed; ++i) {
    chosen.push_back(i);
    placed = fits(chosen);
  }
  if (!placed) return {};
  // Only as many as needed: drop the victims that are not, the most expensive first.
  for (size_t k = chosen.size(); k-- > 0;) {
    std::vector<size_t> without = chosen;
    without.erase(without.begin() + static_cast<std::ptrdiff_t>(k));
    if (fits(without)) chosen = std::move(without);
  }
  std::vector<Victim> out;
  for (size_t i : chosen) {
    out.push_back({candidates[i].id, candidates[i].priority, candidates[i].gpu_seconds_at_risk,
                   candidates[i].tenant});
  }
  return out;
}

namespace {

// Slots of `from` whose keys are not in `keys`.
std::vector<IdleWorker> Without(const std::vector<IdleWorker>& from,
                                const std::set<std::string>& keys) {
  std::vector<IdleWorker> out;
  for (const IdleWorker& w : from) {
    if (!keys.count(w.key())) out.push_back(w);
  }
  return out;
}

// The slot keys of a placement.
std::set<std::string> Keys(const Placement& p) {
  std::set<std::string> out;
  for (size_t r = 0; r < p.worker_ids.size(); ++r) {
    out.insert(IdleWorker{p.worker_ids[r], "", p.slots[r]}.key());
  }
  return out;
}

}  // namespace

std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue, std::vector<IdleWorker> idle,
                                     const std::vector<IdleWorker>& live, const QuotaPolicy* quotas,
                                     std::map<std::string, int64_t> in_use,
                                     const std::vector<RunningJob>& running,
                                     const std::vector<IdleWorker>& freeing) {
  std::sort(queue.begin(), queue.end(), [](const QueuedJob& a, const QueuedJob& b) {
    return QueueKey{a.priority, a.number} < QueueKey{b.priority, b.number};
  });
  std::vector<QueueDecision> out;
  out.reserve(queue.size());
  const QueuedJob* head = nullptr;  // The first job that waits for workers that exist.
  std::set<std::string> reserved;   // Free slots (keys) held for the head job.
  for (const QueuedJob& job : queue) {
    QueueDecision d;
    d.job_id = job.id;
    const int64_t needed = static_cast<int64_t>(job.gang.sp) * job.gang.dp;
    std::string over_quota;
    if (quotas != nullptr &&
        !FitsWorkerQuota(job.tenant, in_use[job.tenant], needed, *quotas, &over_quota)) {
      d.kind = QueueDecision::Kind::kUnplaced;
      d.reason = absl::StrCat("stage ", job.stage_index, ": ", over_quota);
    } else if (job.in_backoff) {
      d.kind = QueueDecision::Kind::kBackoff;
    } else {
      // Behind the head, only the workers outside its reservation.
      Placement p = PlaceGang(job.gang, head == nullptr ? idle : Without(idle, reserved));
      if (p.placed) {
        idle = Without(idle, Keys(p));
        d.kind = QueueDecision::Kind::kLaunch;
        d.backfill = head != nullptr;
        d.worker_ids = std::move(p.worker_ids);
        d.slots = std::move(p.slots);
        in_use[job.tenant] += needed;
      } else if (head != nullptr) {
        d.kind = QueueDecision::Kind::kBlocked;
        d.reason = absl::StrCat("queued behind ",
                                head->tenant == job.tenant ? head->id : "a job of another tenant",
                                " (priority ", head->priority, ")");
      } else {
        d.kind = QueueDecision::Kind::kUnplaced;
        d.reason = absl::StrCat("stage ", job.stage_index, ": ", p.reason);
        int eligible = 0;
        for (const IdleWorker& w : live) {
          if (job.gang.required_label.empty() || w.node_label == job.gang.required_label) {
            ++eligible;
          }
        }
        if (eligible >= needed) {
          head = &job;
          // Workers that free up first in the order: the head waits for them anyway, and
          // every idle worker its placement leaves out is free for backfill.
          std::vector<IdleWorker> soon = freeing;
          soon.insert(soon.end(), idle.begin(), idle.end());
          Placement later = PlaceGang(job.gang, soon);
          if (!later.placed && !job.may_preempt) {
            absl::StrAppend(&d.reason, "; priority ", job.priority,
                            " is a non-preempting class: waiting for running jobs to end");
          } else if (!later.placed) {
            d.victims = PlanPreemption(
                job, soon, running,
                quotas == nullptr ? INT64_MIN : quotas->CrossTenantPreemptionPriority());
            if (!d.victims.empty()) {
              std::set<std::string> victim_ids;
              for (const Victim& v : d.victims) victim_ids.insert(v.job_id);
              for (const RunningJob& r : running) {
                if (victim_ids.count(r.id)) {
                  soon.insert(soon.begin(), r.workers.begin(), r.workers.end());
                }
              }
              later = PlaceGang(job.gang, soon);
              d.kind = QueueDecision::Kind::kPreempt;
              std::string names;
              for (const Victim& v : d.victims) {
                // Another tenant's job is not named to this one.
                absl::StrAppend(&names, names.empty() ? "" : ", ",
                                v.tenant == job.tenant ? v.job_id : "a job of another tenant",
                                " (priority ", v.priority, ")");
              }
              absl::StrAppend(&d.reason, "; preempting ", names);
            }
          } else if (!freeing.empty() && static_cast<int64_t>(idle.size()) < needed) {
            absl::StrAppend(&d.reason, "; waiting for slots of ending attempts to free up");
          }
          if (later.placed) {
            // Hold exactly the free slots of the placement it will get.
            std::set<std::string> idle_keys;
            for (const IdleWorker& w : idle) idle_keys.insert(w.key());
            for (const std::string& key : Keys(later)) {
              if (idle_keys.count(key)) reserved.insert(key);
            }
          } else {
            // It waits for attempts to end: any free slot it could use may be needed.
            for (const IdleWorker& w : idle) {
              if (job.gang.required_label.empty() || w.node_label == job.gang.required_label) {
                reserved.insert(w.key());
              }
            }
          }
        }
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace ulysses::coordinator
