#include "coordinator/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/private_file.h"
#include "common/status.h"
#include "coordinator/backup.h"
#include "coordinator/store_schema.h"

namespace ulysses::coordinator {
namespace {

using store_schema::AttemptsTable;
using store_schema::BindRow;
using store_schema::CheckpointDirsTable;
using store_schema::CheckpointsTable;
using store_schema::EventsTable;
using store_schema::InsertSql;
using store_schema::JobsTable;
using store_schema::ReadAttempt;
using store_schema::ReadCheckpoint;
using store_schema::ReadCheckpointDir;
using store_schema::ReadEvent;
using store_schema::ReadJob;
using store_schema::ReadRow;
using store_schema::ReadStage;
using store_schema::ReadWorker;
using store_schema::SelectSql;
using store_schema::SqliteError;
using store_schema::StagesTable;
using store_schema::Stmt;
using store_schema::SubmitRequestsTable;
using store_schema::Table;
using store_schema::WorkersTable;

// True when SQLite refused the data itself (the primary result code is a constraint,
// a string or blob too big, a datatype mismatch, a bind index out of range): the write
// is wrong, not the disk. Every other failure counts as I/O.
bool IsRefusedData(const absl::Status& status) {
  switch (store_schema::SqliteResultCode(status) & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_TOOBIG:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
      return true;
    default:
      return false;
  }
}

// Runs a prepared statement of `sql` that binds `id` to its one parameter.
absl::Status RunWithId(sqlite3* db, const std::string& sql, const std::string& id) {
  Stmt q(db, sql);
  RETURN_IF_ERROR(q.status());
  q.Bind(1, id);
  return q.Run();
}

// Inserts (or replaces) one row of `table` per record.
template <typename R>
absl::Status InsertAll(sqlite3* db, const Table<R>& table, const std::vector<R>& records) {
  for (const R& record : records) {
    Stmt q(db, InsertSql(table));
    RETURN_IF_ERROR(q.status());
    BindRow(q, table, record);
    RETURN_IF_ERROR(q.Run());
  }
  return absl::OkStatus();
}

bool SameStage(const StageRecord& a, const StageRecord& b) {
  return a.index == b.index && a.state == b.state && a.seq_len == b.seq_len && a.steps == b.steps &&
         a.step == b.step && a.sp == b.sp && a.dp == b.dp && a.loss == b.loss &&
         a.tokens_per_s == b.tokens_per_s && a.eval_loss == b.eval_loss &&
         a.eval_accuracy == b.eval_accuracy && a.eval_seq_len == b.eval_seq_len &&
         a.attempts == b.attempts && a.started_ms == b.started_ms && a.finished_ms == b.finished_ms;
}

bool SameAttempt(const AttemptRecord& a, const AttemptRecord& b) {
  return a.generation == b.generation && a.stage == b.stage && a.worker_ids == b.worker_ids &&
         a.slots == b.slots && a.devices == b.devices && a.node_labels == b.node_labels &&
         a.master_addr == b.master_addr && a.master_port == b.master_port &&
         a.started_ms == b.started_ms && a.ended_ms == b.ended_ms && a.outcome == b.outcome &&
         a.exit_code == b.exit_code && a.reason == b.reason;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir, StoreOptions options) {
  // Owner-only, like every file in it (docs/SECURITY.md).
  if (absl::Status s = EnsurePrivateDir(dir); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("state ", s.message()));
  }
  std::string path = dir + "/coordinator.db";
  // The store holds every spec, path and log: owner-only. SQLite gives its -wal and -shm
  // files the database file's mode, so creating (or tightening) it 0600 covers all three.
  if (int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600); fd >= 0) {
    (void)::fchmod(fd, 0600);
    ::close(fd);
  }
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("open ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<Store> store(new Store(db, path, options));
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA foreign_keys=ON"));
  RETURN_IF_ERROR(store->Migrate());
  if (options.max_bytes > 0) {
    int64_t page_size = 4096;
    {
      Stmt q(db, "PRAGMA page_size");
      RETURN_IF_ERROR(q.status());
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (row) page_size = std::max<int64_t>(512, q.Int(0));
    }
    RETURN_IF_ERROR(store->Exec(absl::StrCat("PRAGMA max_page_count=",
                                             std::max<int64_t>(1, options.max_bytes / page_size))));
  }
  return store;
}

absl::Status Store::Probe() {
  if (sticky_error_.ok()) return absl::OkStatus();
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (s.ok()) {
    // Headroom (a tiny write may fit where the failed change cannot): take and give back
    // as much as the largest record (a job of kProbeHeadroomBytes of spec).
    s = Exec(absl::StrCat("INSERT OR REPLACE INTO meta(key, value) VALUES('probe', zeroblob(",
                          kProbeHeadroomBytes, "))"));
    if (s.ok()) s = Exec("DELETE FROM meta WHERE key='probe'");
    if (s.ok()) {
      s = Exec(absl::StrCat("INSERT OR REPLACE INTO meta(key, value) VALUES('last_probe_ms', '",
                            absl::ToUnixMillis(absl::Now()), "')"));
    }
    if (s.ok()) s = Exec("COMMIT");
    if (!s.ok()) (void)Exec("ROLLBACK");
  }
  if (s.ok()) sticky_error_ = absl::OkStatus();
  return s;
}

Store::~Store() { sqlite3_close(db_); }

absl::Status Store::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown";
    sqlite3_free(err);
    return SqliteError(sqlite3_extended_errcode(db_), "exec",
                       absl::StrCat(msg, " (in: ", sql.substr(0, 60), ")"));
  }
  return absl::OkStatus();
}

absl::Status Store::Migrate() {
  RETURN_IF_ERROR(Exec(store_schema::CreateTableSql(store_schema::MetaTable(), kSchemaVersion)));
  int version = 0;
  {
    Stmt q(db_, "SELECT value FROM meta WHERE key='schema_version'");
    RETURN_IF_ERROR(q.status());
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) version = std::stoi(q.Text(0));
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": schema version ", version, " is newer than this coordinator's ",
                     kSchemaVersion, " (run a newer ulysses-coordinator)"));
  }
  if (version == kSchemaVersion) return absl::OkStatus();
  if (version >= 1) {
    // The rollback point of an upgrade (restore --rollback-to-backup): the file as the
    // previous coordinator left it. No backup, no migration.
    const std::string backup = MigrationBackupPath(path_, version);
    absl::StatusOr<BackupInfo> made = CopyVerified(db_, path_, backup);
    if (!made.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, ": cannot back up schema version ", version,
                       " before migrating it to ", kSchemaVersion, ": ", made.status().message(),
                       " (free space in the state dir, or restore a backup)"));
    }
    ULOG(INFO) << path_ << ": schema version " << version << " backed up to " << backup << " ("
               << made->bytes << " bytes) before migrating to " << kSchemaVersion;
  }
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  for (const std::string& sql : store_schema::MigrationSteps(version, kSchemaVersion)) {
    if (absl::Status s = Exec(sql); !s.ok()) {
      (void)Exec("ROLLBACK");
      return s;
    }
  }
  RETURN_IF_ERROR(Exec(absl::StrCat(
      "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '", kSchemaVersion, "')")));
  return Exec("COMMIT");
}

absl::Status Store::WriteJob(const JobRecord& j) {
  {
    Stmt q(db_, InsertSql(JobsTable()));
    RETURN_IF_ERROR(q.status());
    BindRow(q, JobsTable(), j);
    RETURN_IF_ERROR(q.Run());
  }
  if (!j.request_id.empty()) {
    const auto& table = SubmitRequestsTable();
    Stmt r(db_, InsertSql(table, "OR IGNORE"));
    RETURN_IF_ERROR(r.status());
    BindRow(r, table, j);
    RETURN_IF_ERROR(r.Run());
  }
  auto last = written_.find(j.id);
  const Written* before = last == written_.end() ? nullptr : &last->second;
  for (size_t idx = 0; idx < j.stages.size(); ++idx) {
    const StageRecord& s = j.stages[idx];
    if (before != nullptr && idx < before->stages.size() && SameStage(before->stages[idx], s)) {
      continue;
    }
    Stmt st(db_, InsertSql(StagesTable()));
    RETURN_IF_ERROR(st.status());
    BindRow(st, StagesTable(), s, j.id);
    RETURN_IF_ERROR(st.Run());
  }
  for (size_t idx = 0; idx < j.attempts.size(); ++idx) {
    const AttemptRecord& a = j.attempts[idx];
    if (before != nullptr && idx < before->attempts.size() &&
        SameAttempt(before->attempts[idx], a)) {
      continue;
    }
    Stmt st(db_, InsertSql(AttemptsTable()));
    RETURN_IF_ERROR(st.status());
    BindRow(st, AttemptsTable(), a, j.id);
    RETURN_IF_ERROR(st.Run());
  }
  return absl::OkStatus();
}

void Store::Remember(const JobRecord& job) {
  if (job.terminal()) {
    written_.erase(job.id);  // Rarely written again; a resume writes it whole once.
  } else {
    written_[job.id] = Written{job.stages, job.attempts};
  }
}

absl::Status Store::Write(const Batch& batch) {
  if (!sticky_error_.ok()) return sticky_error_;
  if (batch.empty()) return absl::OkStatus();
  auto body = [&]() -> absl::Status {
    for (const JobRecord& j : batch.jobs) RETURN_IF_ERROR(WriteJob(j));
    if (!batch.deleted_jobs.empty()) {
      // Job numbers are never reused (a new job must not get a deleted job's id, nor its
      // default checkpoint directory, which stays on disk): keep the high-water mark.
      RETURN_IF_ERROR(
          Exec("INSERT OR REPLACE INTO meta(key, value) VALUES('max_job_number', max("
               "COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key='max_job_number'), 0), "
               "COALESCE((SELECT MAX(number) FROM jobs), 0)))"));
    }
    for (const std::string& id : batch.deleted_jobs) {
      for (const char* sql :
           {"DELETE FROM jobs WHERE id=?", "DELETE FROM stages WHERE job_id=?",
            "DELETE FROM attempts WHERE job_id=?", "DELETE FROM checkpoints WHERE job_id=?",
            "DELETE FROM events WHERE job_id=?", "DELETE FROM submit_requests WHERE job_id=?"}) {
        RETURN_IF_ERROR(RunWithId(db_, sql, id));
      }
    }
    for (const std::string& id : batch.deleted_workers) {
      RETURN_IF_ERROR(RunWithId(db_, "DELETE FROM workers WHERE id=?", id));
    }
    RETURN_IF_ERROR(InsertAll(db_, WorkersTable(), batch.workers));
    RETURN_IF_ERROR(InsertAll(db_, CheckpointsTable(), batch.checkpoints));
    RETURN_IF_ERROR(InsertAll(db_, EventsTable(), batch.events));
    RETURN_IF_ERROR(InsertAll(db_, CheckpointDirsTable(), batch.checkpoint_dirs));
    if (options_.events_per_job > 0) {
      std::map<std::string, int64_t> newest;  // job id -> highest sequence written now.
      for (const EventRecord& e : batch.events) {
        newest[e.job_id] = std::max(newest[e.job_id], e.sequence);
      }
      for (const auto& [job_id, sequence] : newest) {
        Stmt q(db_, "DELETE FROM events WHERE job_id=? AND sequence<=?");
        RETURN_IF_ERROR(q.status());
        q.Bind(1, job_id).Bind(2, sequence - options_.events_per_job);
        RETURN_IF_ERROR(q.Run());
      }
    }
    return absl::OkStatus();
  };
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (s.ok()) {
    s = body();
    if (s.ok()) s = Exec("COMMIT");
    if (!s.ok()) (void)Exec("ROLLBACK");  // Also after a failed COMMIT: nothing stays open.
  }
  if (s.ok()) {
    for (const JobRecord& j : batch.jobs) Remember(j);
    return s;
  }
  // Rolled back: what the rows hold is no longer known here; write those jobs whole next.
  for (const JobRecord& j : batch.jobs) written_.erase(j.id);
  if (IsRefusedData(s)) {
    return absl::InternalError(
        absl::StrCat("state store refused the write (nothing was written; the store stays "
                     "writable): ",
                     s.message()));
  }
  sticky_error_ = absl::UnavailableError(
      absl::StrCat("state store write failed (store now read-only): ", s.message()));
  return sticky_error_;
}

namespace {

// Steps through the rows of `q` (bound already), calling `fn` (returns a Status) on each.
template <typename Fn>
absl::Status ForEachRow(Stmt& q, Fn fn) {
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return absl::OkStatus();
    RETURN_IF_ERROR(fn());
  }
}

// Reads every row of `q` with `read` (a store_schema reader) into `out`.
template <typename R>
absl::Status ReadAll(Stmt& q, absl::StatusOr<R> (*read)(Stmt&), std::vector<R>& out) {
  return ForEachRow(q, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(R record, read(q));
    out.push_back(std::move(record));
    return absl::OkStatus();
  });
}

}  // namespace

absl::StatusOr<Store::Snapshot> Store::Load() {
  Snapshot snap;
  std::map<std::string, size_t> index;
  {
    Stmt q(db_, SelectSql(JobsTable()) + " ORDER BY number");
    RETURN_IF_ERROR(q.status());
    RETURN_IF_ERROR(ReadAll(q, &ReadJob, snap.jobs));
    for (size_t i = 0; i < snap.jobs.size(); ++i) {
      snap.max_job_number = std::max(snap.max_job_number, snap.jobs[i].number);
      index[snap.jobs[i].id] = i;
    }
  }
  {
    Stmt q(db_, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='max_job_number'");
    RETURN_IF_ERROR(q.status());
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) snap.max_job_number = std::max(snap.max_job_number, q.Int(0));
  }
  {
    Stmt q(db_, SelectSql(CheckpointDirsTable()) + " ORDER BY path");
    RETURN_IF_ERROR(q.status());
    RETURN_IF_ERROR(ReadAll(q, &ReadCheckpointDir, snap.checkpoint_dirs));
    for (const CheckpointDirRecord& d : snap.checkpoint_dirs) {
      snap.max_job_number = std::max(snap.max_job_number, d.number);
    }
  }
  // The job a row of stages or attempts belongs to (nullptr: none loaded).
  auto job_of = [&](Stmt& q, int job_id_column) -> JobRecord* {
    auto it = index.find(q.Text(job_id_column));
    return it == index.end() ? nullptr : &snap.jobs[it->second];
  };
  {
    const int job_id = StagesTable().Index("job_id");
    Stmt q(db_, SelectSql(StagesTable()) + " ORDER BY job_id, idx");
    RETURN_IF_ERROR(q.status());
    RETURN_IF_ERROR(ForEachRow(q, [&]() -> absl::Status {
      JobRecord* job = job_of(q, job_id);
      if (job == nullptr) return absl::OkStatus();
      ASSIGN_OR_RETURN(StageRecord stage, ReadStage(q));
      job->stages.push_back(std::move(stage));
      return absl::OkStatus();
    }));
  }
  {
    const int job_id = AttemptsTable().Index("job_id");
    Stmt q(db_, SelectSql(AttemptsTable()) + " ORDER BY job_id, generation");
    RETURN_IF_ERROR(q.status());
    RETURN_IF_ERROR(ForEachRow(q, [&]() -> absl::Status {
      JobRecord* job = job_of(q, job_id);
      if (job == nullptr) return absl::OkStatus();
      ASSIGN_OR_RETURN(AttemptRecord attempt, ReadAttempt(q));
      job->attempts.push_back(std::move(attempt));
      return absl::OkStatus();
    }));
  }
  {
    Stmt q(db_, SelectSql(SubmitRequestsTable()));
    RETURN_IF_ERROR(q.status());
    RETURN_IF_ERROR(ForEachRow(q, [&]() -> absl::Status {
      JobRecord request;  // Its id (job_id), request_id and request_hash.
      RETURN_IF_ERROR(ReadRow(q, SubmitRequestsTable(), request));
      auto it = index.find(request.id);
      if (it == index.end()) return absl::OkStatus();
      snap.jobs[it->second].request_id = request.request_id;
      snap.jobs[it->second].request_hash = request.request_hash;
      return absl::OkStatus();
    }));
  }
  for (JobRecord& j : snap.jobs) {
    ASSIGN_OR_RETURN(std::vector<CheckpointRecord> cks, LoadCheckpoints(j.id));
    if (!cks.empty()) j.last_checkpoint = cks.back();
    Remember(j);
  }
  {
    Stmt q(db_, SelectSql(WorkersTable()) + " ORDER BY name");
    RETURN_IF_ERROR(q.status());
    RETURN_IF_ERROR(ReadAll(q, &ReadWorker, snap.workers));
  }
  return snap;
}

absl::StatusOr<std::optional<JobRecord>> Store::LoadJob(const std::string& job_id) {
  std::optional<JobRecord> job;
  {
    Stmt q(db_, SelectSql(JobsTable()) + " WHERE id=?");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id);
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return job;
    ASSIGN_OR_RETURN(job, ReadJob(q));
  }
  {
    Stmt q(db_, SelectSql(StagesTable()) + " WHERE job_id=? ORDER BY idx");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id);
    RETURN_IF_ERROR(ReadAll(q, &ReadStage, job->stages));
  }
  {
    Stmt q(db_, SelectSql(AttemptsTable()) + " WHERE job_id=? ORDER BY generation");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id);
    RETURN_IF_ERROR(ReadAll(q, &ReadAttempt, job->attempts));
  }
  {
    Stmt q(db_, SelectSql(SubmitRequestsTable()) + " WHERE job_id=?");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id);
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) {
      JobRecord request;
      RETURN_IF_ERROR(ReadRow(q, SubmitRequestsTable(), request));
      job->request_id = request.request_id;
      job->request_hash = request.request_hash;
    }
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointRecord> cks, LoadCheckpoints(job_id));
  if (!cks.empty()) job->last_checkpoint = cks.back();
  Remember(*job);
  return job;
}

absl::StatusOr<std::optional<WorkerRecord>> Store::LoadWorker(const std::string& worker_id) {
  Stmt q(db_, SelectSql(WorkersTable()) + " WHERE id=?");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, worker_id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<WorkerRecord>();
  ASSIGN_OR_RETURN(WorkerRecord worker, ReadWorker(q));
  return std::optional<WorkerRecord>(std::move(worker));
}

absl::StatusOr<std::vector<EventRecord>> Store::LoadEvents(const std::string& job_id, int limit) {
  // The newest `limit`, in sequence order (the outer SELECT keeps the inner's columns).
  Stmt q(db_, absl::StrCat("SELECT * FROM (", SelectSql(EventsTable()),
                           " WHERE job_id=? ORDER BY sequence DESC LIMIT ?) ORDER BY sequence"));
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id).Bind(2, limit);
  std::vector<EventRecord> out;
  RETURN_IF_ERROR(ReadAll(q, &ReadEvent, out));
  return out;
}

absl::StatusOr<std::vector<CheckpointRecord>> Store::LoadCheckpoints(const std::string& job_id) {
  Stmt q(db_, SelectSql(CheckpointsTable()) + " WHERE job_id=? ORDER BY committed_ms, stage, step");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id);
  std::vector<CheckpointRecord> out;
  RETURN_IF_ERROR(ReadAll(q, &ReadCheckpoint, out));
  return out;
}

}  // namespace ulysses::coordinator
