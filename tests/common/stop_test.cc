#include "common/stop.h"

#include <gtest/gtest.h>

#include <csignal>
#include <thread>

namespace ulysses {
namespace {

TEST(StopTest, SigtermSetsFlagAndWakesWaiter) {
  ResetStopForTesting();
  ASSERT_TRUE(InstallStopSignalHandlers());
  EXPECT_FALSE(StopRequested());
  EXPECT_FALSE(WaitForStop(std::chrono::milliseconds(1)));
  std::thread waiter([] { WaitForStop(); });
  ASSERT_EQ(raise(SIGTERM), 0);
  waiter.join();  // Returns only if the signal woke it.
  EXPECT_TRUE(StopRequested());
  EXPECT_EQ(StopSignal(), SIGTERM);
}

TEST(StopTest, RequestStopFromCode) {
  ResetStopForTesting();
  EXPECT_FALSE(StopRequested());
  RequestStop();
  EXPECT_TRUE(WaitForStop(std::chrono::milliseconds(0)));
  EXPECT_EQ(StopSignal(), 0);
}

}  // namespace
}  // namespace ulysses
