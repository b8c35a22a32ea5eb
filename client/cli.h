// ulyssesctl: the command-line client. RunCli parses argv, runs one verb and
// returns the process exit code; main.cc is a thin wrapper so tests and other
// tools can run the CLI in-process.
//
// Exit codes (common/contract/exit.h): 0 success; 2 bad input: a usage error (unknown
// verb or flag, missing argument), an invalid or unreadable spec, or a request the
// coordinator refused as invalid (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ...);
// 1 any other failure: an unreachable coordinator, a server error, or a watched job that
// ended FAILED/CANCELLED.
#ifndef ULYSSES_CLIENT_CLI_H_
#define ULYSSES_CLIENT_CLI_H_

#include <ostream>
#include <string>

#include "common/contract/exit.h"

namespace ulysses::client {

// Global options and the streams every verb writes to.
struct CliContext {
  std::string coordinator;  // --coordinator: host:port, overrides the context's server.
  std::string config;       // --config: the client config file (client/config.h).
  std::string context;      // --context: the config context to use.
  std::string output;       // "table" | "json" | "yaml" | "" (the verb's default).
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  int exit_code = contract::kExitOk;  // Set by the verb that ran.
};

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_CLI_H_
