// Failure budgets of a job (docs/JOBSPEC.md "Failure budgets"; docs/COORDINATOR.md
// "Scheduling policy"). Two kinds of failure are counted apart:
// - application: a rank exited with an error (exit 1, a crash signal) — a bug or bad state
//   that tends to repeat;
// - infrastructure: a lost worker, a rank killed from outside (SIGKILL: kill -9, OOM killer,
//   node loss), a rank that lost a peer (exit 69) — routine on a large cluster.
// A failure counts while it is younger than failure_window_s and no new checkpoint was
// committed after it: every failure first forgets the earlier ones when a checkpoint was
// committed since the previous failure (the job made progress). The job is FAILED when the
// count of a kind reaches its budget (max_failures / max_infra_failures): a crash loop
// stops after max_failures restarts without progress, while a weeks-long job survives any
// number of node losses as long as it checkpoints between them.
//
// Pure functions over JobRecord; thread-compatible.
#ifndef ULYSSES_COORDINATOR_FAILURE_BUDGET_H_
#define ULYSSES_COORDINATOR_FAILURE_BUDGET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/model.h"

namespace ulysses::coordinator {

// At most this many failures of one kind are remembered (the oldest are forgotten): a
// budget above it never runs out.
inline constexpr int kMaxRememberedFailures = 1000;

struct BudgetCount {
  bool infra = false;
  int count = 0;           // Failures of this kind that count now, this one included.
  int budget = 0;          // max_failures or max_infra_failures.
  bool exhausted = false;  // count >= budget: the job fails.
  bool progress = false;   // Earlier failures were forgotten: a checkpoint came since.
};

// Records one failure of `rec` at `now_ms` (Unix ms) and counts its kind.
BudgetCount CountFailure(JobRecord& rec, bool infra, int64_t now_ms);

// Failures of one kind that would count at `now_ms` (for views): those in the window,
// none when a checkpoint was committed after the newest failure.
int CountingFailures(const JobRecord& rec, bool infra, int64_t now_ms);

// Text form of JobRecord::recent_failures for the store: "a<ms> i<ms> ..." (a =
// application, i = infrastructure), oldest first.
std::string EncodeFailureMarks(const std::vector<FailureMark>& marks);
absl::StatusOr<std::vector<FailureMark>> DecodeFailureMarks(const std::string& text);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_FAILURE_BUDGET_H_
