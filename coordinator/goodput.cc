#include "coordinator/goodput.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace ulysses::coordinator {
namespace {

// GPU-seconds of `ms` milliseconds on `world` ranks (negative spans count 0).
double GpuSeconds(int64_t ms, int world) {
  return static_cast<double>(std::max<int64_t>(0, ms)) / 1000.0 * std::max(0, world);
}

double& Lost(std::array<double, kLostReasons>& lost, LostReason r) {
  return lost[static_cast<int>(r)];
}

void Add(GoodputRecord& g, GoodputDelta& d, LostReason r, double gpu_s) {
  Lost(g.lost_gpu_s, r) += gpu_s;
  Lost(d.lost_gpu_s, r) += gpu_s;
}

}  // namespace

const char* LostReasonName(LostReason reason) {
  switch (reason) {
    case LostReason::kFailure:
      return "failure";
    case LostReason::kPreemption:
      return "preemption";
    case LostReason::kRestart:
      return "restart";
    case LostReason::kCheckpointStall:
      return "checkpoint_stall";
    case LostReason::kCancelled:
      return "cancelled";
  }
  return "failure";
}

GoodputDelta GoodputStart(GoodputRecord& g, GoodputSteps& steps, int64_t generation, int world,
                          int64_t started_ms) {
  GoodputDelta d;
  if (g.generation != 0 && !g.settled) {
    // The previous attempt still runs in this record (it cannot: its end was missed): it ends
    // where the new one starts.
    if (g.ended_ms == 0) GoodputEnd(g, v1::ATTEMPT_OUTCOME_ABORTED, started_ms);
    bool changed = false;
    d = GoodputSettle(g, started_ms, 0, /*force=*/true, &changed);
  }
  g.generation = generation;
  g.world = world;
  g.started_ms = started_ms;
  g.mark_ms = started_ms;
  g.trained = false;
  g.ended_ms = 0;
  g.settled = false;
  g.end_reason = LostReason::kFailure;
  steps.clear();
  return d;
}

GoodputDelta GoodputStep(GoodputRecord& g, GoodputSteps& steps, int64_t step, double step_seconds,
                         int64_t now_ms) {
  GoodputDelta d;
  if (g.generation == 0 || g.ended_ms != 0 || now_ms < g.mark_ms) return d;
  if (!g.trained) {
    g.trained = true;
    const int64_t took = step_seconds >= 0 && std::isfinite(step_seconds)
                             ? static_cast<int64_t>(step_seconds * 1000)
                             : 0;
    const int64_t start = std::clamp<int64_t>(now_ms - took, g.mark_ms, now_ms);
    Add(g, d, LostReason::kRestart, GpuSeconds(start - g.mark_ms, g.world));
    g.mark_ms = start;
  }
  if (!steps.empty() && steps.back().first >= step) return d;  // A repeat: keep the first end.
  steps.emplace_back(step, now_ms);
  if (steps.size() > kMaxGoodputSteps) {
    GoodputSteps kept;
    for (size_t i = (steps.size() - 1) % 2; i < steps.size(); i += 2) kept.push_back(steps[i]);
    steps.swap(kept);  // Every other entry, the newest kept.
  }
  return d;
}

GoodputDelta GoodputCommit(GoodputRecord& g, GoodputSteps& steps, int64_t step,
                           double blocked_seconds, int64_t now_ms) {
  GoodputDelta d;
  if (g.generation == 0 || g.settled) return d;
  const int64_t limit = std::max(g.mark_ms, g.ended_ms != 0 ? g.ended_ms : now_ms);
  int64_t end_of_step = g.mark_ms;  // Unknown step end: nothing more is productive now.
  while (!steps.empty() && steps.front().first <= step) {
    end_of_step = steps.front().second;
    steps.pop_front();
  }
  end_of_step = std::clamp(end_of_step, g.mark_ms, limit);
  const double productive = GpuSeconds(end_of_step - g.mark_ms, g.world);
  g.productive_gpu_s += productive;
  d.productive_gpu_s += productive;
  g.mark_ms = end_of_step;
  const int64_t blocked_ms = blocked_seconds > 0 && std::isfinite(blocked_seconds)
                                 ? static_cast<int64_t>(blocked_seconds * 1000)
                                 : 0;
  const int64_t stall = std::min(blocked_ms, limit - g.mark_ms);
  Add(g, d, LostReason::kCheckpointStall, GpuSeconds(stall, g.world));
  g.mark_ms += stall;
  return d;
}

void GoodputEnd(GoodputRecord& g, v1::AttemptOutcome outcome, int64_t ended_ms) {
  if (g.generation == 0 || g.ended_ms != 0) return;
  g.ended_ms = std::max(ended_ms, g.mark_ms);
  switch (outcome) {
    case v1::ATTEMPT_OUTCOME_SUCCEEDED:
      g.end_reason = LostReason::kRestart;
      break;
    case v1::ATTEMPT_OUTCOME_PREEMPTED:
      g.end_reason = LostReason::kPreemption;
      break;
    default:
      g.end_reason = LostReason::kFailure;
      break;
  }
}

void GoodputCancelled(GoodputRecord& g) {
  if (g.generation != 0 && g.ended_ms != 0 && !g.settled) g.end_reason = LostReason::kCancelled;
}

GoodputDelta GoodputSettle(GoodputRecord& g, int64_t now_ms, int64_t settle_ms, bool force,
                           bool* changed) {
  GoodputDelta d;
  *changed = false;
  if (g.generation == 0 || g.ended_ms == 0 || g.settled) return d;
  if (!force && now_ms < g.ended_ms + settle_ms) return d;
  Add(g, d, g.end_reason, GpuSeconds(g.ended_ms - g.mark_ms, g.world));
  g.allocated_gpu_s += GpuSeconds(g.ended_ms - g.started_ms, g.world);
  g.mark_ms = g.ended_ms;
  g.settled = true;
  *changed = true;
  return d;
}

v1::Goodput GoodputToProto(const GoodputRecord& g, int64_t now_ms) {
  std::array<double, kLostReasons> lost = g.lost_gpu_s;
  double allocated = g.allocated_gpu_s;
  double uncommitted = 0;
  if (g.generation != 0 && !g.settled) {
    const int64_t end = g.ended_ms != 0 ? g.ended_ms : std::max(now_ms, g.mark_ms);
    allocated += GpuSeconds(end - g.started_ms, g.world);
    if (g.ended_ms != 0) {
      Lost(lost, g.end_reason) += GpuSeconds(end - g.mark_ms, g.world);
    } else {
      uncommitted = GpuSeconds(end - g.mark_ms, g.world);
    }
  }
  v1::Goodput p;
  p.set_allocated_gpu_seconds(allocated);
  p.set_productive_gpu_seconds(g.productive_gpu_s);
  p.set_lost_failure_gpu_seconds(Lost(lost, LostReason::kFailure));
  p.set_lost_preemption_gpu_seconds(Lost(lost, LostReason::kPreemption));
  p.set_lost_restart_gpu_seconds(Lost(lost, LostReason::kRestart));
  p.set_lost_checkpoint_stall_gpu_seconds(Lost(lost, LostReason::kCheckpointStall));
  p.set_lost_cancelled_gpu_seconds(Lost(lost, LostReason::kCancelled));
  p.set_uncommitted_gpu_seconds(uncommitted);
  p.set_ratio(allocated > 0 ? g.productive_gpu_s / allocated : 0);
  return p;
}

std::string EncodeGoodput(const GoodputRecord& g) {
  std::string out = absl::StrFormat("v1 %.17g %.17g", g.allocated_gpu_s, g.productive_gpu_s);
  for (double v : g.lost_gpu_s) absl::StrAppendFormat(&out, " %.17g", v);
  absl::StrAppend(&out, " ", g.generation, " ", g.world, " ", g.started_ms, " ", g.mark_ms, " ",
                  g.trained ? 1 : 0, " ", g.ended_ms, " ", g.settled ? 1 : 0, " ",
                  static_cast<int>(g.end_reason), " end");
  return out;
}

absl::StatusOr<GoodputRecord> DecodeGoodput(const std::string& text) {
  GoodputRecord g;
  if (text.empty()) return g;
  const std::vector<std::string> f = absl::StrSplit(text, ' ');
  auto bad = [&] {
    return absl::DataLossError(absl::StrCat("jobs.goodput: \"", text.substr(0, 200),
                                            "\" is not a goodput record (v1 and 17 numbers)"));
  };
  if (f.size() != 17 || f[0] != "v1") return bad();
  std::vector<double> num(7);
  for (int i = 0; i < 7; ++i) {
    if (!absl::SimpleAtod(f[1 + i], &num[i]) || !std::isfinite(num[i]) || num[i] < 0) {
      return bad();
    }
  }
  int64_t trained = 0, settled = 0, reason = 0;
  if (!absl::SimpleAtoi(f[8], &g.generation) || !absl::SimpleAtoi(f[9], &g.world) ||
      !absl::SimpleAtoi(f[10], &g.started_ms) || !absl::SimpleAtoi(f[11], &g.mark_ms) ||
      !absl::SimpleAtoi(f[12], &trained) || !absl::SimpleAtoi(f[13], &g.ended_ms) ||
      !absl::SimpleAtoi(f[14], &settled) || !absl::SimpleAtoi(f[15], &reason) || reason < 0 ||
      reason >= kLostReasons || f[16] != "end") {
    return bad();
  }
  g.allocated_gpu_s = num[0];
  g.productive_gpu_s = num[1];
  for (int i = 0; i < kLostReasons; ++i) g.lost_gpu_s[i] = num[2 + i];
  g.trained = trained != 0;
  g.settled = settled != 0;
  g.end_reason = static_cast<LostReason>(reason);
  return g;
}

}  // namespace ulysses::coordinator
