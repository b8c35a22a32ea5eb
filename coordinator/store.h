// Store: the coordinator's durable state in one SQLite file (<state_dir>/coordinator.db,
// WAL mode, synchronous=FULL, schema versioned in `meta`).
//
// Load() reads everything back after a (re)start; Write() persists a Batch of changed
// records in ONE transaction, so a state transition is either fully on disk or not at
// all (a crash mid-write leaves the previous state; reopening the file is recovery).
//
// A failed Write() leaves nothing of its batch on disk. What happens next depends on why
// it failed:
// - the database refused the batch's data (a constraint such as NOT NULL, a value too
//   big, a type mismatch): that write fails with INTERNAL (a bug in the caller, which
//   validates before it writes) and the store stays writable;
// - anything else (an I/O error, a full disk, corruption, a lock it cannot get): the
//   store goes into read-only mode: this and every later Write() return UNAVAILABLE
//   with the first error (leveldb-style), and the caller reports NOT_SERVING, until a
//   Probe() write succeeds again (space freed, the disk back): then it is writable.
//
// Not thread-safe: the Coordinator calls it under its mutex.
#ifndef ULYSSES_COORDINATOR_STORE_H_
#define ULYSSES_COORDINATOR_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/model.h"

struct sqlite3;

namespace ulysses::coordinator {

// What each version added: coordinator/store_schema.cc (the column lists). Older files are
// migrated on open.
inline constexpr int kSchemaVersion = 7;

struct StoreOptions {
  // Persisted events kept per job: after each write the oldest beyond this many are
  // deleted (0 = keep all).
  int64_t events_per_job = 0;
  // > 0 caps the database file (SQLite max_page_count): beyond it writes fail as on a
  // full disk.
  int64_t max_bytes = 0;
};

class Store {
 public:
  // Creates <dir> if needed, opens/creates the database, migrates the schema.
  // FailedPrecondition when the file has a newer schema version than this binary.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& dir,
                                                     StoreOptions options = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  struct Snapshot {
    std::vector<JobRecord> jobs;  // With stages, attempts and last_checkpoint.
    std::vector<WorkerRecord> workers;
    // Every checkpoint directory jobs were given, deleted jobs' too.
    std::vector<CheckpointDirRecord> checkpoint_dirs;
    // The highest job number the store has seen (jobs, deleted ones, checkpoint_dirs).
    int64_t max_job_number = 0;
  };
  absl::StatusOr<Snapshot> Load();

  struct Batch {
    // Upserted. Only the stage and attempt rows that changed since this Store last
    // wrote or loaded them are written (a transition of a 64-stage job writes one stage
    // row, not 64).
    std::vector<JobRecord> jobs;
    std::vector<WorkerRecord> workers;         // Upserted.
    std::vector<std::string> deleted_workers;  // Worker ids removed (LOST past their TTL).
    // Job ids removed with every row that names them (ended past ended_job_ttl_s).
    std::vector<std::string> deleted_jobs;
    std::vector<CheckpointRecord> checkpoints;  // Inserted.
    std::vector<EventRecord> events;            // Inserted; older ones pruned per options.
    // Upserted (by path); never deleted, not even with deleted_jobs.
    std::vector<CheckpointDirRecord> checkpoint_dirs;
    bool empty() const {
      return jobs.empty() && workers.empty() && deleted_workers.empty() && checkpoints.empty() &&
             events.empty() && deleted_jobs.empty() && checkpoint_dirs.empty();
    }
  };
  absl::Status Write(const Batch& batch);
  // False once a Write() failed for a reason other than its data (see above).
  bool writable() const { return sticky_error_.ok(); }
  // Why the store is read-only (OK while writable).
  const absl::Status& read_only_reason() const { return sticky_error_; }
  // While read-only: tries one write transaction that takes (and frees again)
  // kProbeHeadroomBytes; when it commits, the store is writable again (OK). Otherwise
  // returns that write's error and stays read-only.
  absl::Status Probe();
  static constexpr int64_t kProbeHeadroomBytes = 512 * 1024;  // 2x the largest spec.

  // Events of one job in sequence order (newest `limit`).
  absl::StatusOr<std::vector<EventRecord>> LoadEvents(const std::string& job_id, int limit);
  // Checkpoints of one job in commit order.
  absl::StatusOr<std::vector<CheckpointRecord>> LoadCheckpoints(const std::string& job_id);
  // One job as last written (with stages, attempts and last_checkpoint), or nullopt when
  // it was never written; one worker likewise. The caller uses them to undo in-memory
  // changes whose Write() failed.
  absl::StatusOr<std::optional<JobRecord>> LoadJob(const std::string& job_id);
  absl::StatusOr<std::optional<WorkerRecord>> LoadWorker(const std::string& worker_id);

  const std::string& path() const { return path_; }

 private:
  Store(sqlite3* db, std::string path, StoreOptions options)
      : db_(db), path_(std::move(path)), options_(options) {}
  absl::Status Exec(const std::string& sql);
  absl::Status Migrate();
  // Writes the job row and the stage/attempt rows that differ from written_.
  absl::Status WriteJob(const JobRecord& job);
  // After a commit or a load: `job`'s rows as the file now holds them.
  void Remember(const JobRecord& job);
  struct Written {
    std::vector<StageRecord> stages;
    std::vector<AttemptRecord> attempts;
  };

  sqlite3* db_;
  std::string path_;
  StoreOptions options_;
  absl::Status sticky_error_;
  // The stage and attempt rows as last written or loaded, per job id (live jobs only;
  // a job missing here is written whole).
  std::map<std::string, Written> written_;
};

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_STORE_H_
