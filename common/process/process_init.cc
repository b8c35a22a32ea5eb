#include "common/process/process_init.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "absl/debugging/symbolize.h"
#include "absl/synchronization/mutex.h"

namespace ulysses {
namespace {

constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP};

// Only async-signal-safe calls below (write, backtrace once warmed up, absl::Symbolize).
void WriteAll(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void WriteStr(const char* s) { WriteAll(s, std::strlen(s)); }

std::atomic<bool> g_crashing{false};

void OnCrash(int signo, siginfo_t* /*info*/, void* /*context*/) {
  // The first crashing thread reports; another one waits for the process to die.
  if (g_crashing.exchange(true)) {
    while (true) pause();
  }
  char line[1024];
  int n = std::snprintf(line, sizeof(line), "*** SIG%s received by pid %d, thread %ld ***\n",
                        sigabbrev_np(signo) != nullptr ? sigabbrev_np(signo) : "?",
                        static_cast<int>(getpid()), static_cast<long>(syscall(SYS_gettid)));
  WriteAll(line, static_cast<size_t>(n));
  // glibc's unwinder reads .eh_frame, so frames of code built without frame pointers
  // (ours, libtorch, gRPC) unwind too.
  void* pcs[64];
  const int depth = backtrace(pcs, 64);
  for (int i = 0; i < depth; ++i) {
    char name[512];
    // A return address points after its call: look up the byte before it.
    const void* lookup = static_cast<const char*>(pcs[i]) - (i > 0 ? 1 : 0);
    if (!absl::Symbolize(lookup, name, sizeof(name))) std::strcpy(name, "(unknown)");
    n = std::snprintf(line, sizeof(line), "    @ %p  %s\n", pcs[i], name);
    WriteAll(line, static_cast<size_t>(n));
  }
  WriteStr("*** end of stack; dying of the same signal ***\n");
  // SA_RESETHAND restored the default action: re-raise so the exit status, a core dump and
  // a parent's reading of the signal stay what they would have been.
  raise(signo);
}

}  // namespace

void InitProcess(const char* argv0, DeadlockReports reports) {
  absl::SetMutexDeadlockDetectionMode(reports == DeadlockReports::kReport
                                          ? absl::OnDeadlockCycle::kReport
                                          : absl::OnDeadlockCycle::kIgnore);
  absl::InitializeSymbolizer(argv0);
  // backtrace() loads libgcc_s on its first call, which is not safe in a signal handler.
  void* warm[1];
  backtrace(warm, 1);
  // An alternate stack so a stack overflow on this (the main) thread is reported too.
  static char alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  sigaltstack(&ss, nullptr);
  struct sigaction action {};
  action.sa_sigaction = &OnCrash;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  for (int signo : kCrashSignals) sigaction(signo, &action, nullptr);
}

}  // namespace ulysses
