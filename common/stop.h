// Process-wide stop handling for daemons and training processes.
//
// InstallStopSignalHandlers() routes SIGTERM and SIGINT into a flag that any
// thread can poll (StopRequested()) or wait on (WaitForStop()). The handler
// only writes to a self-pipe, so it is async-signal-safe; a helper thread turns
// the pipe byte into the flag and wakes waiters. A second SIGINT exits at once
// (the hard-kill tier for an operator at a terminal).
#ifndef ULYSSES_COMMON_STOP_H_
#define ULYSSES_COMMON_STOP_H_

#include <chrono>

namespace ulysses {

// Idempotent. Returns false if the handlers could not be installed.
bool InstallStopSignalHandlers();

// True once SIGTERM/SIGINT arrived or RequestStop() was called.
bool StopRequested();

// The signal that requested the stop (SIGTERM, SIGINT), or 0 for RequestStop()/none.
int StopSignal();

// Requests a stop from code (tests, fatal conditions). Thread-safe.
void RequestStop();

// Blocks until a stop is requested or `timeout` passes. Returns StopRequested().
bool WaitForStop(std::chrono::milliseconds timeout);
// Blocks until a stop is requested.
void WaitForStop();

// Clears the flag (tests only).
void ResetStopForTesting();

}  // namespace ulysses

#endif  // ULYSSES_COMMON_STOP_H_
