// ulyssesctl: see client/cli.h.
#include <iostream>

#include "client/cli.h"
#include "common/process/process_init.h"

int main(int argc, char** argv) {
  ulysses::InitProcess(argv[0]);  // Crash traces; Abseil's deadlock detector off.
  return ulysses::client::RunCli(argc, argv, std::cout, std::cerr);
}
