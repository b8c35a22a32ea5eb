#include "common/stop.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ulysses {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<int> g_sigint_count{0};
int g_pipe[2] = {-1, -1};
// Waiters block on g_mu until g_stop is set; Wake() makes absl::Mutex re-evaluate their
// condition (a signal handler cannot take the lock: the pipe thread does it for them).
absl::Mutex g_mu(absl::kConstInit);
bool StopLoaded(void*) { return g_stop.load(); }

void Wake() { absl::MutexLock lock(&g_mu); }

void OnSignal(int sig) {
  if (sig == SIGINT && g_sigint_count.fetch_add(1) >= 1) _exit(130);
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  g_stop.store(true);
  unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = write(g_pipe[1], &byte, 1);
  (void)ignored;
}

}  // namespace

bool InstallStopSignalHandlers() {
  static bool installed = [] {
    if (pipe(g_pipe) != 0) return false;
    std::thread([] {
      unsigned char byte;
      while (read(g_pipe[0], &byte, 1) == 1) Wake();
    }).detach();
    struct sigaction action {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    return sigaction(SIGTERM, &action, nullptr) == 0 && sigaction(SIGINT, &action, nullptr) == 0;
  }();
  return installed;
}

bool StopRequested() { return g_stop.load(); }

int StopSignal() { return g_signal.load(); }

void RequestStop() {
  g_stop.store(true);
  Wake();
}

bool WaitForStop(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&g_mu);
  g_mu.AwaitWithTimeout(absl::Condition(&StopLoaded, nullptr), absl::FromChrono(timeout));
  return g_stop.load();
}

void WaitForStop() {
  absl::MutexLock lock(&g_mu);
  g_mu.Await(absl::Condition(&StopLoaded, nullptr));
}

void ResetStopForTesting() {
  g_stop.store(false);
  g_signal.store(0);
  g_sigint_count.store(0);
}

}  // namespace ulysses
