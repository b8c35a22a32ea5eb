#include "worker/agent/slot_table.h"

#include <algorithm>

#include "worker/agent/agent_messages.h"

namespace ulysses::agent {
namespace {

namespace v1 = ::ulysses::v1;

bool SameRank(const v1::WorkRef& a, const v1::WorkRef& b) {
  return SameWork(a, b) && a.rank() == b.rank();
}

}  // namespace

void SlotTable::Open(const std::vector<std::string>& devices) {
  slots_.clear();
  for (const std::string& device : devices) slots_.push_back(Slot{device});
}

std::vector<Slot> SlotTable::TakeAll() {
  std::vector<Slot> slots;
  slots.swap(slots_);
  return slots;
}

int64_t SlotTable::Busy() const {
  return std::count_if(slots_.begin(), slots_.end(),
                       [](const Slot& s) { return s.ref.has_value(); });
}

bool SlotTable::Runs(const v1::WorkRef& ref) const {
  return std::any_of(slots_.begin(), slots_.end(),
                     [&](const Slot& s) { return s.ref && SameRank(*s.ref, ref); });
}

std::vector<Slot*> SlotTable::Running(const v1::WorkRef* work) {
  std::vector<Slot*> out;
  for (Slot& slot : slots_) {
    if (!slot.ref || slot.child == nullptr) continue;
    if (work != nullptr && !SameWork(*slot.ref, *work)) continue;
    out.push_back(&slot);
  }
  return out;
}

Slot& SlotTable::Publish(int slot, const v1::WorkRef& ref, int64_t pid,
                         std::unique_ptr<ChildSupervisor> child) {
  Slot& s = at(slot);
  s.child = std::move(child);
  s.ref = ref;
  s.pid = pid;
  return s;
}

void SlotTable::Finish(int slot, const v1::WorkRef& ref) {
  if (!Valid(slot)) return;
  Slot& s = at(slot);
  if (s.ref && SameRank(*s.ref, ref)) {
    s.ref.reset();
    s.pid = 0;
  }
}

void SlotTable::ExitReported(const v1::WorkRef& ref, int slot) {
  if (Valid(slot)) unacked_exits_.emplace_back(ref, slot);
}

void SlotTable::ExitAcked(const v1::WorkRef& ref) {
  unacked_exits_.erase(std::remove_if(unacked_exits_.begin(), unacked_exits_.end(),
                                      [&](const auto& e) { return SameRank(e.first, ref); }),
                       unacked_exits_.end());
}

std::vector<v1::RunningWork> SlotTable::RunningRanks() const {
  std::vector<v1::RunningWork> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].ref) continue;
    v1::RunningWork r;
    *r.mutable_ref() = *slots_[i].ref;
    r.set_pid(slots_[i].pid);
    r.set_slot(static_cast<int>(i));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<v1::RunningWork> SlotTable::ClaimedRanks() const {
  std::vector<v1::RunningWork> out = RunningRanks();
  for (const auto& [ref, exit_slot] : unacked_exits_) {
    const int slot = exit_slot;  // A lambda cannot capture a structured binding in C++17.
    const bool running = std::any_of(out.begin(), out.end(),
                                     [&](const v1::RunningWork& r) { return r.slot() == slot; });
    if (running) continue;  // The slot runs a newer rank already.
    v1::RunningWork r;
    *r.mutable_ref() = ref;
    r.set_slot(slot);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace ulysses::agent
