// ulysses-train: the training engine binary (see worker/engine/cmd/cli.h).
#include "common/process/process_init.h"
#include "worker/engine/cmd/cli.h"

int main(int argc, char** argv) {
  ulysses::InitProcess(argv[0]);  // Crash traces; Abseil's deadlock detector off.
  return ulysses::engine::train::UlyssesTrainMain(argc, argv);
}
