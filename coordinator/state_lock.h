// StateDirLock: one process at a time owns a state directory. The coordinator holds it for its
// whole life (<state_dir>/coordinator.lock, an flock), so a second coordinator on the same
// directory and a `ulyssesctl admin restore` into it (which would move the store aside while
// the coordinator keeps writing to the moved file) are refused with who holds it. The kernel
// drops an flock when its process dies, so a coordinator killed with -9 leaves no stale lock.
#ifndef ULYSSES_COORDINATOR_STATE_LOCK_H_
#define ULYSSES_COORDINATOR_STATE_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ulysses::coordinator {

inline constexpr char kStateLockFile[] = "coordinator.lock";

class StateDirLock {
 public:
  // Takes the lock of `state_dir` (which must exist) for `who` (e.g. "ulysses-coordinator"),
  // writing "<who> pid <pid>" into the file. FailedPrecondition naming the holder when
  // another process has it.
  static absl::StatusOr<std::unique_ptr<StateDirLock>> Acquire(const std::string& state_dir,
                                                               const std::string& who);
  ~StateDirLock();
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;

 private:
  explicit StateDirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_STATE_LOCK_H_
