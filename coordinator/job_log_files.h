// JobLogFiles: the durable copy of every job's log lines (rank stdout/stderr, agent and
// coordinator lines: each state change is one) under <state_dir>/logs/<job id>/, so
// `ulyssesctl logs` shows the same lines after a coordinator restart (docs/OPERATIONS.md
// "Logs").
//
// One JSON object per line (the LogLine's proto3 JSON: sequence, time, workerId, rank,
// generation, stream, text), appended to log.jsonl after the commit that produced the
// lines. When log.jsonl would pass half of `bytes_per_job` it becomes log.1.jsonl (replacing
// the previous one), so a job's files hold at most `bytes_per_job` bytes as written (after
// JSON escaping: a control character is 6 bytes on disk), newest lines kept: a batch larger
// than half loses its oldest lines. All jobs' files together stay within `bytes_total` (the
// logs' share of state_max_bytes) and an `admit` callback can refuse a job's growth (its
// tenant's byte quota); refused lines stay in memory only (logged once per job).
// Appends are not fsynced: a coordinator killed with -9 loses nothing (the page cache has
// it); a host crash may lose the last lines. A job's files go with its record: Remove() after
// the commit that deleted it (ended_job_ttl_s), and RemoveExcept() at start for the directories
// of jobs the store no longer holds (deleted by a coordinator killed before it removed them,
// or newer than a restored backup: their ids would be handed out again).
//
// Not thread-safe: the Coordinator calls it under its mutex.
#ifndef ULYSSES_COORDINATOR_JOB_LOG_FILES_H_
#define ULYSSES_COORDINATOR_JOB_LOG_FILES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ulysses/v1/types.pb.h"

namespace ulysses::coordinator {

class JobLogFiles {
 public:
  // `dir`: <state_dir>/logs (created on the first append). `bytes_total` 0: no bound.
  JobLogFiles(std::string dir, int64_t bytes_per_job, int64_t bytes_total = 0)
      : dir_(std::move(dir)), bytes_per_job_(bytes_per_job), bytes_total_(bytes_total) {}

  // Whether `job_id`'s files may grow by `bytes` (true: they will).
  using Admit = std::function<bool(const std::string& job_id, int64_t bytes)>;

  // Appends `lines` (job id, line) in order, grouped by job. Errors and refusals are logged
  // once per job and otherwise ignored: a full disk must not stop scheduling.
  void Append(const std::vector<std::pair<std::string, v1::LogLine>>& lines,
              const Admit& admit = nullptr);
  // Bytes of the job's files on disk (0 without any), and of every job's.
  int64_t Bytes(const std::string& job_id);
  int64_t total_bytes() const { return total_; }
  // The job's lines, oldest first (log.1.jsonl then log.jsonl); unreadable lines skipped.
  std::vector<v1::LogLine> Load(const std::string& job_id) const;
  // The files of one job (its directory).
  std::string JobDir(const std::string& job_id) const { return dir_ + "/" + job_id; }
  // Deletes the files of `job_id`; errors are logged (the files stay, nothing else changes).
  void Remove(const std::string& job_id);
  // Deletes every job directory whose name is not in `keep` (sorted); returns how many.
  int RemoveExcept(const std::vector<std::string>& keep);

 private:
  // Appends `lines` (each one JSON line with its newline) of one job.
  absl::Status AppendJob(const std::string& job_id, std::vector<std::string> lines,
                         const Admit& admit);
  void Forget(const std::string& job_id);

  std::string dir_;
  int64_t bytes_per_job_;
  int64_t bytes_total_;
  std::map<std::string, int64_t> bytes_;  // Per job seen so far (stat'ed on first touch).
  int64_t total_ = 0;                     // Sum of bytes_.
  std::vector<std::string> failed_;       // Jobs whose append failed (logged once).
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_JOB_LOG_FILES_H_
