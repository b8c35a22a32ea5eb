// The worker agent's slots: one per device, the rank (attempt) each one runs, its child
// process, and the exit reports the coordinator has not acked yet. It answers what the agent
// reports as running (Register, heartbeats) and the metrics' busy/free counts. Pure
// bookkeeping: it starts and stops no process itself.
//
// Thread-compatible: the agent guards it with its one lock (CoordinatorSession::mu()).
#ifndef ULYSSES_WORKER_AGENT_SLOT_TABLE_H_
#define ULYSSES_WORKER_AGENT_SLOT_TABLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ulysses/v1/worker_service.pb.h"
#include "worker/agent/child_supervisor.h"

namespace ulysses::agent {

// One device of the worker. A finished child is kept until the slot's next assignment or
// shutdown (destroying it joins its supervisor thread).
struct Slot {
  std::string device;
  std::optional<::ulysses::v1::WorkRef> ref;  // Its rank while the child runs.
  int64_t pid = 0;
  std::unique_ptr<ChildSupervisor> child;
};

class SlotTable {
 public:
  // One free slot per device, in order (slot i is devices[i]); any previous slot is dropped.
  void Open(const std::vector<std::string>& devices);
  // Every slot, the table left empty (shutdown: the caller destroys them outside the lock).
  std::vector<Slot> TakeAll();

  int size() const { return static_cast<int>(slots_.size()); }
  bool empty() const { return slots_.empty(); }
  bool Valid(int slot) const { return slot >= 0 && slot < size(); }
  Slot& at(int slot) { return slots_.at(static_cast<size_t>(slot)); }
  const Slot& at(int slot) const { return slots_.at(static_cast<size_t>(slot)); }

  // Slots that run a rank.
  int64_t Busy() const;
  bool AnyRunning() const { return Busy() > 0; }
  // Some slot runs this rank (same job, generation, stage and rank).
  bool Runs(const ::ulysses::v1::WorkRef& ref) const;
  // The slots that run a rank with a live child object, in slot order; only those of `work`'s
  // job, generation and stage when given.
  std::vector<Slot*> Running(const ::ulysses::v1::WorkRef* work = nullptr);

  // `child` (pid `pid`) now runs `ref` on `slot` (Valid).
  Slot& Publish(int slot, const ::ulysses::v1::WorkRef& ref, int64_t pid,
                std::unique_ptr<ChildSupervisor> child);
  // `ref`'s child on `slot` exited: the slot is free unless it runs a newer rank already.
  // Kept child object and all. No-op for a slot out of range (the table was taken).
  void Finish(int slot, const ::ulysses::v1::WorkRef& ref);

  // An exit report of `ref` on `slot` is queued: the rank stays claimed until it is acked, or
  // the coordinator would count it as vanished. Ignored for a slot out of range.
  void ExitReported(const ::ulysses::v1::WorkRef& ref, int slot);
  // The coordinator acked `ref`'s exit report.
  void ExitAcked(const ::ulysses::v1::WorkRef& ref);

  // The running ranks (ref, pid, slot), for heartbeats.
  std::vector<::ulysses::v1::RunningWork> RunningRanks() const;
  // The running ranks and then the unacked exits of slots that run nothing newer (no pid),
  // for Register.
  std::vector<::ulysses::v1::RunningWork> ClaimedRanks() const;

 private:
  std::vector<Slot> slots_;
  std::vector<std::pair<::ulysses::v1::WorkRef, int>> unacked_exits_;
};

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_SLOT_TABLE_H_
