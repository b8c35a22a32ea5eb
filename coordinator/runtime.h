// Runtime records of the coordinator: what it knows about each job and worker beyond
// their durable records (model.h), the stream sinks it pushes to, and the transaction
// (Txn) in which one request's changes and side effects are collected until the store
// commit succeeds.
//
// Plain data. The Coordinator owns a State under its mutex; every function that takes a
// State, JobRt, WorkerRt or Txn expects that mutex to be held by its caller.
#ifndef ULYSSES_COORDINATOR_RUNTIME_H_
#define ULYSSES_COORDINATOR_RUNTIME_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/checkpoint_interval.h"
#include "coordinator/model.h"
#include "coordinator/store.h"
#include "ulysses/v1/job_service.pb.h"
#include "ulysses/v1/worker_service.pb.h"

namespace ulysses::coordinator {

// An open worker Session stream.
class WorkerSink {
 public:
  virtual ~WorkerSink() = default;
  virtual void Send(const v1::CoordinatorMessage& message) = 0;
  // Ends the stream with `status` (superseded session, lost worker, shutdown).
  virtual void Close(const absl::Status& status) = 0;
};

// An open WatchJob stream.
class JobEventSink {
 public:
  virtual ~JobEventSink() = default;
  virtual void OnEvent(const v1::JobEvent& event) = 0;
  virtual void OnJobEnded() = 0;  // After the terminal state's event: end the stream.
};

// An open GetJobLogs --follow stream.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void OnLines(const std::vector<v1::LogLine>& lines) = 0;
  virtual void OnJobEnded() = 0;  // End the stream.
};

struct WorkerRt {
  WorkerRecord rec;
  v1::WorkerState state = v1::WORKER_STATE_DISCONNECTED;
  WorkerSink* sink = nullptr;
  uint64_t session = 0;
  int64_t last_seen_steady = 0;
  // What we believe it runs, by slot (each until that rank's exit report). A slot is one of
  // rec.capacity devices; the worker is BUSY while any slot runs a rank.
  std::map<int, v1::WorkRef> slots;
  std::vector<v1::CoordinatorMessage> pending;  // Queued while no session is open.
  // The worker announced its own shutdown (SIGTERM: a Kubernetes preemption). It gets no new
  // work until it registers again, so a requeued job is not placed on a worker about to exit.
  bool draining = false;
  int64_t lost_since_steady = 0;  // When it was declared LOST (0 = not lost).
  // The heartbeat interval this worker was last told (Register, or an Ack since).
  int64_t told_heartbeat_interval_ms = 0;
  // Its inter-node transport as it last registered it (not persisted: a worker registers again
  // before it gets work). Only SOCKETS on a worker with CUDA slots restricts placement.
  v1::Fabric fabric = v1::FABRIC_UNSPECIFIED;

  bool busy() const { return !slots.empty(); }
  // The slot running rank `ref.rank` of `ref`'s job and generation (-1 = none).
  int SlotOf(const v1::WorkRef& ref) const {
    for (const auto& [slot, held] : slots) {
      if (held.job_id() == ref.job_id() && held.generation() == ref.generation() &&
          held.rank() == ref.rank()) {
        return slot;
      }
    }
    return -1;
  }
  // The ranks of `job_id`'s generation `generation` it runs.
  std::vector<v1::WorkRef> Held(const std::string& job_id, int64_t generation) const {
    std::vector<v1::WorkRef> out;
    for (const auto& [slot, held] : slots) {
      if (held.job_id() == job_id && held.generation() == generation) out.push_back(held);
    }
    return out;
  }
  // Frees the slot of `ref` (job, generation, rank); false if it held none.
  bool Release(const v1::WorkRef& ref) {
    const int slot = SlotOf(ref);
    if (slot < 0) return false;
    slots.erase(slot);
    return true;
  }
};

struct JobRt {
  JobRecord rec;
  std::set<int> started_ranks;
  std::set<int> done_ranks;
  bool awaiting_reconnect = false;  // Recovered after a coordinator restart, ranks not back yet.
  int64_t reconnect_deadline_steady = 0;
  std::set<int> reconnected_ranks;
  std::deque<v1::JobEvent> events;  // The newest config.event_history (KeepEvent).
  int64_t event_bytes = 0;          // Serialized size of `events` (the tenant's byte quota).
  int64_t next_event_seq = 1;
  std::deque<v1::LogLine> logs;  // The newest lines, within the config's line and byte bounds.
  int64_t log_bytes = 0;         // Of `logs` (LogLineBytes).
  int64_t next_log_seq = 1;
  std::set<JobEventSink*> watchers;
  std::set<LogSink*> log_followers;
  bool progress_dirty = false;  // Progress not yet written (flushed by the ticker).
  int64_t last_flush_steady = 0;
  int64_t queued_since_steady = 0;
  int64_t recovering_since_steady = 0;
  int64_t last_progress_steady = 0;
  int64_t last_progress_generation = 0;
  int64_t last_progress_log_steady = 0;  // When rank 0's last progress line was logged.
  // metadata.labels of the stored spec, parsed on first use (ListJobs label filters).
  std::optional<std::map<std::string, std::string>> labels;
  // The job whose placement this job's live attempt is being preempted for (checkpoint now,
  // requeue); "" = none. Cleared when the attempt ends. Not persisted: after a coordinator
  // restart its ranks still exit as preempted (the worker reports the stop request).
  std::string preempting_for;
  // Job.conditions' Unschedulable (status false: does not hold). In memory: set at submission
  // and by each scheduling pass while the job waits (JobMachine::UpdateUnschedulable).
  v1::JobCondition unschedulable;
  // The stage ETA's base: the first rank-0 progress report of this generation and stage.
  int64_t eta_base_steady = 0;
  int64_t eta_base_step = 0;
  int64_t eta_base_generation = -1;
  int eta_base_stage = -1;
  // spec.checkpoint.every_steps, read from rec.spec_yaml on the first progress report
  // (ulysses_checkpoint_every_steps); -1 until then.
  int64_t checkpoint_every_steps = -1;
  // spec.parallelism.allow_tcp_fabric, read from rec.spec_yaml on the first scheduling pass
  // that places the job; -1 until then.
  mutable int allow_tcp_fabric = -1;  // A cache of the spec: filled by the (const) pass.
  GoodputSteps goodput_steps;         // Rank 0's step ends since the last commit (goodput.h).
  // spec.checkpoint.every_steps: auto: the interval sent to the ranks and its measured inputs
  // (job_interval.cc). In memory only.
  JobIntervalState interval;
};

// The start of the work a failure now would lose (ulysses_checkpoint_age_seconds, the
// progress lines): the later of the last commit and the current attempt's start (a
// restarted attempt resumed from that commit); the job's start without an attempt.
inline int64_t WorkAtRiskSinceMs(const JobRecord& rec) {
  const AttemptRecord* a = rec.current_attempt();
  int64_t since = a == nullptr ? rec.started_ms : a->started_ms;
  if (rec.last_checkpoint) since = std::max(since, rec.last_checkpoint->committed_ms);
  return since;
}

// Appends `event` to job.events, keeping the newest `history` and job.event_bytes in step.
inline void KeepEvent(JobRt& job, v1::JobEvent event, int64_t history) {
  job.event_bytes += static_cast<int64_t>(event.ByteSizeLong());
  job.events.push_back(std::move(event));
  while (job.events.size() > static_cast<size_t>(history)) {
    job.event_bytes -= static_cast<int64_t>(job.events.front().ByteSizeLong());
    job.events.pop_front();
  }
}

// Everything the coordinator holds in memory.
struct State {
  std::map<std::string, std::unique_ptr<JobRt>> jobs;        // By id.
  std::map<std::string, std::unique_ptr<WorkerRt>> workers;  // By id.
  int64_t next_job_number = 1;
  uint64_t next_session_id = 1;
  int next_port = 0;
  int64_t log_bytes = 0;                              // Of every job's log buffer.
  std::map<std::string, std::string> job_by_request;  // SubmitJobRequest.request_id -> job id.
  // Every checkpoint directory a job was given, by path (deleted jobs' too: store table
  // checkpoint_dirs).
  std::map<std::string, CheckpointDirRecord> checkpoint_dirs;

  JobRt* FindJob(const std::string& id) {
    auto it = jobs.find(id);
    return it == jobs.end() ? nullptr : it->second.get();
  }
  WorkerRt* FindWorker(const std::string& id) {
    auto it = workers.find(id);
    return it == workers.end() ? nullptr : it->second.get();
  }
};

// One request's changes: the records to write and the side effects that may happen only
// once they are durable. Coordinator::CommitLocked writes `batch` (plus `jobs` and
// `workers`) in one store transaction and then, and only then, flushes the rest.
struct Txn {
  std::set<JobRt*> jobs;        // Changed jobs (written whole).
  std::set<WorkerRt*> workers;  // Changed workers.
  Store::Batch batch;           // Events and checkpoints to insert.
  // Side effects, in order, after the commit:
  std::vector<std::pair<WorkerRt*, v1::CoordinatorMessage>> outbound;  // To worker sessions.
  std::vector<std::pair<JobRt*, v1::JobEvent>> notify;                 // To WatchJob streams.
  std::vector<std::pair<JobRt*, v1::LogLine>> log_lines;               // To log followers.
  std::vector<std::pair<std::string, v1::LogLine>> log_files;          // Every line: job log files.
  std::vector<JobRt*> ended;  // Jobs that reached a terminal state (streams end).
};

// What one buffered log line counts against the log byte bounds: its text plus a fixed
// allowance for the rest of the message.
inline int64_t LogLineBytes(const v1::LogLine& line) {
  return static_cast<int64_t>(line.text().size()) + 64;
}

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

// Waiting for placement.
inline bool IsQueued(v1::JobState s) {
  return s == v1::JOB_STATE_PENDING || s == v1::JOB_STATE_PREEMPTED ||
         s == v1::JOB_STATE_RECOVERING;
}

// "RUNNING" for JOB_STATE_RUNNING.
inline std::string StateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  return n.rfind("JOB_STATE_", 0) == 0 ? n.substr(10) : n;
}

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_RUNTIME_H_
