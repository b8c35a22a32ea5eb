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

std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue, std::vector<IdleWorker> idle,
                                     const std::vector<IdleWorker>& live, const QuotaPolicy* quotas,
                                     std::map<std::string, int64_t> in_use) {
  std::sort(queue.begin(), queue.end(), [](const QueuedJob& a, const QueuedJob& b) {
    return QueueKey{a.priority, a.number} < QueueKey{b.priority, b.number};
  });
  std::vector<QueueDecision> out;
  out.reserve(queue.size());
  const QueuedJob* blocker = nullptr;
  for (const QueuedJob& job : queue) {
    QueueDecision d;
    d.job_id = job.id;
    const int64_t needed = static_cast<int64_t>(job.gang.sp) * job.gang.dp;
    std::string over_quota;
    if (quotas != nullptr &&
        !FitsWorkerQuota(job.tenant, in_use[job.tenant], needed, *quotas, &over_quota)) {
      d.kind = QueueDecision::Kind::kUnplaced;
      d.reason = absl::StrCat("stage ", job.stage_index, ": ", over_quota);
    } else if (blocker != nullptr) {
      d.kind = QueueDecision::Kind::kBlocked;
      d.reason = absl::StrCat("queued behind ", blocker->id, " (priority ", blocker->priority, ")");
    } else if (job.in_backoff) {
      d.kind = QueueDecision::Kind::kBackoff;
    } else {
      Placement p = PlaceGang(job.gang, idle);
      if (p.placed) {
        std::set<std::string> used(p.worker_ids.begin(), p.worker_ids.end());
        idle.erase(std::remove_if(idle.begin(), idle.end(),
                                  [&](const IdleWorker& w) { return used.count(w.id) > 0; }),
                   idle.end());
        d.kind = QueueDecision::Kind::kLaunch;
        d.worker_ids = std::move(p.worker_ids);
        in_use[job.tenant] += needed;
      } else {
        d.kind = QueueDecision::Kind::kUnplaced;
        d.reason = absl::StrCat("stage ", job.stage_index, ": ", p.reason);
        int eligible = 0;
        for (const IdleWorker& w : live) {
          if (job.gang.required_label.empty() || w.node_label == job.gang.required_label) {
            ++eligible;
          }
        }
        if (eligible >= job.gang.sp * job.gang.dp) blocker = &job;
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace ulysses::coordinator
