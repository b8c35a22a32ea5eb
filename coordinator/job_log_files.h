// JobLogFiles: the durable copy of every job's log lines (rank stdout/stderr, agent and
// coordinator lines: each state change is one) under <state_dir>/logs/<job id>/, so
// `ulyssesctl logs` shows the same lines after a coordinator restart (docs/OPERATIONS.md
// "Logs").
//
// One JSON object per line (the LogLine's proto3 JSON: sequence, time, workerId, rank,
// generation, stream, text), appended to log.jsonl after the commit that produced the
// lines. When log.jsonl would pass half of `bytes_per_job` it becomes log.1.jsonl (replacing
// the previous one), so a job's files hold at most about `bytes_per_job`, newest lines kept.
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
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ulysses/v1/types.pb.h"

namespace ulysses::coordinator {

class JobLogFiles {
 public:
  // `dir`: <state_dir>/logs (created on the first append).
  JobLogFiles(std::string dir, int64_t bytes_per_job)
      : dir_(std::move(dir)), bytes_per_job_(bytes_per_job) {}

  // Appends `lines` (job id, line) in order, grouped by job. Errors are logged once per
  // job and otherwise ignored: a full disk must not stop scheduling.
  void Append(const std::vector<std::pair<std::string, v1::LogLine>>& lines);
  // The job's lines, oldest first (log.1.jsonl then log.jsonl); unreadable lines skipped.
  std::vector<v1::LogLine> Load(const std::string& job_id) const;
  // The files of one job (its directory).
  std::string JobDir(const std::string& job_id) const { return dir_ + "/" + job_id; }
  // Deletes the files of `job_id`; errors are logged (the files stay, nothing else changes).
  void Remove(const std::string& job_id);
  // Deletes every job directory whose name is not in `keep` (sorted); returns how many.
  int RemoveExcept(const std::vector<std::string>& keep);

 private:
  absl::Status AppendJob(const std::string& job_id, const std::string& text);

  std::string dir_;
  int64_t bytes_per_job_;
  std::vector<std::string> failed_;  // Jobs whose append failed (logged once).
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_JOB_LOG_FILES_H_
