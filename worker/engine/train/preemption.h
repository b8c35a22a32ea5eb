// What a rank does with a preemption notice shorter than a step (docs/ENGINE.md "Preemption").
//
// Without a grace (ulysses-train rank without --stop-grace-s) SIGTERM only sets the stop flag:
// the ranks agree on it at the next step boundary, commit that step and exit 75, however long
// it takes. With --stop-grace-s G the supervisor SIGKILLs the rank G seconds after SIGTERM
// (the worker agent passes its --grace-period-s), so the rank must be gone before then.
// PreemptionWatch runs one thread that waits for the stop signal and then, with
// `deadline` = signal + G - margin (margin: 10 % of G, at most 2 s):
//   - when the current step and its stop checkpoint are expected to end before the deadline
//     (DecidePreemption on the measured step and save seconds), it lets the training thread
//     finish the step: the existing stop path commits it and the rank exits 75;
//   - otherwise (or when the deadline comes and the rank still runs) it waits, at most until
//     the deadline, for the asynchronous checkpoint in flight (a step that already finished)
//     to be durable (rank 0: committed; its checkpoint event is printed), and ends the process
//     with exit 75 from this thread. The step that was running is lost; so the work lost is at
//     most one checkpoint interval. A synchronous save in progress on the training thread is
//     cut: the commit protocol (checkpoint.h) leaves the previous checkpoint the latest.
// Every rank decides for itself; a peer that goes on computing fails its next collective once
// this rank is gone, and its supervisor reports what it did (the coordinator already knows the
// attempt is being preempted).
//
// Thread-safety: the Note* methods are called by the training thread; the watch thread reads
// what they publish through atomics. The destructor stops and joins the thread.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_PREEMPTION_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_PREEMPTION_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/train/checkpoint_saver.h"
#include "worker/engine/train/rank_events.h"

namespace ulysses::engine::train {

// What the training thread was doing when the notice came, in seconds.
struct PreemptionView {
  bool in_step = false;     // in a training step (else: saving, evaluating, setting up)
  double since_begin = 0;   // seconds since that step (or other phase) began
  double step_seconds = 0;  // a typical step (the median of the recent ones; 0 = none yet)
  double save_seconds = 0;  // a typical checkpoint save, start to durable (0 = none yet)
  double seconds_left = 0;  // until the deadline (grace minus margin minus time since SIGTERM)
};

enum class PreemptionAction {
  kFinishStep,  // the step and its stop checkpoint fit: let the training thread commit it
  kLeaveNow,    // wait for the checkpoint in flight, then exit 75
};

// Pure. kFinishStep when a typical step is known, the running step is not overdue (at most 1.5
// typical steps old) and what is left of it plus a save fits in seconds_left. Outside a step the
// next step must fit whole (the stop is agreed at the end of a step).
PreemptionAction DecidePreemption(const PreemptionView& v);
// The decision in words, for the rank's log.
std::string DescribePreemption(const PreemptionView& v, PreemptionAction action);

// The margin kept before the supervisor's SIGKILL: 10 % of the grace, at most 2 s.
double PreemptionMarginSeconds(double grace_seconds);

class PreemptionWatch {
 public:
  // grace_seconds <= 0: no watch (SIGTERM is handled at the next step boundary only).
  PreemptionWatch(double grace_seconds, int rank, CheckpointSaver* saver, RankReporter* report);
  ~PreemptionWatch();
  PreemptionWatch(const PreemptionWatch&) = delete;
  PreemptionWatch& operator=(const PreemptionWatch&) = delete;

  // Training thread: a step begins / ends after `seconds` (its own time) / another phase
  // (checkpoint, evaluation) begins.
  void NoteStepBegin();
  void NoteStepEnd(double seconds);
  void NoteOtherBegin();

 private:
  void Run();
  void Leave(const std::string& why, std::chrono::steady_clock::time_point deadline);
  bool WaitUntil(std::chrono::steady_clock::time_point t);  // false: destroyed meanwhile

  const double grace_seconds_;
  const int rank_;
  CheckpointSaver* const saver_;
  RankReporter* const report_;
  std::atomic<int64_t> phase_begin_ns_{0};  // steady clock
  std::atomic<bool> in_step_{false};
  std::atomic<double> step_seconds_{0};
  double recent_[5] = {0, 0, 0, 0, 0};  // training thread only
  int recent_count_ = 0;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // The destructor ran: the watch ends.
  std::thread thread_;
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_PREEMPTION_H_
