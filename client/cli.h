// ulyssesctl: the command-line client. RunCli parses argv, runs one verb and
// returns the process exit code; main.cc is a thin wrapper so tests and other
// tools can run the CLI in-process.
//
// Exit codes: 0 success; 1 bad input (invalid spec, unreadable file, usage error), a
// server error, an unreachable coordinator, or a watched job that ended FAILED/CANCELLED.
#ifndef ULYSSES_CLIENT_CLI_H_
#define ULYSSES_CLIENT_CLI_H_

#include <ostream>
#include <string>

namespace ulysses::client {

inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 1;

// Global options and the streams every verb writes to.
struct CliContext {
  std::string coordinator;  // host:port of ulysses-coordinator.
  std::string output;       // "table" | "json" | "yaml" | "" (the verb's default).
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  int exit_code = kExitOk;  // Set by the verb that ran.
};

// Default coordinator address: $ULYSSES_COORDINATOR, else 127.0.0.1:50051.
std::string DefaultCoordinator();

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_CLI_H_
