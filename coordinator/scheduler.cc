#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace ulysses::coordinator {

std::string IdleWorker::key() const { return absl::StrCat(id, "#", slot); }

namespace {

// Free slots grouped for placement: by node label (label order), then by worker (in the
// order of first appearance), each worker's slots in input order. Built once per queue
// pass and taken from as jobs are placed, so that placing J jobs on S free slots costs
// O(S + J x workers) instead of rebuilding the groups per job (O(J x S x workers) before:
// a 2,000-node fill pass took 24 s, docs/BENCHMARKS.md). Workers emptied by a placement
// stay in their vectors with no slots (skipped) so that indices stay valid.
//
// Built for every pass, over every free slot of the cluster: on a quiet 25,000-node cluster
// that is the whole cost of SubmitJob's pass (bench/schedule_pass "idle"), so building it
// compares no label strings (labels are numbered once, through a hash, and sorted by name
// once) and allocates nothing per worker (slots inline, tables reserved up front).
class SlotPool {
 public:
  // Views into `slots`, which must outlive the pool.
  explicit SlotPool(const std::vector<IdleWorker>& slots) {
    free_.reserve(slots.size());
    std::string_view last_id;
    size_t last = SIZE_MAX;
    for (const IdleWorker& w : slots) {
      if (last == SIZE_MAX || last_id != w.id) {
        last = Worker(w.id, w.node_label, last == SIZE_MAX ? nullptr : &last_id);
        last_id = w.id;
        free_[last].tcp_only = free_[last].tcp_only || w.tcp_only;
      }
      AddSlot(last, w.slot);
    }
    SortLabels();
  }

  // The same from whole workers (the pass's form: one entry per worker, not per slot).
  explicit SlotPool(const std::vector<FreeWorker>& workers) {
    free_.reserve(workers.size());
    std::string_view last_id;
    for (size_t i = 0; i < workers.size(); ++i) {
      const FreeWorker& w = workers[i];
      const size_t at = Worker(w.id, w.node_label, i == 0 ? nullptr : &last_id);
      last_id = w.id;
      free_[at].tcp_only = free_[at].tcp_only || w.tcp_only;
      for (int slot : w.slots) AddSlot(at, slot);
    }
    SortLabels();
  }

  // Free slots with `label` ("" = any label).
  int64_t Available(const std::string& label) const {
    if (label.empty()) return total_;
    auto it = label_index_.find(label);
    return it == label_index_.end() ? 0 : labels_[it->second].free;
  }

  // The placement of `request`, its slots taken out of the pool; or, when the pool has
  // too few, not placed with the reason and the pool unchanged. Enough free slots always
  // place (step 3 spreads over labels), so the count decides.
  Placement Take(const GangRequest& request) {
    Placement out;
    const int world = request.sp * request.dp;
    const int64_t available = Available(request.required_label);
    if (available < world) {
      out.reason = absl::StrCat("needs ", world, " free slot", world == 1 ? "" : "s");
      if (!request.required_label.empty()) {
        absl::StrAppend(&out.reason, " with node label \"", request.required_label, "\"");
      }
      absl::StrAppend(&out.reason, ", ", available, " available");
      return out;
    }
    if (request.fabric_required && TcpOnlyFree(request) > 0) return TakeOverFabric(request);
    const size_t sp = static_cast<size_t>(request.sp);
    for (int g = 0; g < request.dp; ++g) {
      // 1. Best-fit worker: the fewest free slots that still hold a whole SP group.
      Free* best = nullptr;
      int64_t best_label_free = 0;
      for (int l : order_) {
        const Label& label = labels_[l];
        // A label whose workers never had sp free slots has none that holds the group.
        if (!Considered(request, label.name) || label.max_worker_free < sp) continue;
        for (size_t i : label.workers) {
          Free& f = free_[i];
          if (f.slots.size() < sp) continue;
          if (best == nullptr || f.slots.size() < best->slots.size() ||
              (f.slots.size() == best->slots.size() && label.free < best_label_free)) {
            best = &f;
            best_label_free = label.free;
          }
        }
      }
      if (best != nullptr) {
        TakeFrom(*best, sp, &out);
        continue;
      }
      // 2. Best-fit label: the fewest free slots that still hold a whole SP group.
      int label = -1;
      for (int l : order_) {
        const int64_t n = labels_[l].free;
        if (Considered(request, labels_[l].name) && n >= static_cast<int64_t>(sp) &&
            (label < 0 || n < labels_[label].free)) {
          label = l;
        }
      }
      if (label >= 0) {
        TakeFromLabel(label, request.sp, &out);
        continue;
      }
      // 3. No label fits a whole group: spread over the largest labels.
      int64_t need = request.sp;
      while (need > 0) {
        int largest = -1;
        for (int l : order_) {
          if (Considered(request, labels_[l].name) && labels_[l].free > 0 &&
              (largest < 0 || labels_[l].free > labels_[largest].free)) {
            largest = l;
          }
        }
        if (largest < 0) {  // Unreachable: `available` covered the group.
          return Placement{false, {}, {}, "no free slot left"};
        }
        const int64_t take = std::min(need, labels_[largest].free);
        TakeFromLabel(largest, take, &out);
        need -= take;
      }
    }
    out.placed = true;
    return out;
  }

  void Remove(const std::string& id, int slot) {
    BuildIndex();
    auto it = index_.find(id);
    if (it == index_.end()) return;
    Free& f = free_[it->second];
    auto s = std::find(f.slots.begin(), f.slots.end(), slot);
    if (s == f.slots.end()) return;
    f.slots.erase(s);
    if (f.tcp_only) --tcp_only_free_;
    --labels_[f.label].free;
    --total_;
  }

  // The free slots, workers in order of first appearance.
  std::vector<IdleWorker> Slots() const {
    std::vector<IdleWorker> out;
    out.reserve(static_cast<size_t>(total_));
    for (const Free& f : free_) {
      for (int slot : f.slots) {
        out.push_back(
            IdleWorker{std::string(f.id), std::string(labels_[f.label].name), slot, f.tcp_only});
      }
    }
    return out;
  }

 private:
  // A node's slots; 8 GPUs per node is the common case.
  using SlotList = absl::InlinedVector<int, 8>;
  struct Free {
    std::string_view id;  // Into the pool's input.
    int label = 0;        // Index into labels_.
    SlotList slots;
    bool tcp_only = false;  // IdleWorker::tcp_only.
  };
  struct Label {
    std::string_view name;        // Into the pool's input.
    int64_t free = 0;             // Free slots of its workers.
    size_t max_worker_free = 0;   // The most free slots of one of its workers when built.
    std::vector<size_t> workers;  // free_ indices, in order of first appearance.
  };

  static bool Considered(const GangRequest& request, std::string_view label) {
    return request.required_label.empty() || label == request.required_label;
  }

  // Free slots of tcp_only workers that `request` may use (its label).
  int64_t TcpOnlyFree(const GangRequest& request) const {
    if (tcp_only_free_ == 0) return 0;
    if (request.required_label.empty()) return tcp_only_free_;
    int64_t n = 0;
    for (const Free& f : free_) {
      if (f.tcp_only && labels_[f.label].name == request.required_label) {
        n += static_cast<int64_t>(f.slots.size());
      }
    }
    return n;
  }

  // A fabric_required gang while tcp_only workers have free slots: one worker that holds it
  // whole (best fit: no network inside a worker), else one node label that does, else the
  // usual steps over the workers that are not tcp_only (their slots hidden meanwhile), else
  // not placed with the reason.
  Placement TakeOverFabric(const GangRequest& request) {
    const size_t world = static_cast<size_t>(request.sp) * static_cast<size_t>(request.dp);
    Free* best = nullptr;
    size_t largest = 0;
    for (Free& f : free_) {
      if (!Considered(request, labels_[f.label].name)) continue;
      largest = std::max(largest, f.slots.size());
      if (f.slots.size() >= world && (best == nullptr || f.slots.size() < best->slots.size())) {
        best = &f;
      }
    }
    Placement out;
    if (best != nullptr) {
      TakeFrom(*best, world, &out);
      out.placed = true;
      return out;
    }
    // One node label that holds it (several agents of one node share its label: NVLink and
    // shared memory between them, no network): the smallest such label.
    int label = -1;
    for (int l : order_) {
      if (Considered(request, labels_[l].name) && labels_[l].free >= static_cast<int64_t>(world) &&
          (label < 0 || labels_[l].free < labels_[label].free)) {
        label = l;
      }
    }
    if (label >= 0) {
      TakeFromLabel(label, static_cast<int64_t>(world), &out);
      out.placed = true;
      return out;
    }
    std::vector<std::pair<size_t, SlotList>> hidden;
    std::vector<std::string_view> sockets;  // tcp_only workers with free slots, named.
    for (size_t i = 0; i < free_.size(); ++i) {
      Free& f = free_[i];
      if (!f.tcp_only || f.slots.empty()) continue;
      if (Considered(request, labels_[f.label].name)) sockets.push_back(f.id);
      const auto n = static_cast<int64_t>(f.slots.size());
      labels_[f.label].free -= n;
      total_ -= n;
      hidden.emplace_back(i, std::move(f.slots));
      f.slots.clear();
    }
    const int64_t saved_tcp_only = tcp_only_free_;
    tcp_only_free_ = 0;
    GangRequest plain = request;
    plain.fabric_required = false;
    const int64_t fabric_free = Available(request.required_label);
    if (fabric_free >= static_cast<int64_t>(world)) out = Take(plain);
    for (auto& [i, slots] : hidden) {
      Free& f = free_[i];
      const auto n = static_cast<int64_t>(slots.size());
      f.slots = std::move(slots);
      labels_[f.label].free += n;
      total_ += n;
    }
    tcp_only_free_ = saved_tcp_only;
    if (out.placed) return out;
    out.reason =
        absl::StrCat("needs ", world,
                     " free slots on workers with a fabric between nodes (efa, tcpxo, ib) "
                     "or on one worker or node label: ",
                     fabric_free, " such slots free, at most ", largest, " on one worker; ");
    for (size_t k = 0; k < sockets.size() && k < 3; ++k) {
      absl::StrAppend(&out.reason, k == 0 ? "" : ", ", std::string(sockets[k]));
    }
    if (sockets.size() > 3) absl::StrAppend(&out.reason, " and ", sockets.size() - 3, " more");
    absl::StrAppend(&out.reason, sockets.size() == 1 ? " reaches" : " reach",
                    " other nodes only over TCP sockets (set spec.parallelism.allow_tcp_fabric: "
                    "true to run this group over TCP)");
    return out;
  }

  // The free_ index of worker `id`, added (with no slots) when new. A worker's slots are
  // usually listed together, and the pass lists workers in id order: then an id greater
  // than the previous one (`previous`) is a new worker and no index is needed to group.
  size_t Worker(std::string_view id, std::string_view label, const std::string_view* previous) {
    if (!index_built_ && (previous == nullptr || *previous < id)) return AddWorker(id, label);
    BuildIndex();
    auto it = index_.find(id);
    if (it != index_.end()) return it->second;
    const size_t at = AddWorker(id, label);
    index_.emplace(id, at);
    return at;
  }

  // Appends a worker with no slots yet; returns its free_ index.
  size_t AddWorker(std::string_view id, std::string_view label_name) {
    const int label = LabelIndex(label_name);
    free_.push_back(Free{id, label, {}});
    labels_[label].workers.push_back(free_.size() - 1);
    return free_.size() - 1;
  }

  void AddSlot(size_t worker, int slot) {
    Free& f = free_[worker];
    f.slots.push_back(slot);
    if (f.tcp_only) ++tcp_only_free_;
    Label& label = labels_[f.label];
    ++label.free;
    label.max_worker_free = std::max(label.max_worker_free, f.slots.size());
    ++total_;
  }

  void SortLabels() {
    order_.resize(labels_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int>(i);
    std::sort(order_.begin(), order_.end(),
              [&](int a, int b) { return labels_[a].name < labels_[b].name; });
  }

  // The worker id -> free_ index map, built on first need (a pass over workers listed in
  // id order needs none).
  void BuildIndex() {
    if (index_built_) return;
    index_.reserve(free_.size());
    for (size_t i = 0; i < free_.size(); ++i) index_.emplace(free_[i].id, i);
    index_built_ = true;
  }

  int LabelIndex(std::string_view name) {
    auto [it, inserted] = label_index_.try_emplace(name, static_cast<int>(labels_.size()));
    if (inserted) labels_.push_back(Label{name, 0, 0, {}});
    return it->second;
  }

  // Takes the first n slots of `f`.
  void TakeFrom(Free& f, size_t n, Placement* out) {
    for (size_t i = 0; i < n; ++i) {
      out->worker_ids.emplace_back(f.id);
      out->slots.push_back(f.slots[i]);
    }
    f.slots.erase(f.slots.begin(), f.slots.begin() + static_cast<std::ptrdiff_t>(n));
    labels_[f.label].free -= static_cast<int64_t>(n);
    total_ -= static_cast<int64_t>(n);
    if (f.tcp_only) tcp_only_free_ -= static_cast<int64_t>(n);
  }

  // Takes up to n slots of label `l`, from its workers with the most free slots first.
  void TakeFromLabel(int l, int64_t n, Placement* out) {
    const std::vector<size_t>& workers = labels_[l].workers;
    while (n > 0) {
      Free* most = nullptr;
      for (size_t i : workers) {
        if (most == nullptr || free_[i].slots.size() > most->slots.size()) most = &free_[i];
      }
      if (most == nullptr || most->slots.empty()) return;
      const size_t take = std::min(static_cast<size_t>(n), most->slots.size());
      TakeFrom(*most, take, out);
      n -= static_cast<int64_t>(take);
    }
  }

  std::vector<Free> free_;
  std::unordered_map<std::string_view, size_t> index_;     // Worker id -> free_ index.
  bool index_built_ = false;                               // index_ holds every worker.
  std::vector<Label> labels_;                              // In order of first appearance.
  std::unordered_map<std::string_view, int> label_index_;  // Label -> labels_ index.
  std::vector<int> order_;                                 // labels_ indices by label name.
  int64_t total_ = 0;
  int64_t tcp_only_free_ = 0;  // Free slots of tcp_only workers (counted in total_ too).
};

}  // namespace

Placement PlaceGang(const GangRequest& request, const std::vector<IdleWorker>& idle) {
  SlotPool pool(idle);
  return pool.Take(request);
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
  // A placement succeeds exactly when enough eligible slots exist (PlaceGang spreads over
  // labels when it must), so whether a set of victims frees enough is a count.
  auto eligible = [&](const std::vector<IdleWorker>& slots) {
    int64_t n = 0;
    for (const IdleWorker& w : slots) {
      n += job.gang.required_label.empty() || w.node_label == job.gang.required_label;
    }
    return n;
  };
  const int64_t world = static_cast<int64_t>(job.gang.sp) * job.gang.dp;
  const int64_t available_eligible = eligible(available);
  std::vector<int64_t> frees(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) frees[i] = eligible(candidates[i].workers);
  auto fits = [&](const std::vector<size_t>& chosen) {
    int64_t n = available_eligible;
    for (size_t i : chosen) n += frees[i];
    return n >= world;
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

std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue, std::vector<IdleWorker> idle,
                                     const std::vector<IdleWorker>& live, const QuotaPolicy* quotas,
                                     std::map<std::string, int64_t> in_use,
                                     const std::vector<RunningJob>& running,
                                     const std::vector<IdleWorker>& freeing) {
  return PlanQueue(std::move(queue), std::move(idle), LiveSlots::Of(live), quotas,
                   std::move(in_use), running, freeing);
}

namespace {

// "the registered workers have 2 slots in all for a group of 4 (start workers ...)".
std::string ClusterHasText(const GangRequest& gang, int64_t eligible) {
  const int64_t needed = int64_t{gang.sp} * gang.dp;
  return absl::StrCat(
      "the registered workers have ", eligible, " slot", eligible == 1 ? "" : "s", " in all",
      gang.required_label.empty() ? std::string()
                                  : absl::StrCat(" with node label \"", gang.required_label, "\""),
      " for a group of ", needed,
      " (start workers with a larger --capacity, add workers, or lower the stage's sp_degree x "
      "dp_degree)");
}

}  // namespace

std::string StageName(int index, int count) {
  return absl::StrCat("stage ", index + 1, " of ", count);
}

std::optional<UnschedulableStage> FirstUnschedulableStage(const std::vector<GangRequest>& stages,
                                                          int from, const LiveSlots& live) {
  const int count = static_cast<int>(stages.size());
  for (int i = std::max(0, from); i < count; ++i) {
    const int64_t needed = int64_t{stages[i].sp} * stages[i].dp;
    const int64_t available = live.EligibleFor(stages[i]);
    if (available >= needed) continue;
    return UnschedulableStage{
        i, needed, available,
        absl::StrCat(StageName(i, count), " needs ", needed, needed == 1 ? " slot" : " slots",
                     " (sp ", stages[i].sp, " x dp ", stages[i].dp, "); ",
                     ClusterHasText(stages[i], available))};
  }
  return std::nullopt;
}

LiveSlots LiveSlots::Of(const std::vector<IdleWorker>& live) {
  LiveSlots out;
  for (const IdleWorker& w : live) out.Add(w.node_label, 1, w.tcp_only);
  return out;
}

void LiveSlots::Add(const std::string& label, int64_t slots, bool is_tcp_only) {
  total += slots;
  int64_t& in_label = by_label[label];
  in_label += slots;
  largest_label = std::max(largest_label, in_label);
  if (is_tcp_only) tcp_only += slots;
}

int64_t LiveSlots::EligibleFor(const GangRequest& request) const {
  if (!request.fabric_required || tcp_only == 0 || !request.required_label.empty()) {
    return Eligible(request.required_label);  // A label's slots can hold it on that label.
  }
  return std::max(total - tcp_only, largest_label);
}

int64_t LiveSlots::Eligible(const std::string& required_label) const {
  if (required_label.empty()) return total;
  auto it = by_label.find(required_label);
  return it == by_label.end() ? 0 : it->second;
}

namespace {

// PlanQueue over the free slots in `pool`.
std::vector<QueueDecision> PlanQueueFrom(SlotPool pool, std::vector<QueuedJob> queue,
                                         const LiveSlots& live, const QuotaPolicy* quotas,
                                         std::map<std::string, int64_t> in_use,
                                         const std::vector<RunningJob>& running,
                                         const std::vector<IdleWorker>& freeing) {
  std::sort(queue.begin(), queue.end(), [](const QueuedJob& a, const QueuedJob& b) {
    return QueueKey{a.priority, a.number} < QueueKey{b.priority, b.number};
  });
  std::vector<QueueDecision> out;
  out.reserve(queue.size());
  const QueuedJob* head = nullptr;  // The first job that waits for workers that exist.
  // The free slots: every job ahead of the head places from `pool`; once the head waits,
  // the jobs behind it place from `behind`: the pool without the head's reservation.
  std::optional<SlotPool> behind;
  for (const QueuedJob& job : queue) {
    QueueDecision d;
    d.job_id = job.id;
    const int64_t needed = static_cast<int64_t>(job.gang.sp) * job.gang.dp;
    std::string over_quota;
    if (quotas != nullptr &&
        !FitsWorkerQuota(job.tenant, in_use[job.tenant], needed, *quotas, &over_quota)) {
      d.kind = QueueDecision::Kind::kUnplaced;
      d.reason = absl::StrCat(StageName(job.stage_index, job.stage_count), ": ", over_quota);
    } else if (job.in_backoff) {
      d.kind = QueueDecision::Kind::kBackoff;
    } else {
      Placement p = behind.has_value() ? behind->Take(job.gang) : pool.Take(job.gang);
      if (p.placed) {
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
        d.reason = absl::StrCat(StageName(job.stage_index, job.stage_count), ": ", p.reason);
        const int64_t eligible = live.EligibleFor(job.gang);
        if (eligible < needed) {
          // Not a matter of waiting: the registered cluster cannot hold the gang at all.
          absl::StrAppend(&d.reason, "; unschedulable: ", ClusterHasText(job.gang, eligible));
        }
        if (eligible >= needed) {
          head = &job;
          // Workers that free up first in the order: the head waits for them anyway, and
          // every idle worker its placement leaves out is free for backfill.
          const std::vector<IdleWorker> free_now = pool.Slots();
          std::vector<IdleWorker> soon = freeing;
          soon.insert(soon.end(), free_now.begin(), free_now.end());
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
          } else if (!freeing.empty() && pool.Available("") < needed) {
            absl::StrAppend(&d.reason, "; waiting for slots of ending attempts to free up");
          }
          behind.emplace(pool);
          if (later.placed) {
            // Hold exactly the free slots of the placement it will get.
            for (size_t r = 0; r < later.worker_ids.size(); ++r) {
              behind->Remove(later.worker_ids[r], later.slots[r]);
            }
          } else {
            // It waits for attempts to end: any free slot it could use may be needed.
            for (const IdleWorker& w : free_now) {
              if (job.gang.required_label.empty() || w.node_label == job.gang.required_label) {
                behind->Remove(w.id, w.slot);
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

}  // namespace

std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue, std::vector<IdleWorker> idle,
                                     const LiveSlots& live, const QuotaPolicy* quotas,
                                     std::map<std::string, int64_t> in_use,
                                     const std::vector<RunningJob>& running,
                                     const std::vector<IdleWorker>& freeing) {
  return PlanQueueFrom(SlotPool(idle), std::move(queue), live, quotas, std::move(in_use), running,
                       freeing);
}

std::vector<QueueDecision> PlanQueue(std::vector<QueuedJob> queue,
                                     const std::vector<FreeWorker>& free, const LiveSlots& live,
                                     const QuotaPolicy* quotas,
                                     std::map<std::string, int64_t> in_use,
                                     const std::vector<RunningJob>& running,
                                     const std::vector<IdleWorker>& freeing) {
  return PlanQueueFrom(SlotPool(free), std::move(queue), live, quotas, std::move(in_use), running,
                       freeing);
}

}  // namespace ulysses::coordinator
