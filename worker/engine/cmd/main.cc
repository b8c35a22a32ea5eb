// ulysses-train: the training engine binary (see worker/engine/cmd/cli.h).
#include "worker/engine/cmd/cli.h"

int main(int argc, char** argv) { return ulysses::engine::train::UlyssesTrainMain(argc, argv); }
