// Gang placement, queue order and config validation (pure functions).
#include "coordinator/scheduler.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "coordinator/checkpoint_interval.h"
#include "coordinator/config.h"
#include "coordinator/pool_demand.h"
#include "gtest/gtest.h"

namespace ulysses::coordinator {
namespace {

std::vector<IdleWorker> Workers(const std::vector<std::pair<std::string, std::string>>& ws) {
  std::vector<IdleWorker> out;
  for (const auto& [id, label] : ws) out.push_back({id, label});
  return out;
}

TEST(SchedulerTest, PlacesTheWholeGangOrNothing) {
  auto idle = Workers({{"a", "n1"}, {"b", "n1"}});
  Placement p = PlaceGang({4, 1, ""}, idle);
  EXPECT_FALSE(p.placed);
  EXPECT_TRUE(p.worker_ids.empty());
  EXPECT_EQ(p.reason, "needs 4 free slots, 2 available");
  Placement q = PlaceGang({2, 1, ""}, idle);
  ASSERT_TRUE(q.placed);
  EXPECT_EQ(q.worker_ids.size(), 2u);
}

TEST(SchedulerTest, KeepsEachSpGroupOnOneNodeLabel) {
  // n1 has 3 idle, n2 has 2: an SP group of 2 fits in either; best fit takes n2 whole.
  auto idle = Workers({{"a", "n1"}, {"b", "n2"}, {"c", "n1"}, {"d", "n2"}, {"e", "n1"}});
  Placement p = PlaceGang({2, 1, ""}, idle);
  ASSERT_TRUE(p.placed);
  EXPECT_EQ(std::set<std::string>(p.worker_ids.begin(), p.worker_ids.end()),
            (std::set<std::string>{"b", "d"}));
  // dp=2 groups of sp=2: each group's ranks (0,1) and (2,3) share a label.
  Placement q = PlaceGang({2, 2, ""}, idle);
  ASSERT_TRUE(q.placed);
  ASSERT_EQ(q.worker_ids.size(), 4u);
  auto label = [&](const std::string& id) {
    return std::find_if(idle.begin(), idle.end(), [&](const IdleWorker& w) { return w.id == id; })
        ->node_label;
  };
  EXPECT_EQ(label(q.worker_ids[0]), label(q.worker_ids[1]));
  EXPECT_EQ(label(q.worker_ids[2]), label(q.worker_ids[3]));
}

TEST(SchedulerTest, SpreadsWhenNoLabelHoldsAGroup) {
  auto idle = Workers({{"a", "n1"}, {"b", "n2"}, {"c", "n3"}});
  Placement p = PlaceGang({3, 1, ""}, idle);
  ASSERT_TRUE(p.placed);
  EXPECT_EQ(std::set<std::string>(p.worker_ids.begin(), p.worker_ids.end()),
            (std::set<std::string>{"a", "b", "c"}));
}

TEST(SchedulerTest, RequiredLabelFiltersAndExplains) {
  auto idle = Workers({{"a", "gpu"}, {"b", "cpu"}, {"c", "cpu"}});
  Placement p = PlaceGang({2, 1, "gpu"}, idle);
  EXPECT_FALSE(p.placed);
  EXPECT_EQ(p.reason, "needs 2 free slots with node label \"gpu\", 1 available");
}

// Free slots of multi-GPU workers: (worker id, node label, free slot count).
std::vector<IdleWorker> Slots(const std::vector<std::tuple<std::string, std::string, int>>& ws) {
  std::vector<IdleWorker> out;
  for (const auto& [id, label, n] : ws) {
    for (int slot = 0; slot < n; ++slot) out.push_back({id, label, slot});
  }
  return out;
}

TEST(SchedulerTest, AnSpGroupLandsInsideOneWorkerWhenOneHasTheSlots) {
  // Label n1: two 1-slot workers (2 slots, the best-fitting label); n2: one 4-slot worker.
  // One worker holding the whole group beats a smaller label spread over two workers.
  auto idle = Slots({{"a", "n1", 1}, {"b", "n1", 1}, {"big", "n2", 4}});
  Placement p = PlaceGang({2, 1, ""}, idle);
  ASSERT_TRUE(p.placed);
  EXPECT_EQ(p.worker_ids, (std::vector<std::string>{"big", "big"}));
  EXPECT_EQ(p.slots, (std::vector<int>{0, 1}));
  // Best fit among workers: a 2-slot worker before a 4-slot one, keeping the big one whole.
  idle = Slots({{"four", "n1", 4}, {"two", "n2", 2}});
  p = PlaceGang({2, 1, ""}, idle);
  ASSERT_TRUE(p.placed);
  EXPECT_EQ(p.worker_ids, (std::vector<std::string>{"two", "two"}));
  // A 4-rank group fills the 4-slot worker, each slot once.
  p = PlaceGang({4, 1, ""}, idle);
  ASSERT_TRUE(p.placed);
  EXPECT_EQ(p.worker_ids, (std::vector<std::string>(4, "four")));
  EXPECT_EQ(std::set<int>(p.slots.begin(), p.slots.end()), (std::set<int>{0, 1, 2, 3}));
}

TEST(SchedulerTest, AnSpGroupTooBigForAnyWorkerStaysOnOneNodeLabelThenSpreads) {
  // No worker has 4 free slots; node n1 has two 2-slot workers (4 slots): the group stays on
  // n1 rather than crossing to n2.
  auto idle = Slots({{"n2-a", "n2", 3}, {"n1-a", "n1", 2}, {"n1-b", "n1", 2}});
  Placement p = PlaceGang({4, 1, ""}, idle);
  ASSERT_TRUE(p.placed);
  EXPECT_EQ(std::set<std::string>(p.worker_ids.begin(), p.worker_ids.end()),
            (std::set<std::string>{"n1-a", "n1-b"}));
  // 6 ranks fit on no label: spread, the largest label first, every slot used once.
  p = PlaceGang({6, 1, ""}, idle);
  ASSERT_TRUE(p.placed);
  std::set<std::string> keys;
  for (size_t r = 0; r < p.worker_ids.size(); ++r) {
    keys.insert(IdleWorker{p.worker_ids[r], "", p.slots[r]}.key());
  }
  EXPECT_EQ(keys.size(), 6u);
  EXPECT_EQ(std::count(p.worker_ids.begin(), p.worker_ids.end(), "n1-a") +
                std::count(p.worker_ids.begin(), p.worker_ids.end(), "n1-b"),
            4);
}

TEST(SchedulerTest, DpReplicasOfSpGroupsEachFillAWorker) {
  // sp 2 x dp 2 on two 2-slot workers and one 4-slot worker: each SP group inside one worker.
  auto idle = Slots({{"x", "n1", 2}, {"y", "n2", 2}, {"z", "n3", 4}});
  Placement p = PlaceGang({2, 2, ""}, idle);
  ASSERT_TRUE(p.placed);
  ASSERT_EQ(p.worker_ids.size(), 4u);
  EXPECT_EQ(p.worker_ids[0], p.worker_ids[1]);
  EXPECT_EQ(p.worker_ids[2], p.worker_ids[3]);
  EXPECT_NE(p.slots[0], p.slots[1]);
  EXPECT_NE(p.slots[2], p.slots[3]);
}

TEST(SchedulerTest, QueueLaunchesSeveralJobsOnTheSlotsOfOneWorker) {
  // One 4-slot worker: two sp=2 jobs both launch on it, on different slots.
  auto idle = Slots({{"w", "n1", 4}});
  std::vector<QueuedJob> queue = {
      {"j1", 0, 1, 0, {2, 1, ""}}, {"j2", 0, 2, 0, {2, 1, ""}}, {"j3", 0, 3, 0, {1, 1, ""}}};
  auto d = PlanQueue(queue, idle, idle);
  ASSERT_EQ(d.size(), 3u);
  ASSERT_EQ(d[0].kind, QueueDecision::Kind::kLaunch);
  ASSERT_EQ(d[1].kind, QueueDecision::Kind::kLaunch);
  std::set<int> used(d[0].slots.begin(), d[0].slots.end());
  used.insert(d[1].slots.begin(), d[1].slots.end());
  EXPECT_EQ(used, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(d[2].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(d[2].reason, "stage 1 of 1: needs 1 free slot, 0 available");
}

TEST(SchedulerTest, QueueOrderIsPriorityThenFifo) {
  std::vector<QueueKey> keys = {{0, 1}, {5, 3}, {5, 2}, {-1, 0}};
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys[0].priority, 5);
  EXPECT_EQ(keys[0].number, 2);
  EXPECT_EQ(keys[1].number, 3);
  EXPECT_EQ(keys[2].priority, 0);
  EXPECT_EQ(keys[3].priority, -1);
}

QueuedJob Queued(const std::string& id, int64_t priority, int64_t number, int sp,
                 const std::string& label = "", bool in_backoff = false) {
  QueuedJob j;
  j.id = id;
  j.priority = priority;
  j.number = number;
  j.gang = {sp, 1, label};
  j.in_backoff = in_backoff;
  return j;
}

TEST(PlanQueueTest, LaunchesInPriorityThenFifoOrder) {
  auto idle = Workers({{"a", "n1"}, {"b", "n1"}, {"c", "n2"}});
  std::vector<QueueDecision> d = PlanQueue(
      {Queued("low", 0, 1, 1), Queued("high", 5, 3, 2), Queued("mid", 1, 2, 1)}, idle, idle);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].job_id, "high");
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kLaunch);
  EXPECT_EQ(d[0].worker_ids.size(), 2u);
  EXPECT_EQ(d[1].job_id, "mid");
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kLaunch);
  EXPECT_EQ(d[2].job_id, "low");
  EXPECT_EQ(d[2].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(d[2].reason, "stage 1 of 1: needs 1 free slot, 0 available");
  // Each worker is used once.
  std::set<std::string> used;
  for (const auto& x : d) used.insert(x.worker_ids.begin(), x.worker_ids.end());
  EXPECT_EQ(used.size(), 3u);
}

TEST(PlanQueueTest, HeadOfLineBlocksSmallerJobsBehindAPlaceableGang) {
  // 2 idle of 4 live workers: the 4-gang waits and blocks the 1-gang behind it.
  auto idle = Workers({{"a", "n"}, {"b", "n"}});
  auto live = Workers({{"a", "n"}, {"b", "n"}, {"c", "n"}, {"d", "n"}});
  std::vector<QueueDecision> d =
      PlanQueue({Queued("big", 5, 1, 4), Queued("small", 0, 2, 1)}, idle, live);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kBlocked);
  EXPECT_EQ(d[1].reason, "queued behind big (priority 5)");
  EXPECT_TRUE(d[1].worker_ids.empty());
}

TEST(PlanQueueTest, ATenantOverItsWorkerQuotaWaitsAndBlocksNoOtherTenant) {
  auto idle = Workers({{"a", "n"}, {"b", "n"}, {"c", "n"}, {"d", "n"}});
  QuotaPolicy quotas;
  quotas.tenants["small"].max_workers = 3;
  std::vector<QueuedJob> queue = {Queued("s1", 9, 1, 2), Queued("s2", 9, 2, 2),
                                  Queued("other", 0, 3, 2)};
  queue[0].tenant = "small";
  queue[1].tenant = "small";
  queue[2].tenant = "big";
  // "small" already holds 1 worker elsewhere: s1 (2) fits (3), s2 would make 5.
  std::vector<QueueDecision> d = PlanQueue(queue, idle, idle, &quotas, {{"small", 1}});
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kLaunch);
  EXPECT_EQ(d[1].job_id, "s2");
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_NE(d[1].reason.find("holds 3 of its 3 workers"), std::string::npos) << d[1].reason;
  EXPECT_EQ(d[2].job_id, "other");
  EXPECT_EQ(d[2].kind, QueueDecision::Kind::kLaunch);  // Not blocked by s2.
}

TEST(PlanQueueTest, AGangThatCanNeverBePlacedBlocksNoOne) {
  // Only 2 live workers with label "n": a 4-gang can never run, so the 1-gang goes.
  auto idle = Workers({{"a", "n"}, {"b", "n"}});
  std::vector<QueueDecision> d =
      PlanQueue({Queued("huge", 5, 1, 4), Queued("small", 0, 2, 1)}, idle, idle);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kLaunch);
  // Likewise a label no live worker has.
  std::vector<QueueDecision> e =
      PlanQueue({Queued("gpu", 5, 1, 1, "gpu"), Queued("small", 0, 2, 1)}, idle, idle);
  EXPECT_EQ(e[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(e[1].kind, QueueDecision::Kind::kLaunch);
}

TEST(PlanQueueTest, AJobInBackoffWaitsWithoutBlocking) {
  auto idle = Workers({{"a", "n"}});
  std::vector<QueueDecision> d = PlanQueue(
      {Queued("backoff", 5, 1, 1, "", /*in_backoff=*/true), Queued("next", 0, 2, 1)}, idle, idle);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kBackoff);
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kLaunch);
  EXPECT_EQ(d[1].worker_ids, std::vector<std::string>{"a"});
}

// --- Priority preemption (PlanPreemption, PlanQueue kPreempt). ---

RunningJob Running(const std::string& id, int64_t priority, int64_t number,
                   std::vector<std::string> worker_ids, double at_risk, bool preemptible = true) {
  RunningJob r;
  r.id = id;
  r.priority = priority;
  r.number = number;
  for (const std::string& w : worker_ids) r.workers.push_back({w, "n"});
  r.gpu_seconds_at_risk = at_risk;
  r.preemptible = preemptible;
  return r;
}

std::vector<std::string> VictimIds(const std::vector<Victim>& victims) {
  std::vector<std::string> out;
  for (const Victim& v : victims) out.push_back(v.job_id);
  return out;
}

TEST(PreemptionTest, ChoosesTheVictimThatLosesTheLeastWork) {
  // Two low jobs of 2 workers each; the high one needs 2: the one with less work at risk.
  std::vector<RunningJob> running = {Running("old-ckpt", 0, 1, {"a", "b"}, 900.0),
                                     Running("new-ckpt", 0, 2, {"c", "d"}, 40.0)};
  EXPECT_EQ(VictimIds(PlanPreemption(Queued("high", 10, 3, 2), {}, running)),
            std::vector<std::string>{"new-ckpt"});
  running[0].gpu_seconds_at_risk = 10.0;
  EXPECT_EQ(VictimIds(PlanPreemption(Queued("high", 10, 3, 2), {}, running)),
            std::vector<std::string>{"old-ckpt"});
}

TEST(PreemptionTest, TiesGoToTheLowestPriorityThenTheYoungest) {
  std::vector<RunningJob> running = {Running("p1-old", 1, 1, {"a"}, 5.0),
                                     Running("p0-old", 0, 2, {"b"}, 5.0),
                                     Running("p0-young", 0, 3, {"c"}, 5.0)};
  EXPECT_EQ(VictimIds(PlanPreemption(Queued("high", 10, 9, 1), {}, running)),
            std::vector<std::string>{"p0-young"});
  EXPECT_EQ(VictimIds(PlanPreemption(Queued("high", 10, 9, 3), {}, running)),
            (std::vector<std::string>{"p0-young", "p0-old", "p1-old"}));
}

TEST(PreemptionTest, OnlyAsManyAsNeededAndNeverEqualHigherOrOptedOut) {
  // Idle "x" + a cheap 1-worker job already make a 2-gang... but the cheapest is tried
  // first: "tiny" (1 worker) then "big" (3): with x, tiny suffices.
  std::vector<RunningJob> running = {Running("tiny", 0, 1, {"a"}, 1.0),
                                     Running("big", 0, 2, {"b", "c", "d"}, 2.0)};
  EXPECT_EQ(VictimIds(PlanPreemption(Queued("high", 5, 3, 2), {{"x", "n"}}, running)),
            std::vector<std::string>{"tiny"});
  // A 4-gang with x: tiny then big are added; tiny turns out not to be needed.
  EXPECT_EQ(VictimIds(PlanPreemption(Queued("high", 5, 3, 4), {{"x", "n"}}, running)),
            std::vector<std::string>{"big"});
  // Same priority, higher priority and opted-out jobs are never victims.
  std::vector<RunningJob> untouchable = {Running("same", 5, 1, {"a"}, 0.0),
                                         Running("higher", 9, 2, {"b"}, 0.0),
                                         Running("opted-out", 0, 3, {"c"}, 0.0, false)};
  EXPECT_TRUE(PlanPreemption(Queued("high", 5, 4, 1), {}, untouchable).empty());
  // No set of candidates makes room: none is preempted.
  EXPECT_TRUE(PlanPreemption(Queued("high", 5, 3, 9), {}, running).empty());
}

// The finding (issue 44): a job the whole cluster cannot hold waited forever behind
// "needs 4 free slots, 2 available". Its reason says it is unschedulable, what the cluster has
// and the fix; it does not become the head (jobs behind it still run).
TEST(PlanQueueTest, AGangLargerThanTheClusterIsUnschedulableWithTheFix) {
  auto idle = Workers({{"a", "n"}, {"b", "n"}});
  std::vector<QueueDecision> d =
      PlanQueue({Queued("big", 0, 1, 4), Queued("small", 0, 2, 1)}, idle, LiveSlots::Of(idle));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(
      d[0].reason,
      "stage 1 of 1: needs 4 free slots, 2 available; unschedulable: the registered workers have "
      "2 slots in all for a group of 4 (start workers with a larger --capacity, add "
      "workers, or lower the stage's sp_degree x dp_degree)");
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kLaunch);
  // Waiting for busy slots is not unschedulable.
  std::vector<QueueDecision> busy =
      PlanQueue({Queued("two", 0, 3, 2)}, std::vector<IdleWorker>{}, LiveSlots::Of(idle));
  ASSERT_EQ(busy.size(), 1u);
  EXPECT_EQ(busy[0].reason.find("unschedulable"), std::string::npos) << busy[0].reason;
}

TEST(PlanQueueTest, TheHeadPreemptsAndLowerJobsWaitForIt) {
  auto live = Workers({{"a", "n"}, {"b", "n"}, {"c", "n"}, {"d", "n"}});
  std::vector<RunningJob> running = {Running("low-a", 0, 1, {"a", "b"}, 300.0),
                                     Running("low-b", 0, 2, {"c", "d"}, 30.0)};
  std::vector<QueueDecision> d = PlanQueue({Queued("high", 10, 3, 2), Queued("small", 0, 4, 1)}, {},
                                           live, nullptr, {}, running);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kPreempt);
  EXPECT_EQ(VictimIds(d[0].victims), std::vector<std::string>{"low-b"});
  EXPECT_EQ(d[0].reason,
            "stage 1 of 1: needs 2 free slots, 0 available; preempting low-b (priority 0)");
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kBlocked);
  // Next round: low-b's workers are freeing; no further victim is chosen.
  running[1].preemptible = false;
  d = PlanQueue({Queued("high", 10, 3, 2)}, {}, live, nullptr, {}, running,
                Workers({{"c", "n"}, {"d", "n"}}));
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_TRUE(d[0].victims.empty());
  // Once they are idle, the head starts on them.
  d = PlanQueue({Queued("high", 10, 3, 2)}, Workers({{"c", "n"}, {"d", "n"}}), live, nullptr, {},
                {running[0]});
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kLaunch);
}

TEST(PlanQueueTest, ANonPreemptingHeadWaitsButStillHoldsItsPlaceInTheQueue) {
  auto live = Workers({{"a", "n"}, {"b", "n"}, {"c", "n"}});
  std::vector<RunningJob> running = {Running("low", 0, 1, {"a", "b"}, 30.0)};
  QueuedJob head = Queued("urgent", 10, 2, 2);
  head.may_preempt = false;
  std::vector<QueueDecision> d = PlanQueue({head, Queued("small", 0, 3, 1)}, Workers({{"c", "n"}}),
                                           live, nullptr, {}, running);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_TRUE(d[0].victims.empty());
  EXPECT_EQ(d[0].reason,
            "stage 1 of 1: needs 2 free slots, 1 available; priority 10 is a non-preempting class: "
            "waiting for running jobs to end");
  // It is still the head: the idle worker is reserved for it, not backfilled.
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kBlocked);
}

// --- Backfill with a reservation for the head job. ---

TEST(PlanQueueTest, BackfillUsesWorkersTheHeadDoesNotNeedButNeverItsReservation) {
  // 3 idle; "big" (priority 5) needs 4: 1 more frees up when an ending attempt's worker is
  // idle. Its reservation is 3 idle workers of that placement... all of them: nothing left.
  auto live = Workers({{"a", "n"}, {"b", "n"}, {"c", "n"}, {"d", "n"}, {"e", "n"}});
  auto idle = Workers({{"a", "n"}, {"b", "n"}, {"c", "n"}});
  std::vector<QueueDecision> d = PlanQueue({Queued("big", 5, 1, 4), Queued("small", 0, 2, 1)}, idle,
                                           live, nullptr, {}, {}, Workers({{"d", "n"}}));
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kBlocked);
  // Two workers freeing: the head's placement needs only 2 of the 3 idle; the third
  // backfills the small job, and the head still starts as soon as d and e are free.
  d = PlanQueue({Queued("big", 5, 1, 4), Queued("small", 0, 2, 1), Queued("small2", 0, 3, 1)}, idle,
                live, nullptr, {}, {}, Workers({{"d", "n"}, {"e", "n"}}));
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kLaunch);
  EXPECT_TRUE(d[1].backfill);
  ASSERT_EQ(d[1].worker_ids.size(), 1u);
  EXPECT_EQ(d[2].kind, QueueDecision::Kind::kBlocked);  // Only one spare.
  std::vector<std::string> all_idle_left;
  for (const IdleWorker& w : idle) {
    if (w.id != d[1].worker_ids[0]) all_idle_left.push_back(w.id);
  }
  Placement head = PlaceGang(
      {4, 1, ""},
      Workers({{all_idle_left[0], "n"}, {all_idle_left[1], "n"}, {"d", "n"}, {"e", "n"}}));
  EXPECT_TRUE(head.placed);  // The backfill did not take a worker the head needs.
}

TEST(PlanQueueTest, BackfillRunsOnWorkersOutsideTheHeadsLabel) {
  // The head needs 2 "gpu" workers and waits for running jobs to end: every idle "gpu"
  // worker is reserved, but an idle "cpu" worker runs a small unlabeled job.
  auto live = Workers({{"g1", "gpu"}, {"g2", "gpu"}, {"c1", "cpu"}});
  auto idle = Workers({{"g1", "gpu"}, {"c1", "cpu"}});
  std::vector<QueueDecision> d =
      PlanQueue({Queued("head", 5, 1, 2, "gpu"), Queued("small", 0, 2, 1)}, idle, live);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kLaunch);
  EXPECT_TRUE(d[1].backfill);
  EXPECT_EQ(d[1].worker_ids, std::vector<std::string>{"c1"});
}

TEST(SchedulerTest, AWorkersSlotsListedApartAreStillOneWorker) {
  // The pool groups a worker's slots however they are listed (the pass lists them together
  // and in id order; reservations and preemption list them in any order).
  Placement p = PlaceGang({2, 1, ""}, Slots({{"b", "n", 1}, {"a", "n", 1}}));
  ASSERT_TRUE(p.placed);  // Two 1-slot workers: spread over the label.
  std::vector<IdleWorker> apart = {{"b", "n", 0}, {"a", "n", 0}, {"b", "n", 1}};
  p = PlaceGang({2, 1, ""}, apart);
  ASSERT_TRUE(p.placed);
  EXPECT_EQ(p.worker_ids, (std::vector<std::string>{"b", "b"}));  // b holds the group.
  EXPECT_EQ(p.slots, (std::vector<int>{0, 1}));
}

// The coordinator's pass lists free slots per worker (FreeWorker); tests and reservations
// list them one by one. Both must decide the same, on clusters with labels, partly busy
// workers, ending attempts and queues that wait, preempt and backfill.
TEST(PlanQueueTest, PerWorkerFreeSlotsDecideAsTheSameSlotsListedOneByOne) {
  std::mt19937 rng(30);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int launches = 0, waits = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<IdleWorker> idle, live, freeing;
    std::vector<std::string> ids, labels;
    const int workers = uniform(1, 24);
    for (int i = 0; i < workers; ++i) {
      ids.push_back(absl::StrCat("w-", 100 + i));  // In id order, as the pass lists them.
      labels.push_back(absl::StrCat("rack-", uniform(0, 2)));
    }
    std::vector<FreeWorker> free;
    for (int i = 0; i < workers; ++i) {
      const int capacity = uniform(1, 8);
      FreeWorker* f = nullptr;
      for (int slot = 0; slot < capacity; ++slot) {
        live.push_back({ids[i], labels[i], slot});
        const int what = uniform(0, 3);  // 0-1 free, 2 busy, 3 freeing.
        if (what <= 1) {
          idle.push_back({ids[i], labels[i], slot});
          if (f == nullptr) f = &free.emplace_back(FreeWorker{ids[i], labels[i], {}});
          f->slots.push_back(slot);
        } else if (what == 3) {
          freeing.push_back({ids[i], labels[i], slot});
        }
      }
    }
    std::vector<QueuedJob> queue;
    const int jobs = uniform(1, 8);
    for (int j = 0; j < jobs; ++j) {
      QueuedJob q = Queued(absl::StrCat("job-", j), uniform(0, 2), j, uniform(1, 8),
                           uniform(0, 3) == 0 ? labels[0] : "", uniform(0, 7) == 0);
      q.gang.dp = uniform(1, 3);
      queue.push_back(q);
    }
    const std::vector<QueueDecision> by_slot =
        PlanQueue(queue, idle, LiveSlots::Of(live), nullptr, {}, {}, freeing);
    const std::vector<QueueDecision> by_worker =
        PlanQueue(queue, free, LiveSlots::Of(live), nullptr, {}, {}, freeing);
    ASSERT_EQ(by_slot.size(), by_worker.size());
    for (size_t i = 0; i < by_slot.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("trial ", trial, ", decision ", i));
      EXPECT_EQ(by_worker[i].job_id, by_slot[i].job_id);
      EXPECT_EQ(by_worker[i].kind, by_slot[i].kind);
      EXPECT_EQ(by_worker[i].worker_ids, by_slot[i].worker_ids);
      EXPECT_EQ(by_worker[i].slots, by_slot[i].slots);
      EXPECT_EQ(by_worker[i].reason, by_slot[i].reason);
      EXPECT_EQ(by_worker[i].backfill, by_slot[i].backfill);
      launches += by_slot[i].kind == QueueDecision::Kind::kLaunch;
      waits += by_slot[i].kind == QueueDecision::Kind::kUnplaced ||
               by_slot[i].kind == QueueDecision::Kind::kBlocked;
    }
  }
  // The trials covered both outcomes.
  EXPECT_GT(launches, 100);
  EXPECT_GT(waits, 100);
}

TEST(ConfigTest, RejectsBadValuesWithActionableMessages) {
  CoordinatorConfig c;
  c.state_dir = "/tmp/x";
  c.heartbeat_timeout_s = 5000;
  c.rendezvous_port_min = 3000;
  c.rendezvous_port_max = 2000;
  absl::Status s = ValidateAndFinalize(&c);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::string m(s.message());
  EXPECT_NE(m.find("heartbeat_timeout_s: 5000 is out of range"), std::string::npos) << m;
  EXPECT_NE(m.find("rendezvous_port_min/rendezvous_port_max: 3000/2000"), std::string::npos) << m;
}

// (Flags over the file is main.cc's job: coordinator_process_test FlagsOverrideTheConfigFile.)
TEST(ConfigTest, YamlFillsFieldsDerivesDefaultsAndRejectsUnknownKeys) {
  CoordinatorConfig c;
  ASSERT_TRUE(ApplyConfigYaml("heartbeat_timeout_s: 4\nheartbeat_interval_s: 1\n"
                              "log_buffer_lines: 50\nstate_dir: /tmp/s\n",
                              &c)
                  .ok());
  EXPECT_EQ(c.heartbeat_timeout_s, 4);
  EXPECT_EQ(c.log_buffer_lines, 50);
  ASSERT_TRUE(ValidateAndFinalize(&c).ok());
  EXPECT_EQ(c.checkpoint_root, "/tmp/s/checkpoints");
  EXPECT_EQ(c.reconnect_window_s, 45);  // The later of 2 x 4 s and lost_after_s (45 s).
  absl::Status unknown = ApplyConfigYaml("heartbeat_timout_s: 4\n", &c);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(std::string(unknown.message()).find("config.heartbeat_timout_s: unknown setting"),
            std::string::npos);
}

TEST(ConfigTest, PreemptionSettingsAreValidated) {
  CoordinatorConfig c;
  ASSERT_TRUE(ApplyConfigYaml("state_dir: /tmp/x\nnon_preempting_priorities: [5, 2000000, 5]\n"
                              "preemption_grace_s: -1\n",
                              &c)
                  .ok());
  EXPECT_EQ(c.non_preempting_priorities, (std::vector<int64_t>{5, 2000000, 5}));
  absl::Status s = ValidateAndFinalize(&c);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::string m(s.message());
  EXPECT_NE(m.find("non_preempting_priorities: 2000000 is out of range (use -1000000..1000000"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("non_preempting_priorities: 5 is listed twice"), std::string::npos) << m;
  EXPECT_NE(m.find("preemption_grace_s: -1 is out of range"), std::string::npos) << m;
  CoordinatorConfig ok;
  ASSERT_TRUE(ApplyConfigYaml("state_dir: /tmp/x\nnon_preempting_priorities: [5, -3]\n"
                              "preemption_grace_s: 120\n",
                              &ok)
                  .ok());
  EXPECT_TRUE(ValidateAndFinalize(&ok).ok());
}

// every_steps: auto's priors: named with the value and the range, NaN included.
TEST(ConfigTest, CheckpointIntervalPriorsAreValidated) {
  CoordinatorConfig c;
  ASSERT_TRUE(ApplyConfigYaml("state_dir: /tmp/x\ncheckpoint_mtbf_prior_gpu_hours: 0\n"
                              "checkpoint_cost_prior_s: .nan\n",
                              &c)
                  .ok());
  absl::Status s = ValidateAndFinalize(&c);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const std::string m(s.message());
  EXPECT_NE(m.find("checkpoint_mtbf_prior_gpu_hours: 0 is out of range (use GPU-hours per "
                   "failure in (0, 1e9]"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("checkpoint_cost_prior_s: nan is out of range"), std::string::npos) << m;
  CoordinatorConfig ok;
  ASSERT_TRUE(ApplyConfigYaml("state_dir: /tmp/x\ncheckpoint_mtbf_prior_gpu_hours: 1000\n"
                              "checkpoint_cost_prior_s: 30\n",
                              &ok)
                  .ok());
  EXPECT_TRUE(ValidateAndFinalize(&ok).ok());
  EXPECT_DOUBLE_EQ(ok.checkpoint_mtbf_prior_gpu_hours, 1000);
  EXPECT_DOUBLE_EQ(ok.checkpoint_cost_prior_s, 30);
  CoordinatorConfig defaults;
  defaults.state_dir = "/tmp/x";
  EXPECT_TRUE(ValidateAndFinalize(&defaults).ok());
  EXPECT_DOUBLE_EQ(defaults.checkpoint_mtbf_prior_gpu_hours * 3600, kLlama3GpuMtbfSeconds);
}

TEST(ConfigTest, ResourceBoundsAreValidated) {
  CoordinatorConfig c;
  c.state_dir = "/tmp/x";
  ASSERT_TRUE(ApplyConfigYaml("log_buffer_bytes_per_job: 1000\nlost_worker_ttl_s: -1\n"
                              "event_history: 20000\n",
                              &c)
                  .ok());
  absl::Status s = ValidateAndFinalize(&c);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::string m(s.message());
  EXPECT_NE(m.find("log_buffer_bytes_per_job: 1000 is out of range"), std::string::npos) << m;
  EXPECT_NE(m.find("lost_worker_ttl_s: -1 is out of range"), std::string::npos) << m;
  EXPECT_NE(m.find("event_history: 20000 is out of range"), std::string::npos) << m;
  CoordinatorConfig d;
  d.state_dir = "/tmp/x";
  d.log_buffer_bytes_total = d.log_buffer_bytes_per_job - 1;
  absl::Status t = ValidateAndFinalize(&d);
  EXPECT_NE(std::string(t.message()).find("log_buffer_bytes_total: "), std::string::npos) << t;
  CoordinatorConfig ok;
  ok.state_dir = "/tmp/x";
  EXPECT_TRUE(ValidateAndFinalize(&ok).ok());
  EXPECT_EQ(ok.lost_worker_ttl_s, 3600);
}

}  // namespace
// every_steps: auto picks the Young/Daly interval sqrt(2 C M) for an injected cost C and
// failure data: C from the configured prior, then measured; M from the prior alone, then from
// observed failures, scaled by the group size; seconds until a step time is measured, then steps.
TEST(CheckpointIntervalTest, AutoPicksTheYoungDalyIntervalForInjectedCostAndMtbf) {
  IntervalInputs in;
  in.auto_interval = true;
  in.group_gpus = 8;
  in.prior_gpu_mtbf_s = 8.0e6;  // one failure per 8e6 GPU-seconds: 1e6 s for 8 GPUs
  // No cost measured and no prior: every step (the first checkpoint measures it).
  IntervalChoice c = ChooseCheckpointInterval(in);
  EXPECT_EQ(c.every_steps, 1);
  EXPECT_EQ(c.every_seconds, 0);
  EXPECT_EQ(c.cost_source, "none");
  EXPECT_EQ(c.mtbf_source, "prior");
  EXPECT_NE(c.reason.find("until a checkpoint's cost is measured"), std::string::npos) << c.reason;
  // The configured prior C = 8 s, M = 1e6 s (the prior): T = sqrt(2 x 8 x 1e6) = 4000 s, sent
  // in seconds (no step time yet).
  in.prior_cost_seconds = 8.0;
  c = ChooseCheckpointInterval(in);
  EXPECT_EQ(c.cost_source, "prior");
  EXPECT_DOUBLE_EQ(c.cost_seconds, 8.0);
  EXPECT_EQ(c.every_steps, 0);
  EXPECT_DOUBLE_EQ(c.interval_seconds, 4000.0);
  EXPECT_DOUBLE_EQ(c.every_seconds, 4000.0);
  // Measured C = 2 s replaces the prior: T = sqrt(2 x 2 x 1e6) = 2000 s.
  in.cost_seconds = 2.0;
  c = ChooseCheckpointInterval(in);
  EXPECT_EQ(c.cost_source, "measured");
  EXPECT_DOUBLE_EQ(c.mtbf_seconds, 1.0e6);
  EXPECT_DOUBLE_EQ(c.every_seconds, 2000.0);
  EXPECT_NE(c.reason.find("sqrt(2 x C 2.000 s (measured) x MTBF 1000000 s for 8 GPUs (prior"),
            std::string::npos)
      << c.reason;
  // A measured step time converts T to steps: 2000 s / 3 s = 666.7 -> 667 steps.
  in.step_seconds = 3.0;
  c = ChooseCheckpointInterval(in);
  EXPECT_EQ(c.every_steps, 667);
  EXPECT_EQ(c.every_seconds, 0);
  EXPECT_DOUBLE_EQ(c.step_seconds, 3.0);
  // A step longer than T: every step.
  in.step_seconds = 5000.0;
  EXPECT_EQ(ChooseCheckpointInterval(in).every_steps, 1);
  in.step_seconds.reset();
  // Observed: 3 failures in 2.4e7 GPU-seconds (with the prior: 4 in 3.2e7, one per 8e6 per GPU
  // stays) ... then 7 in 1.6e7 (with the prior: 8 in 2.4e7: one per 3e6 GPU-seconds, 3.75e5 s
  // for 8 GPUs): T = sqrt(2 x 2 x 3.75e5) = sqrt(1.5e6).
  in.observed_gpu_seconds = 2.4e7;
  in.observed_failures = 3;
  c = ChooseCheckpointInterval(in);
  EXPECT_EQ(c.mtbf_source, "measured");
  EXPECT_DOUBLE_EQ(c.every_seconds, 2000.0);
  in.observed_gpu_seconds = 1.6e7;
  in.observed_failures = 7;
  c = ChooseCheckpointInterval(in);
  EXPECT_DOUBLE_EQ(c.mtbf_seconds, 3.75e5);
  EXPECT_DOUBLE_EQ(c.every_seconds, std::sqrt(1.5e6));
  // GPU-seconds run without a failure raise M above the prior (source still "prior").
  in.observed_failures = 0;
  in.observed_gpu_seconds = 8.0e6;
  c = ChooseCheckpointInterval(in);
  EXPECT_EQ(c.mtbf_source, "prior");
  EXPECT_DOUBLE_EQ(c.mtbf_seconds, 2.0e6);
  in.observed_gpu_seconds = 1.6e7;
  in.observed_failures = 7;
  // Twice the GPUs, half the MTBF: the interval shrinks by sqrt(2).
  in.group_gpus = 16;
  EXPECT_DOUBLE_EQ(ChooseCheckpointInterval(in).every_seconds, std::sqrt(0.75e6));
  EXPECT_DOUBLE_EQ(YoungDalySeconds(2.0, 1.0e6), 2000.0);
  EXPECT_DOUBLE_EQ(YoungDalySeconds(0.0, 1.0e6), 0.0);
  // Out-of-range inputs stay within what a rank accepts: a measured 0 counts as 1 ms, a huge
  // cost is capped at ten years.
  in.cost_seconds = 0.0;
  EXPECT_DOUBLE_EQ(ChooseCheckpointInterval(in).cost_seconds, 1e-3);
  in.cost_seconds = 1e300;
  EXPECT_DOUBLE_EQ(ChooseCheckpointInterval(in).every_seconds, kMaxIntervalSeconds);
  // The spec's own interval passes through.
  IntervalInputs fixed;
  fixed.spec_every_steps = 20;
  c = ChooseCheckpointInterval(fixed);
  EXPECT_EQ(c.every_steps, 20);
  EXPECT_EQ(c.reason, "the job spec");
}

TEST(CheckpointIntervalTest, SmallMovesAreNotSent) {
  IntervalChoice sent;
  sent.every_seconds = 1000;
  IntervalChoice next = sent;
  next.every_seconds = 1240;
  EXPECT_FALSE(IntervalChanged(sent, next));
  next.every_seconds = 1300;
  EXPECT_TRUE(IntervalChanged(sent, next));
  IntervalChoice steps;
  steps.every_steps = 1;
  EXPECT_TRUE(IntervalChanged(steps, sent));  // measuring -> by time
  IntervalChoice more = steps;
  more.every_steps = 2;
  EXPECT_TRUE(IntervalChanged(steps, more));  // 1 -> 2 steps
  steps.every_steps = 600;
  more.every_steps = 740;
  EXPECT_FALSE(IntervalChanged(steps, more));  // within 25 %
  more.every_steps = 760;
  EXPECT_TRUE(IntervalChanged(steps, more));
}

namespace {

// Slots of worker `id` (label = id), tcp_only as given.
std::vector<IdleWorker> Slots(const std::string& id, int n, bool tcp_only) {
  std::vector<IdleWorker> out;
  for (int i = 0; i < n; ++i) out.push_back({id, id, i, tcp_only});
  return out;
}

std::vector<IdleWorker> Concat(std::vector<std::vector<IdleWorker>> parts) {
  std::vector<IdleWorker> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(SchedulerFabricTest, AGroupNeedingAFabricSpansNoTcpOnlyWorker) {
  const auto idle = Concat({Slots("a", 2, true), Slots("b", 2, true)});
  GangRequest gang{2, 2, "", /*fabric_required=*/true};
  Placement p = PlaceGang(gang, idle);
  EXPECT_FALSE(p.placed);
  EXPECT_EQ(p.reason,
            "needs 4 free slots on workers with a fabric between nodes (efa, tcpxo, ib) or on one "
            "worker or node label: 0 such slots free, at most 2 on one worker; a, b reach other "
            "nodes only over "
            "TCP sockets (set spec.parallelism.allow_tcp_fabric: true to run this group over TCP)");
  gang.fabric_required = false;  // allow_tcp_fabric
  EXPECT_TRUE(PlaceGang(gang, idle).placed);
}

TEST(SchedulerFabricTest, FabricWorkersOrOneWholeWorkerTakeTheGroup) {
  GangRequest gang{2, 2, "", true};
  // On workers with a fabric: placed across them, never on the tcp_only one.
  Placement p =
      PlaceGang(gang, Concat({Slots("t", 2, true), Slots("e1", 2, false), Slots("e2", 2, false)}));
  ASSERT_TRUE(p.placed) << p.reason;
  EXPECT_EQ(std::set<std::string>(p.worker_ids.begin(), p.worker_ids.end()),
            (std::set<std::string>{"e1", "e2"}));
  // One tcp_only worker that holds the whole gang: no network in it.
  Placement q = PlaceGang(gang, Concat({Slots("t1", 2, true), Slots("t2", 4, true)}));
  ASSERT_TRUE(q.placed) << q.reason;
  EXPECT_EQ(std::set<std::string>(q.worker_ids.begin(), q.worker_ids.end()),
            (std::set<std::string>{"t2"}));
  // Two agents of one node (the same label) hold it together: no network between them.
  std::vector<IdleWorker> one_node = Concat({Slots("h0", 2, true), Slots("h1", 2, true)});
  for (IdleWorker& w : one_node) w.node_label = "host";
  Placement n = PlaceGang(gang, Concat({Slots("x", 2, true), one_node}));
  ASSERT_TRUE(n.placed) << n.reason;
  EXPECT_EQ(std::set<std::string>(n.worker_ids.begin(), n.worker_ids.end()),
            (std::set<std::string>{"h0", "h1"}));
  // Without tcp_only workers nothing changes: the usual per-group best fit.
  Placement r = PlaceGang(gang, Concat({Slots("e1", 2, false), Slots("e2", 4, false)}));
  ASSERT_TRUE(r.placed);
  EXPECT_EQ(r.worker_ids, (std::vector<std::string>{"e1", "e1", "e2", "e2"}));
}

TEST(SchedulerFabricTest, AJobThatCanNeverGetAFabricBlocksNoOne) {
  const auto idle = Concat({Slots("a", 2, true), Slots("b", 2, true)});
  std::vector<QueuedJob> queue;
  queue.push_back({"big", 0, 1, 0, GangRequest{2, 2, "", true}});
  queue.push_back({"small", 0, 2, 0, GangRequest{2, 1, "", true}});
  std::vector<QueueDecision> d = PlanQueue(queue, idle, idle);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].kind, QueueDecision::Kind::kUnplaced);
  EXPECT_NE(d[0].reason.find("allow_tcp_fabric"), std::string::npos) << d[0].reason;
  EXPECT_EQ(d[1].kind, QueueDecision::Kind::kLaunch) << d[1].reason;
  EXPECT_FALSE(d[1].backfill);  // "big" is no head: it could never be placed here.
  // A fabric worker joining makes "big" placeable some day (then it is the head).
  LiveSlots live = LiveSlots::Of(Concat({idle, Slots("e", 4, false)}));
  EXPECT_EQ(live.EligibleFor(GangRequest{2, 2, "", true}), 4);  // e's 4 (a label too)
  EXPECT_EQ(live.EligibleFor(GangRequest{2, 2, "", false}), 8);
  EXPECT_EQ(LiveSlots::Of(idle).EligibleFor(GangRequest{2, 2, "", true}), 2);
}

}  // namespace

namespace {

// Submission's placeability check: the first stage from the current one that the registered
// cluster can never hold, named 1-based with what it needs, what there is and the fix.
TEST(UnschedulableStageTest, TheFirstStageLargerThanTheClusterIsNamedWithTheFix) {
  LiveSlots live;
  live.Add("", 2);
  live.Add("a100", 1);
  const std::vector<GangRequest> stages = {{1, 1}, {2, 1}, {2, 2}, {4, 2}};
  std::optional<UnschedulableStage> u = FirstUnschedulableStage(stages, 0, live);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->stage, 2);
  EXPECT_EQ(u->needed, 4);
  EXPECT_EQ(u->available, 3);
  EXPECT_EQ(u->message,
            "stage 3 of 4 needs 4 slots (sp 2 x dp 2); the registered workers have 3 slots in all "
            "for a group of 4 (start workers with a larger --capacity, add workers, or lower the "
            "stage's sp_degree x dp_degree)");
  // Stages already done do not count; from the last one it is still too large.
  u = FirstUnschedulableStage(stages, 3, live);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->stage, 3);
  // A required node label counts only its own slots.
  u = FirstUnschedulableStage({{2, 1, "a100"}}, 0, live);
  ASSERT_TRUE(u.has_value());
  EXPECT_NE(u->message.find("1 slot in all with node label \"a100\" for a group of 2"),
            std::string::npos)
      << u->message;
  // Grown by one worker of 5 slots: every stage fits.
  live.Add("", 5);
  EXPECT_FALSE(FirstUnschedulableStage(stages, 0, live).has_value());
  EXPECT_EQ(StageName(1, 3), "stage 2 of 3");
}

TEST(PoolDemandTest, OrdinalsOfStatefulSetNames) {
  EXPECT_EQ(PoolOrdinal("ulysses-worker-0"), 0);
  EXPECT_EQ(PoolOrdinal("ulysses-worker-17"), 17);
  EXPECT_EQ(PoolOrdinal("node3-gpu5"), -1);
  EXPECT_EQ(PoolOrdinal("worker"), -1);
  EXPECT_EQ(PoolOrdinal("worker-"), -1);
}

TEST(PoolDemandTest, QueuedGangsRaiseItAndRunningOnesKeepIt) {
  std::vector<PoolWorker> idle = {{"ulysses-worker-0", false}, {"ulysses-worker-1", false}};
  EXPECT_EQ(WantedWorkers(idle, {}, 8), 0);
  // A 16-rank gang and an 8-rank one queue: 2 + 1 nodes of 8 GPUs.
  EXPECT_EQ(WantedWorkers(idle, {16, 8}, 8), 3);
  EXPECT_EQ(WantedWorkers(idle, {9}, 8), 2);  // Rounded up to whole nodes.
  // The 8-rank gang runs on worker 0: it is busy, not queued.
  std::vector<PoolWorker> one_busy = {{"ulysses-worker-0", true}, {"ulysses-worker-1", false}};
  EXPECT_EQ(WantedWorkers(one_busy, {16}, 8), 3);
  EXPECT_EQ(WantedWorkers(one_busy, {}, 8), 1);  // It ended: down to what runs.
}

TEST(PoolDemandTest, ScaleInRemovesOnlyIdleWorkers) {
  // Worker 5 runs ranks, 0..4 are idle: one busy worker, but a StatefulSet scaled to fewer
  // than 6 would remove ulysses-worker-5 first. Wanted stays 6: only idle pods above it go.
  std::vector<std::string> names;
  for (int i = 0; i < 8; ++i) names.push_back(absl::StrCat("ulysses-worker-", i));
  std::vector<PoolWorker> pool;
  for (int i = 0; i < 8; ++i) pool.push_back({names[i], i == 5});
  EXPECT_EQ(WantedWorkers(pool, {}, 8), 6);
  // Every removed ordinal (>= wanted) is idle.
  const int64_t wanted = WantedWorkers(pool, {}, 8);
  for (const PoolWorker& w : pool) {
    if (PoolOrdinal(w.name) >= wanted) EXPECT_FALSE(w.busy) << w.name;
  }
  // Names without an ordinal (workers outside a StatefulSet) count only as busy.
  EXPECT_EQ(WantedWorkers({{"node3", true}}, {}, 8), 1);
}

}  // namespace

}  // namespace ulysses::coordinator
