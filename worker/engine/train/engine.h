// The ulysses-train engine: one rank of one training stage and evaluation (export of a checkpoint
// to Hugging Face: worker/engine/hf/export.h).
//
// RunRank() is one `ulysses-train rank` (docs/CONTRACTS.md): it rendezvouses the
// stage's world (sp x dp ranks), resumes from the latest committed checkpoint (or
// the previous stage's final one, or spec.model.init_from, or the seed init),
// trains the stage's remaining optimizer steps, commits checkpoints every
// checkpoint.every_steps and at the stage end, evaluates, and prints the event lines
// of common/contract/rank_event.h on stdout. A SIGTERM/SIGINT on any rank is agreed
// across ranks at the next step boundary: all ranks commit a checkpoint and return
// kPreempted.
//
// Loss/gradient math (SP exactness): each rank backpropagates its LOCAL loss
// sum; gradients and (loss_sum, token_count) are summed over the world group;
// gradients are then divided by max(total_tokens, 1). Because the sequence
// all-to-all's backward routes every token's gradient to the rank that owns the
// parameter use, the world sum of local loss-sum gradients is exactly the
// full-sequence gradient, so sp=P matches sp=1 up to float reassociation.
//
// Errors: Status codes INVALID_ARGUMENT/NOT_FOUND/FAILED_PRECONDITION/DATA_LOSS
// mean bad input; others are failures (exit codes: contract::ExitCodeFor in
// common/contract/exit.h). A failed rank leaves the last committed checkpoint untouched.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_ENGINE_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_ENGINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/contract/exit.h"
#include "common/spec/job_spec.h"
#include "worker/engine/train/evaluate.h"

namespace ulysses::engine::train {

struct RankOptions {
  std::string job_file;                // -f JOB.yaml
  std::vector<std::string> overrides;  // --set spec.path=value
  std::string out_dir;                 // --out DIR (metrics.jsonl, default checkpoint dir)
  int stage = 0;                       // --stage I
  int rank = 0;                        // --rank R
  int world_size = 1;                  // --world-size W (must be sp x dp of the stage)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // --job-id, --tenant: the coordinator's identity of the job (the worker agent passes the
  // assignment's). Written into every manifest this rank commits; a checkpoint of another job
  // is neither resumed nor pruned (CheckCheckpointOwner). "" = no identity (local runs).
  std::string job_id;
  std::string tenant;
  int64_t generation = -1;  // --generation: the attempt (rendezvous keys); -1 = none
  // $ULYSSES_RENDEZVOUS_SECRET (the coordinator's per-attempt secret, from the worker agent; read
  // and cleared at start): with the job id and generation it prefixes every rendezvous key
  // (CommConfig::attempt, ::secret).
  std::string rendezvous_secret;
  std::string device = "cpu";    // cpu | cuda:N
  std::string backend = "auto";  // auto | gloo | nccl (parallelize.h)
  // --collective-timeout-s: the rendezvous and every collective fail (exit 69) after this,
  // plus the checkpoint's transfer time at the storage floor (ScaledCollectiveTimeoutSeconds).
  int collective_timeout_s = 60;
  // --step-events all: every rank prints its step events (per-rank figures for the worker
  // agent's metrics); rank0 (default): only rank 0 does.
  bool step_events_all_ranks = false;
  // --peak-flops F: the device's dense peak FLOP/s (e.g. 989e12 for an H100 in bf16); with it
  // the step events carry the world's MFU. 0 = unknown (no mfu field).
  double peak_flops = 0;
  // --progress-line stderr: rank 0 also prints ProgressLine (rank_events.h) on stderr for
  // every step (`ulysses-train train` asks for it); off (default) under the worker agent.
  bool progress_line = false;
  // --intra-op-threads N: this rank's intra-op threads, libtorch's and OpenBLAS's pools
  // (SetIntraOpThreads, rank_setup.h);
  // the launchers pass each local rank its share of the cores (common/process/cpu_share.h).
  // 0 = libtorch's default (a thread per core: N local ranks oversubscribe the cores N times).
  int intra_op_threads = 0;
  // --stop-grace-s G: SIGTERM is followed by SIGKILL after G seconds (the worker agent's
  // --grace-period-s): the rank exits 75 within it even when a step is longer (preemption.h).
  // 0 = no deadline: the rank stops at the next step boundary, however long that takes.
  double stop_grace_s = 0;
  // --control stdin: read checkpoint interval updates from stdin (common/contract/rank_control.h;
  // the worker agent's channel to a running rank). Needed by spec.checkpoint.every_steps: auto.
  bool control_stdin = false;
};

struct RankOutcome {
  bool preempted = false;  // checkpoint committed after an agreed stop: exit 75
};

absl::StatusOr<RankOutcome> RunRank(const RankOptions& options);

struct EvalOptions {
  std::string job_file;
  std::vector<std::string> overrides;
  std::string checkpoint;  // checkpoint dir, or ""
  std::string init_from;   // HF dir, or ""
  int64_t seq_len = 0;     // 0 = last stage's seq_len
  int rank = 0;
  int world_size = 1;  // SP degree of the evaluation (dp 1)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string device = "cpu";
};

// Validation loss (and accuracy when the data scores target positions) of one rank
// of an SP evaluation; every rank returns the same global numbers.
absl::StatusOr<EvalResult> RunEvalRank(const EvalOptions& options);

// Checkpoint root of a job: spec.checkpoint.dir, else <out_dir>/checkpoints.
std::string CheckpointRoot(const spec::JobSpec& spec, const std::string& out_dir);

// The stage a (re)started job runs first: 0 with no checkpoint, the checkpoint's
// stage when it is mid-stage, the next one when it completed its stage.
absl::StatusOr<int> FirstStageToRun(const spec::JobSpec& spec, const std::string& out_dir);

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_ENGINE_H_
