// Offline per-stage resource plan of a TrainJob (`ulyssesctl plan`): tokens per
// rank, Ulysses all-to-all volume, per-rank memory (model state from
// common/spec/memory_model.h under the job's ZeRO stage and offload, activations,
// a runtime reserve) against a device's memory, a FITS / DOES NOT FIT verdict
// with the cheapest change that makes a stage fit, and a step-time estimate.
// Formulas and assumptions: docs/JOBSPEC.md, "Plan". Pure arithmetic on a
// validated JobSpec; thread-safe.
#ifndef ULYSSES_CLIENT_PLAN_H_
#define ULYSSES_CLIENT_PLAN_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"

namespace ulysses::client {

// "80GiB", "141GB", "512MiB", "1.5 TiB", "2048" (bytes): binary (KiB MiB GiB TiB)
// and decimal (KB MB GB TB) units, case-insensitive, optional space. Errors name
// `field`, the text and the accepted forms.
absl::StatusOr<double> ParseByteSize(const std::string& text, const std::string& field);

// What the plan is checked against. Numbers per rank (one rank = one device).
struct DeviceSpec {
  std::string type;             // h100 | h200 | a100-80g | cpu
  double memory_bytes = 0;      // Memory of one device (cpu: host memory / ranks).
  double reserve_bytes = 0;     // Held by the runtime, not the job: CUDA context, NCCL and
                                // allocator slack on a GPU; the process baseline on cpu.
  double peak_flops_bf16 = 0;   // Dense peak for bf16/fp16 matmuls.
  double peak_flops_fp32 = 0;   // Dense peak for fp32 (TF32 on GPUs).
  double peak_flops_fp64 = 0;   // Dense peak for fp64.
  double mfu = 0.4;             // Assumed model FLOPs utilisation.
  double a2a_bytes_per_s = 0;   // Assumed all-to-all bandwidth per rank.
  bool host_is_device = false;  // cpu: offload moves nothing off the device.
  // Short-lived bytes (activations, ZeRO's gathered layers and transient full gradients) are
  // multiplied by this: glibc malloc keeps freed heap chunks of the cpu run's short-lived
  // tensors resident (measured, docs/BENCHMARKS.md); 1 on GPUs, whose caching-allocator slack
  // is in reserve_bytes.
  double transient_overhead = 1.0;
  // True when memory_bytes came from the host (cpu without --gpu-memory): then it is
  // the host's memory shared by every rank of a stage (all ranks run on this host).
  bool memory_is_host_total = false;
  // Host memory of the machine a rank runs on, per rank (cpu: the host's; GPUs: a typical node's
  // memory over its 8 GPUs). Checked against the asynchronous checkpoint snapshot plus offloads.
  double host_memory_bytes = 0;
  double host_memory_per_rank_bytes = 0;  // 0 = cpu: host_memory_bytes over the stage's ranks
  int64_t devices_per_node = 1;           // GPUs of one node (8: DGX/HGX); cpu: 1 host
};

// The device table: `type` one of h100, h200, a100-80g, cpu (else an error naming
// the choices). `memory` overrides the device's memory when not empty (ParseByteSize);
// for cpu the default is this host's physical memory shared by the stage's ranks.
absl::StatusOr<DeviceSpec> ResolveDevice(const std::string& type, const std::string& memory);
std::vector<std::string> DeviceTypes();

struct StagePlan {
  int64_t seq_len = 0;  // N
  int64_t steps = 0;
  int64_t sp = 1;  // P
  int64_t dp = 1;
  int64_t world = 1;               // P * dp
  int64_t tokens_per_rank = 0;     // N / P
  int64_t micro_batch = 1;         // optimizer.micro_batch_size: sequences a rank holds at once
  int64_t kv_heads_exchanged = 0;  // spec::UlyssesKvHeadsExchanged: Hkv, or P when replicated
  // The remaining fields are 0 when the shape is unknown (init_from without shape fields).
  double a2a_elements = 0;  // Forward all-to-all elements per layer per rank per micro-batch.
  double a2a_bytes = 0;     // a2a_elements * dtype size.
  // Per-rank device bytes (model state: spec::ModelStatePerRank).
  double parameter_bytes = 0;
  double gradient_bytes = 0;
  double optimizer_bytes = 0;         // 0 when offloaded to the host (GPU devices).
  double gathered_bytes = 0;          // ZeRO 2/3 transient full-layer buffers.
  double saved_activation_bytes = 0;  // Held between forward and backward (0 when offloaded).
  double working_bytes = 0;           // Peak transient: one layer's backward or the loss.
  double runtime_bytes = 0;           // DeviceSpec::reserve_bytes.
  double host_bytes = 0;              // Moved to host memory by offload (GPU devices).
  // Checkpoints (spec::ChooseCheckpointMode): the host memory of one rank's asynchronous
  // snapshot, whether saves are asynchronous, and why (the fallback's reason names the fix).
  double snapshot_host_bytes = 0;
  bool checkpoint_async = true;
  std::string checkpoint_reason;
  // Start-up peaks per rank (spec::StartupPerRank; runtime reserve included on the device side):
  // stage 0's init (or init_from import) and every stage's resume (a stage > 0 resumes from the
  // previous one's checkpoint; any stage resumes after a preemption). 0 when not applicable.
  double init_bytes = 0;         // device, stage 0: seeded init or import
  double init_host_bytes = 0;    // host, the same
  bool init_is_import = false;   // spec.model.init_from is set
  double resume_bytes = 0;       // device
  double resume_host_bytes = 0;  // host
  // Host memory per rank during the steady state: host_bytes plus what a save holds there (the
  // asynchronous snapshot, or a synchronous save's copies of the device state).
  double steady_host_bytes = 0;
  // `ulysses-train export` of this stage's checkpoint: one host process (+ the baseline on cpu).
  double export_bytes = 0;
  int64_t nodes = 1;  // ceil(world / devices_per_node)
  double model_state_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + gathered_bytes;
  }
  double activation_bytes() const { return saved_activation_bytes + working_bytes; }
  double total_bytes() const { return model_state_bytes() + activation_bytes() + runtime_bytes; }
  // The largest of steady state, init/import and resume: what FITS is decided on.
  double peak_bytes() const { return std::max({total_bytes(), init_bytes, resume_bytes}); }
  double host_peak_bytes() const {
    return std::max({steady_host_bytes, init_host_bytes, resume_host_bytes});
  }
  // Which of them is the peak: "steady", "init", "import" or "resume".
  std::string peak_phase() const;
  std::string host_peak_phase() const;
  // Against the device (0 when no device was given).
  double device_bytes = 0;      // Memory per rank the stage is checked against.
  double host_limit_bytes = 0;  // Host memory per rank (GPU devices; 0 = not checked).
  bool fits = true;             // peak_bytes() <= device_bytes and host_peak_bytes() <= host limit
  // Step time: model FLOPs per rank per optimizer step (recomputation included),
  // compute seconds at peak * mfu, all-to-all seconds at the stated bandwidth.
  double flops_per_rank = 0;
  double compute_seconds = 0;
  double a2a_seconds = 0;
  double step_seconds() const { return compute_seconds + a2a_seconds; }
};

// Why a stage needs its nodes: re-planned on one node fewer (dp, else sp, shrunk to fit the
// GPUs), what it would need and that it does not fit. Empty when the stage needs one node or the
// smaller layout is not possible (then `layout` says so).
struct NodeReason {
  int64_t nodes = 1;
  std::string text;  // one line, e.g. "2 nodes of 8 h100 (world 16 = sp 8 x dp 2): on 1 node ..."
  bool fewer_fits = false;  // the stage would also fit on one node fewer
};
NodeReason ExplainNodes(const spec::JobSpec& spec, size_t stage, const DeviceSpec& device);

// Parameters of the model (delegates to spec::CountParameters).
double ParameterCount(const spec::ModelSpec& model);

// Plans every stage; with a device, sets device_bytes, fits and the step time.
std::vector<StagePlan> PlanJob(const spec::JobSpec& spec, const DeviceSpec* device = nullptr);

// The cheapest change to a stage that does not fit: edits of the spec in order of
// cost (activation_checkpointing, tiled_mlp, tiled_loss or smaller loss tiles,
// zero_stage, offload_optimizer, offload_activations, a larger sp_degree allowed by
// the head rule); fewest edits first, then the cheapest most expensive edit.
struct FitFix {
  bool found = false;
  std::vector<std::string> changes;  // e.g. "spec.parallelism.zero_stage=3"
  spec::JobSpec fixed;               // The spec with the changes (passes ValidateJobSpec).
  StagePlan plan;                    // The stage re-planned with them.
  double gpu_hours = 0;              // The stage with them: StageGpuHours(plan).
};
// The first of FindFixes (found = false when there is none).
FitFix FindFix(const spec::JobSpec& spec, size_t stage, const DeviceSpec& device);
// Every minimal combination of the edits above (none of its edits can be left out) that makes
// the stage fit and whose spec passes spec::ValidateJobSpec, cheapest first: by the stage's
// GPU-hours, then fewer devices, then fewest and cheapest edits; at most `max` of them.
std::vector<FitFix> FindFixes(const spec::JobSpec& spec, size_t stage, const DeviceSpec& device,
                              size_t max);

// Device-hours of a stage: world x steps x step time / 3600 (0 when the step time is unknown).
double StageGpuHours(const StagePlan& plan);

// The bottom line of a planned job (`ulyssesctl plan` prints it under the tables).
struct JobTotals {
  int64_t stages = 0;
  double seconds = 0;    // Sum over stages of steps x step time (0 when unknown).
  double gpu_hours = 0;  // Sum of StageGpuHours.
  int64_t nodes = 1;     // The most nodes any stage takes.
  int64_t max_world = 1;
  // The largest host memory one node holds in any stage: host_peak per rank x the ranks on a
  // node (cpu: every rank's peak, the host being the device).
  double host_peak_per_node_bytes = 0;
  double checkpoint_bytes = 0;       // One committed checkpoint (spec::CheckpointStateBytes).
  int64_t keep_last = 1;             // spec.checkpoint.keep_last (at least 1 is kept).
  double checkpoint_disk_bytes = 0;  // (keep_last + 1) checkpoints: the kept ones and a new one.
  std::vector<size_t> not_fitting;   // Stages that do not fit.
};
JobTotals TotalsOf(const spec::JobSpec& spec, const std::vector<StagePlan>& plans,
                   const DeviceSpec& device);

// --host-memory: a node's host memory (GPUs: shared by its devices_per_node ranks; cpu: the
// host's, which the ranks share as device memory too unless --gpu-memory gave that).
absl::Status SetHostMemory(const std::string& text, DeviceSpec* device);

// `ulyssesctl plan` exits with this when a stage does not fit (after printing the whole plan);
// docs/CONTRACTS.md. 0 when every stage fits, 2 for bad input as every verb.
inline constexpr int kExitPlanDoesNotFit = 3;

// OK, or FailedPrecondition with one line per stage that does not fit:
// "spec.stages[i]: needs X per rank, device has Y (h100, usable after reserve); fix: --set ..."
absl::Status CheckFits(const spec::JobSpec& spec, const DeviceSpec& device);

// The longest sequence the spec's model, dtype, ZeRO stage, offload and memory options train at
// on `gpus` devices (`ulyssesctl plan --max-seq N`): one stage of sp = gpus, dp 1, micro-batch 1,
// lengths in multiples of 1024 * gpus, doubled until the plan stops fitting and then bisected
// (memory grows with the length). `limit` names what stops the next length: the host memory, or
// the largest per-rank device term there. An error when sp = gpus breaks the head rule.
struct MaxSeqResult {
  int64_t gpus = 1;
  int64_t max_seq_len = 0;  // 0: not even 1024 * gpus fits
  StagePlan at_max;         // the plan at max_seq_len (when > 0)
  StagePlan over;           // the plan at the first length that does not fit
  std::string limit;        // e.g. "act_saved 61.2 GiB of 79.1 GiB"
};
absl::StatusOr<MaxSeqResult> MaxSequence(const spec::JobSpec& spec, const DeviceSpec& device,
                                         int64_t gpus);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_PLAN_H_
