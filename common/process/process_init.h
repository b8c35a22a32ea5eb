// InitProcess: the process-wide settings every Ulysses main applies first (the daemons,
// ulyssesctl, ulysses-train, the coordinator load bench and the test binaries).
//
// - A crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP) prints the signal and the
//   symbolized stack of the thread that got it to stderr, then dies of the same signal
//   (so an exit status and a core dump read as before). Other signals keep their
//   disposition: the daemons and the engine install their own SIGTERM handlers.
// - Abseil's Mutex deadlock detector. Debian builds Abseil without NDEBUG, so the
//   detector is on and aborts the process at the first cycle it sees in the lock order,
//   over every absl::Mutex the process ever held together. gRPC's own mutexes are
//   absl::Mutex (GPR_ABSEIL_SYNC), and gRPC's internal locking is known to close such
//   cycles on its connect and shutdown paths where nothing deadlocks (grpc/grpc#39461,
//   #40390): SIGABRT in a healthy process. Products turn the detector off (it also costs
//   the coordinator about 2 % CPU, docs/BENCHMARKS.md); test binaries keep it reporting,
//   so a cycle is printed with its stacks, and a real deadlock still fails the test (its
//   ctest TIMEOUT). Our own lock order is checked at compile time
//   (scripts/thread_safety.sh).
#ifndef ULYSSES_COMMON_PROCESS_PROCESS_INIT_H_
#define ULYSSES_COMMON_PROCESS_PROCESS_INIT_H_

namespace ulysses {

enum class DeadlockReports {
  kOff,     // Products.
  kReport,  // Test binaries: print each lock-order cycle, never abort.
};

// Call once, first thing in main(), before any thread starts. `argv0` finds the
// binary's symbols for the stack traces.
void InitProcess(const char* argv0, DeadlockReports reports = DeadlockReports::kOff);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_PROCESS_PROCESS_INIT_H_
