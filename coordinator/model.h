// In-memory records of the coordinator's durable state (one struct per SQLite table).
// Plain values; the Coordinator owns them under its mutex and the Store persists them.
// Times are Unix milliseconds (0 = unset).
#ifndef ULYSSES_COORDINATOR_MODEL_H_
#define ULYSSES_COORDINATOR_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/goodput.h"
#include "ulysses/v1/types.pb.h"

namespace ulysses::coordinator {

struct StageRecord {
  int index = 0;
  v1::StageState state = v1::STAGE_STATE_PENDING;
  int64_t seq_len = 0;
  int64_t steps = 0;
  int64_t step = 0;
  int sp = 1;
  int dp = 1;
  double loss = 0;
  double tokens_per_s = 0;
  double eval_loss = 0;
  double eval_accuracy = 0;
  int64_t eval_seq_len = 0;
  int attempts = 0;
  int64_t started_ms = 0;
  int64_t finished_ms = 0;
  // Rank 0's last step timing figures (StepProgress 7..11): in memory only, never stored
  // (a restarted coordinator shows them again from the next step on).
  v1::StepProgress figures;
  int world() const { return sp * dp; }
};

struct AttemptRecord {
  int64_t generation = 0;
  int stage = 0;
  std::vector<std::string> worker_ids;  // worker_ids[rank].
  std::vector<int> slots;               // slots[rank]: its slot on worker_ids[rank].
  // Where each rank ran, as placed: devices[rank] ("cuda:3", "cpu") and node_labels[rank]
  // (empty for attempts from before schema 5).
  std::vector<std::string> devices;
  std::vector<std::string> node_labels;
  std::string master_addr;
  int master_port = 0;
  int64_t started_ms = 0;
  int64_t ended_ms = 0;
  v1::AttemptOutcome outcome = v1::ATTEMPT_OUTCOME_RUNNING;
  int exit_code = 0;
  std::string reason;
  bool ended() const { return outcome != v1::ATTEMPT_OUTCOME_RUNNING; }
};

struct CheckpointRecord {
  std::string job_id;
  int64_t generation = 0;
  int stage = 0;
  int64_t step = 0;
  std::string path;
  int64_t bytes = 0;
  double seconds = 0;
  int64_t committed_ms = 0;
};

// A checkpoint directory a job was given (store table checkpoint_dirs). Kept after the job is
// deleted (ended_job_ttl_s): the directory and its checkpoints stay on disk, so it stays the
// tenant's; a later job may use it only as that tenant's, with checkpoint.adopt: true
// (path_policy.h). `job_id` is the last job that used it.
struct CheckpointDirRecord {
  std::string path;
  std::string tenant;
  std::string job_id;
  int64_t number = 0;  // job_id's number: ids stay above it after a restore.
  int64_t created_ms = 0;
};

// One failure counted against a failure budget (coordinator/failure_budget.h).
struct FailureMark {
  int64_t ms = 0;      // When (Unix ms).
  bool infra = false;  // Infrastructure (lost worker, killed rank, lost peer), else application.
};

struct JobRecord {
  std::string id;
  int64_t number = 0;  // Submission order (FIFO within a priority).
  std::string name;
  std::string owner;      // User who submitted it (auth::Principal::user).
  std::string tenant;     // Its tenant: only that tenant (and admins) see the job.
  std::string spec_yaml;  // Canonical.
  v1::JobState state = v1::JOB_STATE_PENDING;
  std::string reason;
  int64_t priority = 0;
  int64_t created_ms = 0;
  int64_t started_ms = 0;
  int64_t finished_ms = 0;
  int64_t state_entered_ms = 0;
  int stage_index = 0;
  int64_t generation = 0;
  int restarts = 0;
  int preemptions = 0;
  int failures = 0;                 // Application failures (reset by ResumeJob).
  int infra_failures = 0;           // Infrastructure failures (reset by ResumeJob).
  int preemptions_budget_used = 0;  // Counted against max_preemptions (reset by ResumeJob).
  int max_failures = 3;             // Budgets (coordinator/failure_budget.h), from the spec.
  int max_infra_failures = 20;
  int64_t failure_window_s = 86400;
  std::vector<FailureMark> recent_failures;  // Counting now, oldest first.
  int max_preemptions = -1;
  bool preemptible = true;  // spec.scheduling.preemptible.
  std::string node_label;
  std::string checkpoint_dir;
  std::string out_dir;
  std::optional<CheckpointRecord> last_checkpoint;
  double loss = 0;
  int64_t not_before_ms = 0;  // Restart backoff: not scheduled before this.
  std::vector<StageRecord> stages;
  std::vector<AttemptRecord> attempts;
  // SubmitJobRequest.request_id ("" = none) and a hash of what was submitted with it, so
  // a retry returns this job and a different request with the same id is refused.
  std::string request_id;
  std::string request_hash;
  GoodputRecord goodput;  // Where its GPU time went (goodput.h).

  bool terminal() const {
    return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
           state == v1::JOB_STATE_CANCELLED;
  }
  AttemptRecord* current_attempt() {
    return attempts.empty() || attempts.back().generation != generation ? nullptr
                                                                        : &attempts.back();
  }
  const AttemptRecord* current_attempt() const {
    return const_cast<JobRecord*>(this)->current_attempt();
  }
};

struct WorkerRecord {
  std::string id;
  std::string name;
  std::string node_label;
  std::string device;  // devices[0].
  std::string host;
  int capacity = 1;
  int64_t registered_ms = 0;
  int64_t last_seen_ms = 0;  // The last registration that changed another field (or the first).
  std::string identity;      // Who registered it (auth::Principal::WorkerIdentity()).
  std::vector<std::string> devices;  // devices[slot]: one per slot (capacity entries).
};

// One row of the events table (a serialized v1::JobEvent).
struct EventRecord {
  std::string job_id;
  int64_t sequence = 0;
  int64_t time_ms = 0;
  std::string payload;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_MODEL_H_
