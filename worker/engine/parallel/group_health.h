// Whether a communicator's group can still run collectives. Every backend (Gloo, NCCL)
// keeps one GroupHealth and checks it before each collective, so they refuse work
// after an abort or a failure the same way (communicator.h "Errors").
//
// Thread-safety: Abort() and aborted() may be called from any thread; the rest from the
// thread that issues the group's collectives.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_GROUP_HEALTH_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_GROUP_HEALTH_H_

#include <atomic>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ulysses::engine::internal {

class GroupHealth {
 public:
  // backend: "gloo" or "nccl"; group: the group's name (both appear in every error).
  GroupHealth(std::string backend, std::string group)
      : backend_(std::move(backend)), group_(std::move(group)) {}
  GroupHealth(const GroupHealth&) = delete;
  GroupHealth& operator=(const GroupHealth&) = delete;

  void Abort() { aborted_ = true; }
  void MarkBroken() { broken_ = true; }
  bool aborted() const { return aborted_; }
  bool broken() const { return broken_; }

  // OK; ABORTED after Abort(); FAILED_PRECONDITION after a failed collective (recreate
  // the group).
  absl::Status CheckUsable(absl::string_view op) const;

  // ABORTED "<backend> <op> on group '<group>': aborted".
  absl::Status AbortedError(absl::string_view op) const;

 private:
  std::string backend_;
  std::string group_;
  std::atomic<bool> aborted_{false};
  bool broken_ = false;
};

}  // namespace ulysses::engine::internal

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_GROUP_HEALTH_H_
