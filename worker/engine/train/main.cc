// ulysses-train: the training engine binary (see worker/engine/train/cli.h).
#include "worker/engine/train/cli.h"

int main(int argc, char** argv) { return ulysses::engine::train::UlyssesTrainMain(argc, argv); }
