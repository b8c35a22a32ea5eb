#include "worker/engine/train/checkpoint_schedule.h"

#include <iostream>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/spec/job_spec_fields.h"

namespace ulysses::engine::train {

// The newest valid interval read from stdin, shared with the reader thread.
struct CheckpointSchedule::Mailbox {
  absl::Mutex mu;
  std::optional<contract::CheckpointIntervalControl> newest ABSL_GUARDED_BY(mu);

  void Deliver(const std::string& line, int rank) {
    if (line.empty()) return;
    absl::StatusOr<contract::CheckpointIntervalControl> c = contract::ParseRankControlLine(line);
    if (!c.ok()) {
      ULOG(ERROR) << "rank " << rank
                  << ": ignoring a control line that breaks the protocol: " << c.status().message();
      return;
    }
    absl::MutexLock lock(&mu);
    if (newest.has_value() && c->version <= newest->version) {
      ULOG(WARNING) << "rank " << rank << ": ignoring checkpoint interval version " << c->version
                    << " (already holds " << newest->version << ")";
      return;
    }
    newest = *std::move(c);
  }
};

absl::StatusOr<std::unique_ptr<CheckpointSchedule>> CheckpointSchedule::Create(
    const spec::CheckpointSpec& spec, bool control_stdin, int rank) {
  if (spec.every_steps_auto && !control_stdin) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec::fields::PathOf(&spec::CheckpointSpec::every_steps),
        ": auto needs the coordinator, which picks and sends the "
        "interval; this rank has no control channel (ulysses-train train runs without one: use "
        "every_steps: N or every_seconds: N)"));
  }
  auto mailbox = std::make_shared<Mailbox>();
  std::unique_ptr<CheckpointSchedule> s(new CheckpointSchedule(rank, mailbox));
  s->applied_.version = 0;
  s->applied_.every_steps = spec.every_steps_auto ? 0 : spec.every_steps;
  s->applied_.every_seconds = static_cast<double>(spec.every_seconds);
  s->applied_.reason =
      spec.every_steps_auto ? "auto: waiting for the coordinator's interval" : "the job spec";
  if (control_stdin) {
    std::thread([mailbox, rank] {
      for (std::string line; std::getline(std::cin, line);) mailbox->Deliver(line, rank);
    }).detach();
  }
  return s;
}

CheckpointSchedule::~CheckpointSchedule() = default;

void CheckpointSchedule::DeliverForTesting(const std::string& line) {
  mailbox_->Deliver(line, rank_);
}

int64_t CheckpointSchedule::HeldVersion() const {
  absl::MutexLock lock(&mailbox_->mu);
  return mailbox_->newest.has_value() ? mailbox_->newest->version : applied_.version;
}

void CheckpointSchedule::Fill(float* slots, Clock::time_point now) const {
  const double since = std::chrono::duration<double>(now - last_save_).count();
  slots[0] = applied_.every_seconds > 0 && since >= applied_.every_seconds ? 1.0f : 0.0f;
  const int64_t held = HeldVersion();  // <= 2^24 - 1: exact in a float
  slots[1] = static_cast<float>(held);
  slots[2] = -static_cast<float>(held);
}

bool CheckpointSchedule::Decide(const float* slots, int64_t step_in_stage) {
  const bool due_by_time = slots[0] > 0;
  const bool due_by_steps = applied_.every_steps > 0 && step_in_stage % applied_.every_steps == 0;
  const auto newest = static_cast<int64_t>(slots[1]);
  const auto oldest = static_cast<int64_t>(-slots[2]);
  if (newest == oldest && newest > applied_.version) {
    absl::MutexLock lock(&mailbox_->mu);
    if (mailbox_->newest.has_value() && mailbox_->newest->version == newest) {
      applied_ = *mailbox_->newest;
      ULOG(INFO) << "rank " << rank_ << ": checkpoint interval version " << applied_.version
                 << " from step " << step_in_stage + 1 << ": every " << applied_.every_steps
                 << " steps, every " << applied_.every_seconds << " s (" << applied_.reason << ")";
    }
  }
  return due_by_time || due_by_steps;
}

}  // namespace ulysses::engine::train
