#include "coordinator/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/backup.h"
#include "coordinator/failure_budget.h"

namespace ulysses::coordinator {
namespace {

// The SQLite result code of a failed call travels with its status as this payload, so
// Write() can tell refused data from an I/O failure after the statement is gone.
constexpr char kSqliteCodeUrl[] = "type.ulysses/sqlite.result_code";

absl::Status SqliteError(int rc, absl::string_view what, absl::string_view message) {
  absl::Status status = absl::InternalError(absl::StrCat("sqlite ", what, ": ", message));
  status.SetPayload(kSqliteCodeUrl, absl::Cord(absl::StrCat(rc)));
  return status;
}

// True when SQLite refused the data itself (the primary result code is a constraint,
// a string or blob too big, a datatype mismatch, a bind index out of range): the write
// is wrong, not the disk. Every other failure counts as I/O.
bool IsRefusedData(const absl::Status& status) {
  auto payload = status.GetPayload(kSqliteCodeUrl);  // absl::optional<absl::Cord>
  int rc = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &rc)) return false;
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_TOOBIG:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
      return true;
    default:
      return false;
  }
}

// RAII prepared statement with 1-based positional binds and 0-based column reads.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  absl::Status status() const {
    if (rc_ == SQLITE_OK) return absl::OkStatus();
    return SqliteError(sqlite3_extended_errcode(db_), "prepare", sqlite3_errmsg(db_));
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // SQLITE_ROW -> true, SQLITE_DONE -> false, else error.
  absl::StatusOr<bool> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(sqlite3_extended_errcode(db_), "step", sqlite3_errmsg(db_));
  }
  absl::Status Run() {
    RETURN_IF_ERROR(status());
    ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return absl::OkStatus();
  }
  int64_t Int(int c) { return sqlite3_column_int64(stmt_, c); }
  double Double(int c) { return sqlite3_column_double(stmt_, c); }
  std::string Text(int c) {
    const void* p = sqlite3_column_blob(stmt_, c);
    int n = sqlite3_column_bytes(stmt_, c);
    return p ? std::string(static_cast<const char*>(p), n) : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

constexpr const char* kSchemaV1[] = {
    R"sql(CREATE TABLE IF NOT EXISTS jobs (
      id TEXT PRIMARY KEY, number INTEGER NOT NULL, name TEXT NOT NULL, spec_yaml TEXT NOT NULL,
      state INTEGER NOT NULL, reason TEXT NOT NULL, priority INTEGER NOT NULL,
      created_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER NOT NULL,
      state_entered_ms INTEGER NOT NULL, stage_index INTEGER NOT NULL, generation INTEGER NOT NULL,
      restarts INTEGER NOT NULL, preemptions INTEGER NOT NULL, failures INTEGER NOT NULL,
      preemptions_budget_used INTEGER NOT NULL, max_failures INTEGER NOT NULL,
      max_preemptions INTEGER NOT NULL, node_label TEXT NOT NULL, checkpoint_dir TEXT NOT NULL,
      out_dir TEXT NOT NULL, loss REAL NOT NULL, not_before_ms INTEGER NOT NULL))sql",
    R"sql(CREATE TABLE IF NOT EXISTS stages (
      job_id TEXT NOT NULL, idx INTEGER NOT NULL, state INTEGER NOT NULL, seq_len INTEGER NOT NULL,
      steps INTEGER NOT NULL, step INTEGER NOT NULL, sp INTEGER NOT NULL, dp INTEGER NOT NULL,
      loss REAL NOT NULL, tokens_per_s REAL NOT NULL, eval_loss REAL NOT NULL,
      eval_accuracy REAL NOT NULL, eval_seq_len INTEGER NOT NULL, attempts INTEGER NOT NULL,
      started_ms INTEGER NOT NULL, finished_ms INTEGER NOT NULL, PRIMARY KEY (job_id, idx)))sql",
    R"sql(CREATE TABLE IF NOT EXISTS attempts (
      job_id TEXT NOT NULL, generation INTEGER NOT NULL, stage INTEGER NOT NULL,
      worker_ids TEXT NOT NULL, master_addr TEXT NOT NULL, master_port INTEGER NOT NULL,
      started_ms INTEGER NOT NULL, ended_ms INTEGER NOT NULL, outcome INTEGER NOT NULL,
      exit_code INTEGER NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (job_id, generation)))sql",
    R"sql(CREATE TABLE IF NOT EXISTS workers (
      id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, node_label TEXT NOT NULL,
      device TEXT NOT NULL, host TEXT NOT NULL, capacity INTEGER NOT NULL,
      registered_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL))sql",
    R"sql(CREATE TABLE IF NOT EXISTS checkpoints (
      job_id TEXT NOT NULL, generation INTEGER NOT NULL, stage INTEGER NOT NULL,
      step INTEGER NOT NULL, path TEXT NOT NULL, bytes INTEGER NOT NULL, seconds REAL NOT NULL,
      committed_ms INTEGER NOT NULL, PRIMARY KEY (job_id, stage, step)))sql",
    R"sql(CREATE TABLE IF NOT EXISTS events (
      job_id TEXT NOT NULL, sequence INTEGER NOT NULL, time_ms INTEGER NOT NULL,
      payload BLOB NOT NULL, PRIMARY KEY (job_id, sequence)))sql",
};

// Version 2 (appended columns: SELECT * keeps v1's first). Older jobs: no owner/tenant (admins).
constexpr const char* kSchemaV2[] = {
    "ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE workers ADD COLUMN identity TEXT NOT NULL DEFAULT ''",
};

// Version 3: the request ids of idempotent submissions (one per job at most).
constexpr const char* kSchemaV3[] = {
    R"sql(CREATE TABLE IF NOT EXISTS submit_requests (
      request_id TEXT PRIMARY KEY, job_id TEXT NOT NULL UNIQUE, request_hash TEXT NOT NULL))sql",
};

// Version 4: failure budgets by kind (coordinator/failure_budget.h) and the preemption
// opt-out. Older jobs get the spec defaults.
constexpr const char* kSchemaV4[] = {
    "ALTER TABLE jobs ADD COLUMN infra_failures INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN max_infra_failures INTEGER NOT NULL DEFAULT 20",
    "ALTER TABLE jobs ADD COLUMN failure_window_s INTEGER NOT NULL DEFAULT 86400",
    "ALTER TABLE jobs ADD COLUMN recent_failures TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE jobs ADD COLUMN preemptible INTEGER NOT NULL DEFAULT 1",
};

// Version 5: multi-slot workers (one slot per device): each rank's slot, device and node
// label in an attempt ("" = slot 0 for every rank, as before; device and label unknown) and
// each worker's devices ("" = one slot on `device`).
constexpr const char* kSchemaV5[] = {
    "ALTER TABLE attempts ADD COLUMN slots TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE attempts ADD COLUMN devices TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE attempts ADD COLUMN node_labels TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE workers ADD COLUMN devices TEXT NOT NULL DEFAULT ''",
};

// Version 6: goodput accounting (coordinator/goodput.h; '' = zeros: before accounting).
constexpr const char* kSchemaV6[] = {
    "ALTER TABLE jobs ADD COLUMN goodput TEXT NOT NULL DEFAULT ''"};

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
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("state dir \"", dir, "\": cannot create (", ec.message(), ")"));
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
  RETURN_IF_ERROR(Exec("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)"));
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
  std::vector<const char*> steps;
  if (version < 1) steps.insert(steps.end(), std::begin(kSchemaV1), std::end(kSchemaV1));
  if (version < 2) steps.insert(steps.end(), std::begin(kSchemaV2), std::end(kSchemaV2));
  if (version < 3) steps.insert(steps.end(), std::begin(kSchemaV3), std::end(kSchemaV3));
  if (version < 4) steps.insert(steps.end(), std::begin(kSchemaV4), std::end(kSchemaV4));
  if (version < 5) steps.insert(steps.end(), std::begin(kSchemaV5), std::end(kSchemaV5));
  if (version < 6) steps.insert(steps.end(), std::begin(kSchemaV6), std::end(kSchemaV6));
  for (const char* sql : steps) {
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
  Stmt q(db_,
         "INSERT OR REPLACE INTO jobs "
         "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  RETURN_IF_ERROR(q.status());
  int i = 1;
  q.Bind(i++, j.id);
  q.Bind(i++, j.number);
  q.Bind(i++, j.name);
  q.Bind(i++, j.spec_yaml);
  q.Bind(i++, static_cast<int>(j.state));
  q.Bind(i++, j.reason);
  q.Bind(i++, j.priority);
  q.Bind(i++, j.created_ms);
  q.Bind(i++, j.started_ms);
  q.Bind(i++, j.finished_ms);
  q.Bind(i++, j.state_entered_ms);
  q.Bind(i++, j.stage_index);
  q.Bind(i++, j.generation);
  q.Bind(i++, j.restarts);
  q.Bind(i++, j.preemptions);
  q.Bind(i++, j.failures);
  q.Bind(i++, j.preemptions_budget_used);
  q.Bind(i++, j.max_failures);
  q.Bind(i++, j.max_preemptions);
  q.Bind(i++, j.node_label);
  q.Bind(i++, j.checkpoint_dir);
  q.Bind(i++, j.out_dir);
  q.Bind(i++, j.loss);
  q.Bind(i++, j.not_before_ms);
  q.Bind(i++, j.owner);
  q.Bind(i++, j.tenant);
  q.Bind(i++, j.infra_failures);
  q.Bind(i++, j.max_infra_failures);
  q.Bind(i++, j.failure_window_s);
  q.Bind(i++, EncodeFailureMarks(j.recent_failures));
  q.Bind(i++, j.preemptible ? 1 : 0);
  q.Bind(i++, EncodeGoodput(j.goodput));
  RETURN_IF_ERROR(q.Run());
  if (!j.request_id.empty()) {
    Stmt r(db_, "INSERT OR IGNORE INTO submit_requests VALUES(?,?,?)");
    RETURN_IF_ERROR(r.status());
    r.Bind(1, j.request_id).Bind(2, j.id).Bind(3, j.request_hash);
    RETURN_IF_ERROR(r.Run());
  }
  auto last = written_.find(j.id);
  const Written* before = last == written_.end() ? nullptr : &last->second;
  for (size_t idx = 0; idx < j.stages.size(); ++idx) {
    const StageRecord& s = j.stages[idx];
    if (before != nullptr && idx < before->stages.size() && SameStage(before->stages[idx], s)) {
      continue;
    }
    Stmt st(db_, "INSERT OR REPLACE INTO stages VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    RETURN_IF_ERROR(st.status());
    int k = 1;
    st.Bind(k++, j.id);
    st.Bind(k++, s.index);
    st.Bind(k++, static_cast<int>(s.state));
    st.Bind(k++, s.seq_len);
    st.Bind(k++, s.steps);
    st.Bind(k++, s.step);
    st.Bind(k++, s.sp);
    st.Bind(k++, s.dp);
    st.Bind(k++, s.loss);
    st.Bind(k++, s.tokens_per_s);
    st.Bind(k++, s.eval_loss);
    st.Bind(k++, s.eval_accuracy);
    st.Bind(k++, s.eval_seq_len);
    st.Bind(k++, s.attempts);
    st.Bind(k++, s.started_ms);
    st.Bind(k++, s.finished_ms);
    RETURN_IF_ERROR(st.Run());
  }
  for (size_t idx = 0; idx < j.attempts.size(); ++idx) {
    const AttemptRecord& a = j.attempts[idx];
    if (before != nullptr && idx < before->attempts.size() &&
        SameAttempt(before->attempts[idx], a)) {
      continue;
    }
    Stmt st(db_, "INSERT OR REPLACE INTO attempts VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    RETURN_IF_ERROR(st.status());
    int k = 1;
    st.Bind(k++, j.id);
    st.Bind(k++, a.generation);
    st.Bind(k++, a.stage);
    st.Bind(k++, absl::StrJoin(a.worker_ids, ","));
    st.Bind(k++, a.master_addr);
    st.Bind(k++, a.master_port);
    st.Bind(k++, a.started_ms);
    st.Bind(k++, a.ended_ms);
    st.Bind(k++, static_cast<int>(a.outcome));
    st.Bind(k++, a.exit_code);
    st.Bind(k++, a.reason);
    st.Bind(k++, absl::StrJoin(a.slots, ","));
    st.Bind(k++, absl::StrJoin(a.devices, ","));
    st.Bind(k++, absl::StrJoin(a.node_labels, ","));
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
          Exec("INSERT OR REPLACE INTO meta VALUES('max_job_number', max("
               "COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key='max_job_number'), 0), "
               "COALESCE((SELECT MAX(number) FROM jobs), 0)))"));
    }
    for (const std::string& id : batch.deleted_jobs) {
      for (const char* sql :
           {"DELETE FROM jobs WHERE id=?", "DELETE FROM stages WHERE job_id=?",
            "DELETE FROM attempts WHERE job_id=?", "DELETE FROM checkpoints WHERE job_id=?",
            "DELETE FROM events WHERE job_id=?", "DELETE FROM submit_requests WHERE job_id=?"}) {
        Stmt q(db_, sql);
        RETURN_IF_ERROR(q.status());
        q.Bind(1, id);
        RETURN_IF_ERROR(q.Run());
      }
    }
    for (const std::string& id : batch.deleted_workers) {
      Stmt q(db_, "DELETE FROM workers WHERE id=?");
      RETURN_IF_ERROR(q.status());
      q.Bind(1, id);
      RETURN_IF_ERROR(q.Run());
    }
    for (const WorkerRecord& w : batch.workers) {
      Stmt q(db_, "INSERT OR REPLACE INTO workers VALUES(?,?,?,?,?,?,?,?,?,?)");
      RETURN_IF_ERROR(q.status());
      q.Bind(1, w.id).Bind(2, w.name).Bind(3, w.node_label).Bind(4, w.device).Bind(5, w.host);
      q.Bind(6, w.capacity).Bind(7, w.registered_ms).Bind(8, w.last_seen_ms).Bind(9, w.identity);
      q.Bind(10, absl::StrJoin(w.devices, ","));
      RETURN_IF_ERROR(q.Run());
    }
    for (const CheckpointRecord& c : batch.checkpoints) {
      Stmt q(db_, "INSERT OR REPLACE INTO checkpoints VALUES(?,?,?,?,?,?,?,?)");
      RETURN_IF_ERROR(q.status());
      q.Bind(1, c.job_id).Bind(2, c.generation).Bind(3, c.stage).Bind(4, c.step);
      q.Bind(5, c.path).Bind(6, c.bytes).Bind(7, c.seconds).Bind(8, c.committed_ms);
      RETURN_IF_ERROR(q.Run());
    }
    for (const EventRecord& e : batch.events) {
      Stmt q(db_, "INSERT OR REPLACE INTO events VALUES(?,?,?,?)");
      RETURN_IF_ERROR(q.status());
      q.Bind(1, e.job_id).Bind(2, e.sequence).Bind(3, e.time_ms).BindBlob(4, e.payload);
      RETURN_IF_ERROR(q.Run());
    }
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

// Row readers: one per table, columns in schema order (SELECT *).
absl::StatusOr<JobRecord> ReadJobRow(Stmt& q) {
  JobRecord j;
  int c = 0;
  j.id = q.Text(c++);
  j.number = q.Int(c++);
  j.name = q.Text(c++);
  j.spec_yaml = q.Text(c++);
  j.state = static_cast<v1::JobState>(q.Int(c++));
  j.reason = q.Text(c++);
  j.priority = q.Int(c++);
  j.created_ms = q.Int(c++);
  j.started_ms = q.Int(c++);
  j.finished_ms = q.Int(c++);
  j.state_entered_ms = q.Int(c++);
  j.stage_index = static_cast<int>(q.Int(c++));
  j.generation = q.Int(c++);
  j.restarts = static_cast<int>(q.Int(c++));
  j.preemptions = static_cast<int>(q.Int(c++));
  j.failures = static_cast<int>(q.Int(c++));
  j.preemptions_budget_used = static_cast<int>(q.Int(c++));
  j.max_failures = static_cast<int>(q.Int(c++));
  j.max_preemptions = static_cast<int>(q.Int(c++));
  j.node_label = q.Text(c++);
  j.checkpoint_dir = q.Text(c++);
  j.out_dir = q.Text(c++);
  j.loss = q.Double(c++);
  j.not_before_ms = q.Int(c++);
  j.owner = q.Text(c++);
  j.tenant = q.Text(c++);
  j.infra_failures = static_cast<int>(q.Int(c++));
  j.max_infra_failures = static_cast<int>(q.Int(c++));
  j.failure_window_s = q.Int(c++);
  ASSIGN_OR_RETURN(j.recent_failures, DecodeFailureMarks(q.Text(c++)));
  j.preemptible = q.Int(c++) != 0;
  ASSIGN_OR_RETURN(j.goodput, DecodeGoodput(q.Text(c++)));
  return j;
}

StageRecord ReadStageRow(Stmt& q) {  // Column 0 is job_id.
  StageRecord s;
  int c = 1;
  s.index = static_cast<int>(q.Int(c++));
  s.state = static_cast<v1::StageState>(q.Int(c++));
  s.seq_len = q.Int(c++);
  s.steps = q.Int(c++);
  s.step = q.Int(c++);
  s.sp = static_cast<int>(q.Int(c++));
  s.dp = static_cast<int>(q.Int(c++));
  s.loss = q.Double(c++);
  s.tokens_per_s = q.Double(c++);
  s.eval_loss = q.Double(c++);
  s.eval_accuracy = q.Double(c++);
  s.eval_seq_len = q.Int(c++);
  s.attempts = static_cast<int>(q.Int(c++));
  s.started_ms = q.Int(c++);
  s.finished_ms = q.Int(c++);
  return s;
}

AttemptRecord ReadAttemptRow(Stmt& q) {  // Column 0 is job_id.
  AttemptRecord a;
  int c = 1;
  a.generation = q.Int(c++);
  a.stage = static_cast<int>(q.Int(c++));
  std::string ids = q.Text(c++);
  if (!ids.empty()) a.worker_ids = absl::StrSplit(ids, ',');
  a.master_addr = q.Text(c++);
  a.master_port = static_cast<int>(q.Int(c++));
  a.started_ms = q.Int(c++);
  a.ended_ms = q.Int(c++);
  a.outcome = static_cast<v1::AttemptOutcome>(q.Int(c++));
  a.exit_code = static_cast<int>(q.Int(c++));
  a.reason = q.Text(c++);
  // Rows from before schema 5 have no slots: every rank ran on slot 0 of its worker.
  a.slots.assign(a.worker_ids.size(), 0);
  const std::string slots = q.Text(c++);
  if (!slots.empty()) {
    std::vector<std::string> parts = absl::StrSplit(slots, ',');
    for (size_t r = 0; r < parts.size() && r < a.slots.size(); ++r) {
      if (!absl::SimpleAtoi(parts[r], &a.slots[r])) a.slots[r] = 0;
    }
  }
  for (std::vector<std::string>* list : {&a.devices, &a.node_labels}) {
    const std::string text = q.Text(c++);
    if (!text.empty()) *list = absl::StrSplit(text, ',');
  }
  return a;
}

WorkerRecord ReadWorkerRow(Stmt& q) {
  WorkerRecord w;
  w.id = q.Text(0);
  w.name = q.Text(1);
  w.node_label = q.Text(2);
  w.device = q.Text(3);
  w.host = q.Text(4);
  w.capacity = static_cast<int>(q.Int(5));
  w.registered_ms = q.Int(6);
  w.last_seen_ms = q.Int(7);
  w.identity = q.Text(8);
  const std::string devices = q.Text(9);
  if (!devices.empty()) w.devices = absl::StrSplit(devices, ',');
  if (w.devices.empty()) w.devices.assign(std::max(1, w.capacity), w.device);
  return w;
}

}  // namespace

absl::StatusOr<Store::Snapshot> Store::Load() {
  Snapshot snap;
  std::map<std::string, size_t> index;
  {
    Stmt q(db_, "SELECT * FROM jobs ORDER BY number");
    RETURN_IF_ERROR(q.status());
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      ASSIGN_OR_RETURN(JobRecord j, ReadJobRow(q));
      snap.max_job_number = std::max(snap.max_job_number, j.number);
      index[j.id] = snap.jobs.size();
      snap.jobs.push_back(std::move(j));
    }
  }
  {
    Stmt q(db_, "SELECT CAST(value AS INTEGER) FROM meta WHERE key='max_job_number'");
    RETURN_IF_ERROR(q.status());
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) snap.max_job_number = std::max(snap.max_job_number, q.Int(0));
  }
  {
    Stmt q(db_, "SELECT * FROM stages ORDER BY job_id, idx");
    RETURN_IF_ERROR(q.status());
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      auto it = index.find(q.Text(0));
      if (it == index.end()) continue;
      snap.jobs[it->second].stages.push_back(ReadStageRow(q));
    }
  }
  {
    Stmt q(db_, "SELECT * FROM attempts ORDER BY job_id, generation");
    RETURN_IF_ERROR(q.status());
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      auto it = index.find(q.Text(0));
      if (it == index.end()) continue;
      snap.jobs[it->second].attempts.push_back(ReadAttemptRow(q));
    }
  }
  {
    Stmt q(db_, "SELECT job_id, request_id, request_hash FROM submit_requests");
    RETURN_IF_ERROR(q.status());
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      auto it = index.find(q.Text(0));
      if (it == index.end()) continue;
      snap.jobs[it->second].request_id = q.Text(1);
      snap.jobs[it->second].request_hash = q.Text(2);
    }
  }
  for (JobRecord& j : snap.jobs) {
    ASSIGN_OR_RETURN(std::vector<CheckpointRecord> cks, LoadCheckpoints(j.id));
    if (!cks.empty()) j.last_checkpoint = cks.back();
    Remember(j);
  }
  {
    Stmt q(db_, "SELECT * FROM workers ORDER BY name");
    RETURN_IF_ERROR(q.status());
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      snap.workers.push_back(ReadWorkerRow(q));
    }
  }
  return snap;
}

absl::StatusOr<std::optional<JobRecord>> Store::LoadJob(const std::string& job_id) {
  std::optional<JobRecord> job;
  {
    Stmt q(db_, "SELECT * FROM jobs WHERE id=?");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id);
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return job;
    ASSIGN_OR_RETURN(job, ReadJobRow(q));
  }
  {
    Stmt q(db_, "SELECT * FROM stages WHERE job_id=? ORDER BY idx");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id);
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      job->stages.push_back(ReadStageRow(q));
    }
  }
  {
    Stmt q(db_, "SELECT * FROM attempts WHERE job_id=? ORDER BY generation");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id);
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      job->attempts.push_back(ReadAttemptRow(q));
    }
  }
  {
    Stmt q(db_, "SELECT request_id, request_hash FROM submit_requests WHERE job_id=?");
    RETURN_IF_ERROR(q.status());
    q.Bind(1, job_id);
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) {
      job->request_id = q.Text(0);
      job->request_hash = q.Text(1);
    }
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointRecord> cks, LoadCheckpoints(job_id));
  if (!cks.empty()) job->last_checkpoint = cks.back();
  Remember(*job);
  return job;
}

absl::StatusOr<std::optional<WorkerRecord>> Store::LoadWorker(const std::string& worker_id) {
  Stmt q(db_, "SELECT * FROM workers WHERE id=?");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, worker_id);
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<WorkerRecord>();
  return std::optional<WorkerRecord>(ReadWorkerRow(q));
}

absl::StatusOr<std::vector<EventRecord>> Store::LoadEvents(const std::string& job_id, int limit) {
  Stmt q(db_,
         "SELECT * FROM (SELECT * FROM events WHERE job_id=? ORDER BY sequence DESC LIMIT ?) "
         "ORDER BY sequence");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id).Bind(2, limit);
  std::vector<EventRecord> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    out.push_back({q.Text(0), q.Int(1), q.Int(2), q.Text(3)});
  }
  return out;
}

absl::StatusOr<std::vector<CheckpointRecord>> Store::LoadCheckpoints(const std::string& job_id) {
  Stmt q(db_, "SELECT * FROM checkpoints WHERE job_id=? ORDER BY committed_ms, stage, step");
  RETURN_IF_ERROR(q.status());
  q.Bind(1, job_id);
  std::vector<CheckpointRecord> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    CheckpointRecord c;
    c.job_id = q.Text(0);
    c.generation = q.Int(1);
    c.stage = static_cast<int>(q.Int(2));
    c.step = q.Int(3);
    c.path = q.Text(4);
    c.bytes = q.Int(5);
    c.seconds = q.Double(6);
    c.committed_ms = q.Int(7);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace ulysses::coordinator
