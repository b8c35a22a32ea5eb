#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ulysses::coordinator {

Placement PlaceGang(const GangRequest& request, const std::vector<IdleWorker>& idle) {
  Placement out;
  const int world = request.sp * request.dp;
  // label -> idle worker ids, in input order.
  std::map<std::string, std::vector<std::string>> by_label;
  int available = 0;
  for (const IdleWorker& w : idle) {
    if (!request.required_label.empty() && w.node_label != request.required_label) continue;
    by_label[w.node_label].push_back(w.id);
    ++available;
  }
  if (available < world) {
    out.reason = absl::StrCat("needs ", world, " idle worker", world == 1 ? "" : "s");
    if (!request.required_label.empty()) {
      absl::StrAppend(&out.reason, " with node label \"", request.required_label, "\"");
    }
    absl::StrAppend(&out.reason, ", ", available, " available");
    return out;
  }
  for (int g = 0; g < request.dp; ++g) {
    // Best fit: the label with the fewest idle workers that still holds a whole SP group.
    std::string best;
    size_t best_size = 0;
    for (const auto& [label, ids] : by_label) {
      if (ids.size() >= static_cast<size_t>(request.sp) &&
          (best_size == 0 || ids.size() < best_size)) {
        best = label;
        best_size = ids.size();
      }
    }
    int need = request.sp;
    auto take_from = [&](const std::string& label, int n) {
      auto& ids = by_label[label];
      for (int i = 0; i < n && !ids.empty(); ++i) {
        out.worker_ids.push_back(ids.front());
        ids.erase(ids.begin());
        --need;
      }
      if (ids.empty()) by_label.erase(label);
    };
    if (best_size > 0) {
      take_from(best, need);
      continue;
    }
    // No label fits a whole group: spread over the largest labels.
    while (need > 0) {
      auto largest = std::max_element(
          by_label.begin(), by_label.end(),
          [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
      take_from(largest->first, need);
    }
  }
  out.placed = true;
  return out;
}

std::vector<Victim> PlanPreemption(const QueuedJob& job, const std::vector<IdleWorker>& available,
                                   std::vector<RunningJob> running) {
  std::vector<RunningJob> candidates;
  for (RunningJob& r : running) {
    if (r.preemptible && r.priority < job.priority) candidates.push_back(std::move(r));
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
    out.push_back({candidates[i].id, candidates[i].priority, candidates[i].gpu_seconds_at_risk});
  }
  return out;
}

namespace {

// Workers of `from` whose ids are not in `ids`.
std::vector<IdleWorker> Without(const std::vector<IdleWorker>& from,
                                const std::set<std::string>& ids) {
  std::vector<IdleWorker> out;
  for (const IdleWorker& w : from) {
    if (!ids.count(w.id)) out.push_back(w);
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
  std::set<std::string> reserved;   // Idle workers held for the head job.
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
        std::set<std::string> used(p.worker_ids.begin(), p.worker_ids.end());
        idle = Without(idle, used);
        d.kind = QueueDecision::Kind::kLaunch;
        d.backfill = head != nullptr;
        d.worker_ids = std::move(p.worker_ids);
        in_use[job.tenant] += needed;
      } else if (head != nullptr) {
        d.kind = QueueDecision::Kind::kBlocked;
        d.reason = absl::StrCat("queued behind ", head->id, " (priority ", head->priority, ")");
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
          if (!later.placed) {
            d.victims = PlanPreemption(job, soon, running);
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
                absl::StrAppend(&names, names.empty() ? "" : ", ", v.job_id, " (priority ",
                                v.priority, ")");
              }
              absl::StrAppend(&d.reason, "; preempting ", names);
            }
          } else if (!freeing.empty() && static_cast<int64_t>(idle.size()) < needed) {
            absl::StrAppend(&d.reason, "; waiting for workers of ending attempts to free up");
          }
          if (later.placed) {
            // Hold exactly the idle workers of the placement it will get.
            std::set<std::string> idle_ids;
            for (const IdleWorker& w : idle) idle_ids.insert(w.id);
            for (const std::string& id : later.worker_ids) {
              if (idle_ids.count(id)) reserved.insert(id);
            }
          } else {
            // It waits for attempts to end: any idle worker it could use may be needed.
            for (const IdleWorker& w : idle) {
              if (job.gang.required_label.empty() || w.node_label == job.gang.required_label) {
                reserved.insert(w.id);
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
