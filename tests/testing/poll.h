// Waiting in tests for something another thread or process makes true: a bounded poll.
#ifndef ULYSSES_TESTS_TESTING_POLL_H_
#define ULYSSES_TESTS_TESTING_POLL_H_

#include <chrono>
#include <thread>

namespace ulysses::testing {

// Polls `pred` every `interval` until it holds or `timeout` passes; returns the last result
// (pred is asked once more at the deadline).
template <typename Pred>
bool PollUntil(Pred&& pred, std::chrono::milliseconds timeout = std::chrono::seconds(15),
               std::chrono::milliseconds interval = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(interval);
  }
  return pred();
}

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_POLL_H_
