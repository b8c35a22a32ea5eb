// Must NOT compile: the ctest `build_thread_safety_enforced` builds this unit with the
// project's normal flags and passes only when Clang refuses it for touching a guarded field
// without its mutex. If this ever compiles, -Wthread-safety -Werror=thread-safety has left
// the build flags (CMakeLists.txt) and a missing lock anywhere would go unnoticed.
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ulysses {
namespace {

class Counter {
 public:
  void Locked() {
    absl::MutexLock lock(&mu_);
    ++value_;
  }
  void Unlocked() { ++value_; }  // The violation: value_ is ABSL_GUARDED_BY(mu_).

 private:
  absl::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

void ThreadSafetyViolation() {
  Counter c;
  c.Locked();
  c.Unlocked();
}

}  // namespace ulysses
