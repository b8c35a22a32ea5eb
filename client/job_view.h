// How ulyssesctl shows jobs and workers: state names, JSON objects for `-o json`,
// aligned tables, and the live progress view of `watch`. Pure formatting over the
// ulysses.v1 messages; no I/O except into the given streams. Thread-compatible.
//
// `-o json` objects always carry: id, name, state, reason, stage (index), seq_len,
// step, steps, restarts, preemptions, failures, last_checkpoint ({path, stage, step}
// or null), loss. `describe` adds stages[], attempts[], events[], checkpoints[].
// Workers: id, name, state, draining, device, node, host, heartbeat_age_seconds,
// running ({job_id, generation, stage, rank}) when busy.
#ifndef ULYSSES_CLIENT_JOB_VIEW_H_
#define ULYSSES_CLIENT_JOB_VIEW_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "ulysses/v1/job_service.pb.h"

namespace ulysses::client {

std::string JobStateName(ulysses::v1::JobState state);         // "RUNNING"
std::string StageStateName(ulysses::v1::StageState state);     // "COMPLETED"
std::string OutcomeName(ulysses::v1::AttemptOutcome outcome);  // "PREEMPTED"
std::string WorkerStateName(ulysses::v1::WorkerState state);   // "IDLE"
// The table's STATE: the state, plus ",DRAINING" for a worker that announced its shutdown.
std::string WorkerStateLabel(const ulysses::v1::Worker& worker);  // "BUSY,DRAINING"
bool IsTerminal(ulysses::v1::JobState state);

nlohmann::json JobSummaryJson(const ulysses::v1::Job& job);
nlohmann::json JobDetailJson(const ulysses::v1::Job& job);
nlohmann::json WorkerJson(const ulysses::v1::Worker& worker);
nlohmann::json JobEventJson(const ulysses::v1::JobEvent& event);

// Column-aligned table: first row is the header.
void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out);

void PrintJobsTable(const std::vector<ulysses::v1::Job>& jobs, std::ostream& out);
void PrintWorkersTable(const std::vector<ulysses::v1::Worker>& workers, std::ostream& out);
// Human-readable `describe job`.
void PrintJobDescription(const ulysses::v1::Job& job, std::ostream& out);

// `ulyssesctl top`: the jobs not yet ended (queued, scheduling, running, checkpointing,
// preempted, recovering), or with `include_ended` every job (an ended job shows its last
// stage's last figures), in the given order, at `now_unix_ms` (this machine's clock; the
// checkpoint age is now - last_checkpoint.committed_at).
bool ShownInTop(const ulysses::v1::Job& job, bool include_ended);
// Header + one row per shown job: JOB NAME STATE STAGE SEQ_LEN STEP LOSS TOK/S MFU SLOWEST
// CKPT_AGE, e.g. {"job-000007", "demo", "RUNNING", "1/2", "64", "4/10", "2.5000", "1234",
// "25.0%", "r1 0.750s", "1m05s"}; "-" where a figure is not known (MFU: the workers run
// without --peak-flops; SLOWEST: the engine did not report it; CKPT_AGE: no checkpoint yet).
std::vector<std::vector<std::string>> TopTable(const std::vector<ulysses::v1::Job>& jobs,
                                               int64_t now_unix_ms, bool include_ended = false);
// `-o json`: an array with one object per shown job: id, name, state, stage, stages_total,
// seq_len, step, steps, loss, tokens_per_s, and (null when unknown) mfu, step_seconds,
// median_step_seconds, slowest_rank, slowest_step_seconds, checkpoint_age_seconds.
nlohmann::json TopJson(const std::vector<ulysses::v1::Job>& jobs, int64_t now_unix_ms,
                       bool include_ended = false);

// The `watch` view. Feed it every JobEvent; it keeps the latest job picture and
// prints it: on a TTY a redrawn block (one bar per stage), else plain lines.
class WatchView {
 public:
  WatchView(std::ostream& out, bool tty) : out_(out), tty_(tty) {}
  void OnEvent(const ulysses::v1::JobEvent& event);
  // Prints the final summary line. Returns the job's state as last seen.
  ulysses::v1::JobState Finish();
  ulysses::v1::JobState state() const { return job_.state(); }
  bool has_snapshot() const { return has_snapshot_; }

 private:
  void Redraw();
  std::string StageLine(const ulysses::v1::StageStatus& stage);

  std::ostream& out_;
  bool tty_;
  bool has_snapshot_ = false;
  ulysses::v1::Job job_;
  int drawn_lines_ = 0;
  // First progress seen per stage (for the ETA): stage -> (time, step).
  std::map<int, std::pair<std::chrono::steady_clock::time_point, int64_t>> first_progress_;
};

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_JOB_VIEW_H_
