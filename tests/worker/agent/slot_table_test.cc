// The agent's slot bookkeeping (worker/agent/slot_table.h) without processes: which rank each
// slot runs, what the agent reports as running to Register and heartbeats, and the exits it
// still claims until the coordinator acks them.
#include "worker/agent/slot_table.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ulysses::agent {
namespace {

namespace v1 = ::ulysses::v1;

v1::WorkRef Ref(const std::string& job, int64_t generation, int64_t rank) {
  v1::WorkRef ref;
  ref.set_job_id(job);
  ref.set_generation(generation);
  ref.set_stage(0);
  ref.set_rank(rank);
  return ref;
}

// (job, rank, slot, pid) of each entry, for readable comparisons.
struct Seen {
  std::string job;
  int64_t rank;
  int slot;
  int64_t pid;
  bool operator==(const Seen& o) const {
    return job == o.job && rank == o.rank && slot == o.slot && pid == o.pid;
  }
};
std::ostream& operator<<(std::ostream& os, const Seen& s) {
  return os << s.job << " r" << s.rank << " slot " << s.slot << " pid " << s.pid;
}
std::vector<Seen> Of(const std::vector<v1::RunningWork>& ranks) {
  std::vector<Seen> out;
  for (const v1::RunningWork& r : ranks) {
    out.push_back({r.ref().job_id(), r.ref().rank(), r.slot(), r.pid()});
  }
  return out;
}

class SlotTableTest : public ::testing::Test {
 protected:
  SlotTableTest() { table_.Open({"cuda:0", "cuda:1", "cuda:2"}); }
  SlotTable table_;
};

TEST_F(SlotTableTest, OpensOneFreeSlotPerDeviceInOrder) {
  EXPECT_EQ(table_.size(), 3);
  EXPECT_EQ(table_.at(1).device, "cuda:1");
  EXPECT_EQ(table_.Busy(), 0);
  EXPECT_FALSE(table_.AnyRunning());
  EXPECT_TRUE(table_.Valid(2));
  EXPECT_FALSE(table_.Valid(3));
  EXPECT_FALSE(table_.Valid(-1));
  EXPECT_TRUE(table_.RunningRanks().empty());
  EXPECT_TRUE(table_.ClaimedRanks().empty());
}

TEST_F(SlotTableTest, PublishedRanksAreRunningUntilTheirOwnExit) {
  table_.Publish(0, Ref("a", 1, 0), 100, nullptr);
  table_.Publish(2, Ref("a", 1, 1), 102, nullptr);
  EXPECT_EQ(table_.Busy(), 2);
  EXPECT_TRUE(table_.Runs(Ref("a", 1, 1)));
  EXPECT_FALSE(table_.Runs(Ref("a", 2, 1)));  // Another generation.
  EXPECT_FALSE(table_.Runs(Ref("a", 1, 2)));  // Another rank.
  EXPECT_EQ(Of(table_.RunningRanks()), (std::vector<Seen>{{"a", 0, 0, 100}, {"a", 1, 2, 102}}));
  // An exit of a rank the slot no longer runs leaves it alone; its own exit frees it.
  table_.Finish(2, Ref("a", 0, 1));
  EXPECT_EQ(table_.Busy(), 2);
  table_.Finish(2, Ref("a", 1, 1));
  EXPECT_EQ(table_.Busy(), 1);
  EXPECT_FALSE(table_.at(2).ref.has_value());
  EXPECT_EQ(table_.at(2).pid, 0);
  table_.Finish(7, Ref("a", 1, 0));  // Out of range (table taken): ignored.
  EXPECT_EQ(table_.Busy(), 1);
}

TEST_F(SlotTableTest, AnExitStaysClaimedForRegisterUntilAcked) {
  table_.Publish(1, Ref("a", 1, 0), 100, nullptr);
  table_.Finish(1, Ref("a", 1, 0));
  table_.ExitReported(Ref("a", 1, 0), 1);
  table_.ExitReported(Ref("b", 1, 0), 9);  // No such slot: not claimed.
  // Heartbeats list what runs; Register also what ended unacked (no pid).
  EXPECT_TRUE(table_.RunningRanks().empty());
  EXPECT_EQ(Of(table_.ClaimedRanks()), (std::vector<Seen>{{"a", 0, 1, 0}}));
  table_.ExitAcked(Ref("a", 2, 0));  // Another generation's ack.
  EXPECT_EQ(table_.ClaimedRanks().size(), 1u);
  table_.ExitAcked(Ref("a", 1, 0));
  EXPECT_TRUE(table_.ClaimedRanks().empty());
}

TEST_F(SlotTableTest, AnUnackedExitGivesWayToTheNewerRankOnItsSlot) {
  table_.ExitReported(Ref("a", 1, 0), 0);
  table_.ExitReported(Ref("c", 1, 0), 2);
  table_.Publish(0, Ref("b", 1, 0), 200, nullptr);
  EXPECT_EQ(Of(table_.ClaimedRanks()), (std::vector<Seen>{{"b", 0, 0, 200}, {"c", 0, 2, 0}}));
}

TEST_F(SlotTableTest, TakeAllEmptiesTheTable) {
  table_.Publish(0, Ref("a", 1, 0), 100, nullptr);
  std::vector<Slot> slots = table_.TakeAll();
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0].pid, 100);
  EXPECT_TRUE(table_.empty());
  EXPECT_FALSE(table_.AnyRunning());
  // A child object is needed to be stopped: the slots that hold none are not listed.
  EXPECT_TRUE(table_.Running().empty());
}

}  // namespace
}  // namespace ulysses::agent
