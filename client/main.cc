// ulyssesctl: see client/cli.h.
#include <iostream>

#include "client/cli.h"

int main(int argc, char** argv) {
  return ulysses::client::RunCli(argc, argv, std::cout, std::cerr);
}
