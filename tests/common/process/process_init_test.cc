// InitProcess (common/process/process_init.h). This binary's main already ran it in the
// test mode (tests/testing/gtest_main.cc); the death tests' children inherit that.
#include "common/process/process_init.h"

#include <csignal>
#include <string>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace ulysses {
namespace {

// Locks two mutexes in one order, then in the other: a cycle in the lock order.
void LockInBothOrders() {
  absl::Mutex a, b;
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  {
    absl::MutexLock lb(&b);
    absl::MutexLock la(&a);
  }
}

std::string StderrOf(void (*fn)()) {
  ::testing::internal::CaptureStderr();
  fn();
  return ::testing::internal::GetCapturedStderr();
}

[[gnu::noinline]] void CrashInANamedFunction() {
  std::raise(SIGSEGV);
  std::abort();  // Not reached: the handler re-raises SIGSEGV with its default action.
}

TEST(ProcessInitTest, ACrashPrintsItsSignalAndASymbolizedStackAndDiesOfTheSameSignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(CrashInANamedFunction(), ::testing::KilledBySignal(SIGSEGV),
              "SIGSEGV received by pid [0-9]+, thread [0-9]+.*"
              "CrashInANamedFunction.*dying of the same signal");
}

TEST(ProcessInitTest, SigtermKeepsTheDispositionItHadBefore) {
  struct sigaction before {};
  struct sigaction mine {};
  mine.sa_handler = +[](int) {};
  ASSERT_EQ(sigaction(SIGTERM, &mine, &before), 0);
  InitProcess("process_test", DeadlockReports::kReport);
  struct sigaction after {};
  ASSERT_EQ(sigaction(SIGTERM, &before, &after), 0);
  EXPECT_EQ(after.sa_handler, mine.sa_handler);
  // The crash signals did get a handler (not the default action).
  struct sigaction segv {};
  ASSERT_EQ(sigaction(SIGSEGV, nullptr, &segv), 0);
  EXPECT_NE(segv.sa_handler, SIG_DFL);
}

TEST(ProcessInitTest, InTestsALockOrderCycleIsReportedAndTheProcessGoesOn) {
  InitProcess("process_test", DeadlockReports::kReport);
  const std::string err = StderrOf(&LockInBothOrders);
  EXPECT_NE(err.find("Potential Mutex deadlock"), std::string::npos) << err;
}

TEST(ProcessInitTest, ProductsNeitherReportNorAbortOnALockOrderCycle) {
  InitProcess("process_test", DeadlockReports::kOff);
  const std::string err = StderrOf(&LockInBothOrders);
  InitProcess("process_test", DeadlockReports::kReport);  // The mode of this binary's main.
  EXPECT_EQ(err.find("Potential Mutex deadlock"), std::string::npos) << err;
}

}  // namespace
}  // namespace ulysses
