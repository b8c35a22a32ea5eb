#include "worker/engine/train/preemption.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/contract/exit.h"
#include "common/logging.h"
#include "common/stop.h"

namespace ulysses::engine::train {
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Seconds the rest of the work before the stop commit is expected to take (< 0: unknown).
double SecondsToStopCommit(const PreemptionView& v) {
  if (!(v.step_seconds > 0)) return -1;
  if (!v.in_step) return v.step_seconds + v.save_seconds;  // a whole step, then the save
  if (v.since_begin > 1.5 * v.step_seconds) return -1;     // overdue: no estimate
  return std::max(0.0, v.step_seconds - v.since_begin) + v.save_seconds;
}

}  // namespace

PreemptionAction DecidePreemption(const PreemptionView& v) {
  const double needed = SecondsToStopCommit(v);
  return needed >= 0 && needed <= v.seconds_left ? PreemptionAction::kFinishStep
                                                 : PreemptionAction::kLeaveNow;
}

std::string DescribePreemption(const PreemptionView& v, PreemptionAction action) {
  const double needed = SecondsToStopCommit(v);
  std::string what =
      absl::StrFormat("%s for %.2f s, typical step %.2f s, typical save %.2f s, %.2f s left",
                      v.in_step ? "in a step" : "between steps", v.since_begin, v.step_seconds,
                      v.save_seconds, v.seconds_left);
  if (action == PreemptionAction::kFinishStep) {
    return absl::StrFormat("finishing the step and committing it (needs ~%.2f s; %s)", needed,
                           what);
  }
  return absl::StrCat(needed < 0 ? "no estimate of the step's end"
                                 : "the step and its save "
                                   "do not fit",
                      " (", what,
                      "): leaving after the checkpoint in flight; the running step is lost");
}

double PreemptionMarginSeconds(double grace_seconds) {
  return std::min(2.0, 0.1 * std::max(0.0, grace_seconds));
}

PreemptionWatch::PreemptionWatch(double grace_seconds, int rank, CheckpointSaver* saver,
                                 RankReporter* report)
    : grace_seconds_(grace_seconds), rank_(rank), saver_(saver), report_(report) {
  phase_begin_ns_ = NowNs();
  if (grace_seconds_ > 0) thread_ = std::thread([this] { Run(); });
}

PreemptionWatch::~PreemptionWatch() {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PreemptionWatch::NoteStepBegin() {
  phase_begin_ns_ = NowNs();
  in_step_ = true;
}

void PreemptionWatch::NoteStepEnd(double seconds) {
  in_step_ = false;
  phase_begin_ns_ = NowNs();
  recent_[recent_count_++ % 5] = seconds;
  const int n = std::min(recent_count_, 5);
  double sorted[5];
  std::copy(recent_, recent_ + n, sorted);
  std::sort(sorted, sorted + n);
  step_seconds_ = sorted[n / 2];
}

void PreemptionWatch::NoteOtherBegin() {
  in_step_ = false;
  phase_begin_ns_ = NowNs();
}

bool PreemptionWatch::WaitUntil(Clock::time_point t) {
  absl::MutexLock lock(&mu_);
  return !mu_.AwaitWithDeadline(absl::Condition(&done_),
                                absl::Now() + absl::FromChrono(t - Clock::now()));
}

void PreemptionWatch::Run() {
  // Poll the stop flag so that the destructor is never kept waiting long.
  while (!StopRequested()) {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Milliseconds(50))) return;
  }
  const Clock::time_point noticed = Clock::now();
  const Clock::time_point deadline =
      noticed + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                    grace_seconds_ - PreemptionMarginSeconds(grace_seconds_)));
  PreemptionView v;
  v.in_step = in_step_;
  v.since_begin = static_cast<double>(NowNs() - phase_begin_ns_.load()) * 1e-9;
  v.step_seconds = step_seconds_;
  v.save_seconds = saver_ != nullptr ? saver_->last_save_seconds() : 0;
  v.seconds_left = std::chrono::duration<double>(deadline - noticed).count();
  const PreemptionAction action = DecidePreemption(v);
  ULOG(INFO) << "rank " << rank_ << ": stop requested with a grace of " << grace_seconds_
             << " s: " << DescribePreemption(v, action);
  if (action == PreemptionAction::kFinishStep) {
    // The training thread commits the step and the rank exits 75 on its own; if it is still
    // here at the deadline, the estimate was wrong.
    if (!WaitUntil(deadline)) return;
    Leave("the step and its checkpoint did not end within the grace", deadline);
    return;
  }
  Leave("the running step would not end within the grace", deadline);
}

void PreemptionWatch::Leave(const std::string& why, Clock::time_point deadline) {
  if (saver_ != nullptr && !saver_->DrainBeforeExit(deadline, *report_)) {
    ULOG(WARNING) << "rank " << rank_
                  << ": the checkpoint in flight did not finish within the grace (the previous "
                     "committed checkpoint stays the latest)";
  }
  absl::MutexLock lock(&mu_);
  if (done_) return;  // the training thread finished meanwhile and exits on its own
  ULOG(WARNING) << "rank " << rank_ << ": " << why << "; exiting " << contract::kExitPreempted;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  _exit(contract::kExitPreempted);
}

}  // namespace ulysses::engine::train
