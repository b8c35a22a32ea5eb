#include "coordinator/checkpoint_interval.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ulysses::coordinator {

double YoungDalySeconds(double cost_seconds, double mtbf_seconds) {
  if (!(cost_seconds > 0) || !(mtbf_seconds > 0)) return 0;
  return std::sqrt(2.0 * cost_seconds * mtbf_seconds);
}

double GroupMtbfSeconds(double prior_gpu_mtbf_s, double gpu_seconds, int64_t failures,
                        int64_t gpus) {
  const double per_gpu = (std::max(0.0, prior_gpu_mtbf_s) + std::max(0.0, gpu_seconds)) /
                         (1.0 + static_cast<double>(std::max<int64_t>(0, failures)));
  return per_gpu / static_cast<double>(std::max<int64_t>(1, gpus));
}

IntervalChoice ChooseCheckpointInterval(const IntervalInputs& in) {
  IntervalChoice c;
  if (!in.auto_interval) {
    c.every_steps = in.spec_every_steps;
    c.every_seconds = static_cast<double>(in.spec_every_seconds);
    c.reason = "the job spec";
    return c;
  }
  c.mtbf_seconds = GroupMtbfSeconds(in.prior_gpu_mtbf_s, in.observed_gpu_seconds,
                                    in.observed_failures, in.group_gpus);
  const std::string mtbf = absl::StrFormat(
      "MTBF %.0f s for %d GPUs (%d failures in %.0f GPU-seconds observed + prior of one per %.0f "
      "GPU-seconds)",
      c.mtbf_seconds, in.group_gpus, in.observed_failures, in.observed_gpu_seconds,
      in.prior_gpu_mtbf_s);
  if (!in.cost_seconds.has_value()) {
    c.every_steps = 1;
    c.reason = absl::StrCat("auto: every step until a checkpoint's cost is measured; ", mtbf);
    return c;
  }
  // A measured cost of 0 (an asynchronous save that blocked for less than the clock's
  // resolution) is counted as 1 ms: the interval stays finite and positive.
  const double cost = std::max(*in.cost_seconds, 1e-3);
  c.every_seconds = std::min(YoungDalySeconds(cost, c.mtbf_seconds), 315360000.0);
  c.reason =
      absl::StrFormat("auto: every %.1f s = sqrt(2 x C %.3f s x %s)", c.every_seconds, cost, mtbf);
  return c;
}

bool IntervalChanged(const IntervalChoice& sent, const IntervalChoice& next) {
  if ((sent.every_steps > 0) != (next.every_steps > 0)) return true;
  if (sent.every_steps != next.every_steps) return true;
  const double a = sent.every_seconds, b = next.every_seconds;
  if ((a > 0) != (b > 0)) return true;
  return a > 0 && std::abs(a - b) > 0.1 * a;
}

}  // namespace ulysses::coordinator
