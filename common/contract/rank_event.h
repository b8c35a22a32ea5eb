// The `ulysses-train rank` stdout event protocol: what a rank tells its supervisor
// (the worker agent, or a person running the engine by hand). Defined here and nowhere
// else; documented in docs/CONTRACTS.md. The engine writes events with WriteRankEvent;
// the worker agent reads them with ParseRankEventLine.
//
// One JSON object per stdout line, "event" first, then the fields below (all
// required unless marked optional; no other fields):
//
//   {"event":"step","stage":S,"step":N,"steps":T,"loss":L,"tokens_per_s":X,"seq_len":Q
//    [,"step_seconds":D,"data_wait_seconds":D,"forward_seconds":D,"backward_seconds":D,
//      "optimizer_seconds":D,"alltoall_seconds":D,"alltoall_bytes":B,"peak_allocated_bytes":B,
//      "peak_reserved_bytes":B,"memory_limit_bytes":B,"rank_tokens_per_s":X,
//      "model_flops_per_s":F,"mfu":M,"median_step_seconds":D,"slowest_step_seconds":D,
//      "slowest_rank":R]}
//   {"event":"checkpoint","stage":S,"step":N,"path":"...","bytes":B,"seconds":D}
//   {"event":"eval","stage":S,"seq_len":Q,"loss":L[,"accuracy":A][,"step":N]}
//   {"event":"done","stage":S[,"peak_rss_bytes":R]}
//
// Every rank prints its own step events (the optional per-rank figures are that rank's;
// loss, tokens_per_s and the rest are the group's and the same on every rank); only rank
// 0's are progress for the coordinator. The optional group figures (mfu, median/slowest step
// seconds, slowest_rank) are the same on every rank. Rank 0 prints checkpoint and eval events;
// every rank may print done. Any other stdout line is a log line. A line that is a JSON object with
// an "event" key (or that starts with {"event") is an event line and must follow this protocol
// exactly; one that does not is rejected with an error naming the field, the value and the rule.
//
// Pure functions, thread-safe.
#ifndef ULYSSES_COMMON_CONTRACT_RANK_EVENT_H_
#define ULYSSES_COMMON_CONTRACT_RANK_EVENT_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ulysses::contract {

// One optimizer step of the stage finished.
struct StepEvent {
  static constexpr const char* kKind = "step";
  int64_t stage = 0;        // >= 0: stage index.
  int64_t step = 0;         // 1..steps: optimizer steps of this stage done so far.
  int64_t steps = 0;        // >= 1: optimizer steps of the stage.
  double loss = 0;          // finite, >= 0: the step's mean token loss over the world.
  double tokens_per_s = 0;  // finite, >= 0: the step's global training throughput.
  int64_t seq_len = 0;      // >= 1: global sequence length of the stage.
  // Optional per-rank figures of this step (finite, >= 0). Timings are host wall time; on
  // CUDA, kernels run asynchronously, so the forward/backward split is approximate.
  std::optional<double> step_seconds;           // The whole step on this rank.
  std::optional<double> data_wait_seconds;      // Reading and packing the step's batches.
  std::optional<double> forward_seconds;        // Forward passes (with their all-to-alls).
  std::optional<double> backward_seconds;       // Backward passes (with their all-to-alls).
  std::optional<double> optimizer_seconds;      // Gradient reduction, clipping and update.
  std::optional<double> alltoall_seconds;       // Sequence all-to-alls, forward and backward.
  std::optional<int64_t> alltoall_bytes;        // All-to-all bytes this rank sent this step.
  std::optional<int64_t> peak_allocated_bytes;  // CUDA: peak allocated; CPU: peak RSS.
  std::optional<int64_t> peak_reserved_bytes;   // CUDA: peak reserved; CPU: peak RSS.
  std::optional<int64_t> memory_limit_bytes;    // GPU memory, or the CPU memory limit.
  std::optional<double> rank_tokens_per_s;      // Tokens this rank trained per second.
  std::optional<double> model_flops_per_s;      // Model FLOP/s of this rank (MFU numerator).
  // Optional group figures of this step, the same on every rank (finite, >= 0).
  // Model FLOPs utilisation of the world: model FLOP/s of all ranks over world x the peak
  // FLOP/s the rank was given (--peak-flops); absent when the peak is unknown. Above 1 only
  // when the given peak is below the device's real one.
  std::optional<double> mfu;
  std::optional<double> median_step_seconds;   // Median over the ranks of step_seconds.
  std::optional<double> slowest_step_seconds;  // The largest step_seconds of any rank.
  // 0..world-1: the rank with slowest_step_seconds (the lowest such rank on a tie); given
  // exactly when slowest_step_seconds is.
  std::optional<int64_t> slowest_rank;
  // The global gradient norm before clipping, and the learning rate the step applied.
  std::optional<double> grad_norm;
  std::optional<double> lr;
};

// A checkpoint was committed (every shard durable, manifest written last).
struct CheckpointEvent {
  static constexpr const char* kKind = "checkpoint";
  int64_t stage = 0;   // >= 0.
  int64_t step = 0;    // >= 0: optimizer step within the stage it holds.
  std::string path;    // The checkpoint directory: non-empty, <= 4096 bytes, no control chars.
  int64_t bytes = -1;  // >= 0: total size on disk; -1 when it could not be measured.
  double seconds = 0;  // finite, >= 0: wall time of the save.
  // optional, finite, >= 0: of `seconds`, the time training was blocked (a synchronous save:
  // all of it; an asynchronous one: the wait for the previous save plus the host snapshot).
  std::optional<double> blocked_seconds;
};

// The stage's evaluation.
struct EvalEvent {
  static constexpr const char* kKind = "eval";
  int64_t stage = 0;               // >= 0.
  int64_t seq_len = 0;             // >= 1: sequence length evaluated at.
  double loss = 0;                 // finite, >= 0: mean validation token loss.
  std::optional<double> accuracy;  // optional, 0..1: retrieval accuracy (needle data).
  std::optional<int64_t> step;     // optional, >= 0: steps of the stage done when it ran
                                   // (periodic evals: eval.every_steps; the stage end: steps).
};

// This rank is done with the stage (also printed when the stage had finished before).
struct DoneEvent {
  static constexpr const char* kKind = "done";
  int64_t stage = 0;                      // >= 0.
  std::optional<int64_t> peak_rss_bytes;  // optional, >= 0: the rank's peak resident set.
};

using RankEvent = std::variant<StepEvent, CheckpointEvent, EvalEvent, DoneEvent>;

// "step", "checkpoint", "eval" or "done".
const char* RankEventKind(const RankEvent& event);

// The event as one JSON line without the trailing newline. Fields the protocol
// bounds are written as given: a non-finite double becomes null, which the parser
// rejects, so an engine must not report one.
std::string SerializeRankEvent(const RankEvent& event);

// Writes SerializeRankEvent(event) + "\n" and flushes (one write per line, so lines
// of concurrent writers never interleave within a line).
void WriteRankEvent(std::ostream& out, const RankEvent& event);

// Reads one stdout line (without its newline; a trailing '\r' is ignored):
// - std::nullopt: not an event line (a log line);
// - an event: a valid event line;
// - InvalidArgument: an event line that breaks the protocol (unknown kind, missing,
//   unknown or mistyped field, value out of range), e.g.
//   `step.loss: null is not a number (a finite number >= 0)`.
absl::StatusOr<std::optional<RankEvent>> ParseRankEventLine(absl::string_view line);

bool operator==(const StepEvent& a, const StepEvent& b);
bool operator==(const CheckpointEvent& a, const CheckpointEvent& b);
bool operator==(const EvalEvent& a, const EvalEvent& b);
bool operator==(const DoneEvent& a, const DoneEvent& b);

}  // namespace ulysses::contract

#endif  // ULYSSES_COMMON_CONTRACT_RANK_EVENT_H_
