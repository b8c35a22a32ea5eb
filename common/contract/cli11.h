// CLI11 command lines under the exit contract: a parse error (unknown flag, missing
// required flag, bad value) exits kExitBadInput (2), not one of CLI11's own codes
// (100+); --help exits kExitOk. Use instead of CLI11_PARSE:
//
//   if (std::optional<int> exit_code = contract::ParseCommandLine(app, argc, argv)) {
//     return *exit_code;
//   }
//
// Header-only; link the ulysses_contract_cli11 target (it brings CLI11).
#ifndef ULYSSES_COMMON_CONTRACT_CLI11_H_
#define ULYSSES_COMMON_CONTRACT_CLI11_H_

#include <iostream>
#include <optional>
#include <ostream>

#include "CLI/CLI.hpp"
#include "common/contract/exit.h"

namespace ulysses::contract {

// Prints what CLI11 prints for `error` (help text on `out`, the error on `err`) and
// returns the contract's exit code for it: kExitOk for --help, else kExitBadInput.
inline int ExitCodeForParseError(const CLI::App& app, const CLI::ParseError& error,
                                 std::ostream& out = std::cout, std::ostream& err = std::cerr) {
  return app.exit(error, out, err) == 0 ? kExitOk : kExitBadInput;
}

// Parses argv; std::nullopt when the program should go on, else its exit code.
inline std::optional<int> ParseCommandLine(CLI::App& app, int argc, const char* const* argv,
                                           std::ostream& out = std::cout,
                                           std::ostream& err = std::cerr) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return ExitCodeForParseError(app, error, out, err);
  }
  return std::nullopt;
}

}  // namespace ulysses::contract

#endif  // ULYSSES_COMMON_CONTRACT_CLI11_H_
