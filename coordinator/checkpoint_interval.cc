#include "coordinator/checkpoint_interval.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ulysses::coordinator {
namespace {

bool Positive(std::optional<double> v) { return v.has_value() && std::isfinite(*v) && *v > 0; }

}  // namespace

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
  const int64_t gpus = std::max<int64_t>(1, in.group_gpus);
  const int64_t failures = std::max<int64_t>(0, in.observed_failures);
  const double gpu_seconds =
      std::isfinite(in.observed_gpu_seconds) ? std::max(0.0, in.observed_gpu_seconds) : 0.0;
  c.mtbf_seconds = GroupMtbfSeconds(in.prior_gpu_mtbf_s, gpu_seconds, failures, gpus);
  c.mtbf_source = failures > 0 ? "measured" : "prior";
  const std::string mtbf = absl::StrFormat(
      "MTBF %.0f s for %d GPUs (%s: %d failures in %.1f GPU-hours observed for groups of %d, "
      "prior one per %.0f GPU-hours)",
      c.mtbf_seconds, gpus, c.mtbf_source, failures, gpu_seconds / 3600.0, gpus,
      in.prior_gpu_mtbf_s / 3600.0);
  if (Positive(in.cost_seconds)) {
    c.cost_seconds = *in.cost_seconds;
    c.cost_source = "measured";
  } else if (in.cost_seconds.has_value()) {
    // A measured cost of 0 (an asynchronous save that blocked for less than the clock's
    // resolution) is counted as 1 ms: the interval stays finite and positive.
    c.cost_seconds = 1e-3;
    c.cost_source = "measured";
  } else if (Positive(in.prior_cost_seconds)) {
    c.cost_seconds = *in.prior_cost_seconds;
    c.cost_source = "prior";
  } else {
    c.cost_source = "none";
    c.every_steps = 1;
    c.reason = absl::StrCat("auto: every step until a checkpoint's cost is measured; ", mtbf);
    return c;
  }
  c.cost_seconds = std::max(c.cost_seconds, 1e-3);
  c.interval_seconds =
      std::min(YoungDalySeconds(c.cost_seconds, c.mtbf_seconds), kMaxIntervalSeconds);
  const std::string t = absl::StrFormat("T = sqrt(2 x C %.3f s (%s) x %s) = %.1f s", c.cost_seconds,
                                        c.cost_source, mtbf, c.interval_seconds);
  if (Positive(in.step_seconds)) {
    c.step_seconds = *in.step_seconds;
    const double steps = std::round(c.interval_seconds / c.step_seconds);
    c.every_steps =
        static_cast<int64_t>(std::clamp(steps, 1.0, static_cast<double>(kMaxIntervalSteps)));
    c.reason = absl::StrFormat("auto: every %d steps = %s / step %.3f s", c.every_steps, t,
                               c.step_seconds);
  } else {
    c.every_seconds = std::max(c.interval_seconds, 1e-3);
    c.reason = absl::StrCat("auto: ", t, " (no step time measured yet)");
  }
  return c;
}

bool IntervalChanged(const IntervalChoice& sent, const IntervalChoice& next) {
  auto moved = [](double a, double b) {
    if ((a > 0) != (b > 0)) return true;
    return a > 0 && std::abs(a - b) > kIntervalResendFraction * a;
  };
  return moved(static_cast<double>(sent.every_steps), static_cast<double>(next.every_steps)) ||
         moved(sent.every_seconds, next.every_seconds);
}

}  // namespace ulysses::coordinator
