// Command-line front end of ulysses-train (hand-rolled flag parsing so engine-only
// builds need no CLI11). Commands and flags (docs/ENGINE.md; `rank` is what the
// worker agent runs, see docs/API.md):
//   train  -f JOB.yaml [--nproc N] [--out DIR] [--set spec.path=value ...]
//   eval   -f JOB.yaml [--nproc N] [--checkpoint DIR | --init-from HFDIR] [--seq-len T]
//   export --checkpoint DIR --hf-out DIR [--dtype bf16|fp16|fp32|fp64]
//   rank   -f JOB.yaml --out DIR --stage I --rank R --world-size W --master-addr HOST
//          --master-port PORT [--device cpu|cuda:N] [--set ...]
// Returns the process exit code (common/contract/exit.h: 0 ok, 75 preempted, 2 bad
// input including bad flags, 1 failure).
#ifndef ULYSSES_WORKER_ENGINE_CMD_CLI_H_
#define ULYSSES_WORKER_ENGINE_CMD_CLI_H_

namespace ulysses::engine::train {

int UlyssesTrainMain(int argc, char** argv);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_CMD_CLI_H_
