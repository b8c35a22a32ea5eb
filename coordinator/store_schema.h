// The Store's tables (coordinator/store.h), each defined ONCE as a list of columns: name,
// SQL declaration, the schema version that added it, and how a record's field is bound to
// it and read back. CREATE TABLE and the migrations' ALTER TABLE (MigrationSteps), INSERT
// (InsertSql, BindRow) and SELECT (SelectSql, ReadRow) are all derived from that list, so
// a column is added in one place: append it to its table's list with the next schema
// version (a file's columns are in version order: ALTER TABLE appends).
//
// Internal to the Store (and its tests); also holds the RAII prepared statement.
#ifndef ULYSSES_COORDINATOR_STORE_SCHEMA_H_
#define ULYSSES_COORDINATOR_STORE_SCHEMA_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "coordinator/model.h"

namespace ulysses::coordinator::store_schema {

// An INTERNAL status carrying SQLite's result code `rc` (read back by SqliteResultCode), so
// a caller can tell refused data from an I/O failure after the statement is gone.
absl::Status SqliteError(int rc, absl::string_view what, absl::string_view message);
// The result code SqliteError attached, or 0 when there is none.
int SqliteResultCode(const absl::Status& status);

// RAII prepared statement with 1-based positional binds and 0-based column reads.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
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

// A column as the schema sees it.
struct ColumnDef {
  const char* name;
  const char* decl;  // Type and constraints, as CREATE TABLE and ADD COLUMN take them.
  int since;         // The schema version that added it.
};

// A table as the schema sees it (migrations, tests).
struct TableDef {
  const char* name;
  int since;                // The schema version that created it.
  const char* constraints;  // Table constraints after the columns ("" = none).
  std::vector<ColumnDef> columns;
};

// A column of a table whose rows are records of type R.
template <typename R>
struct Column {
  ColumnDef def;
  // Field -> parameter `param`, and column `column` of a row -> field. Both null for a
  // job's id in a table of a job's parts (stages, attempts): the caller binds and reads it.
  void (*bind)(Stmt& q, int param, const R& row);
  absl::Status (*read)(Stmt& q, int column, R& row);
  // Whether two rows hold the same value in this column (null where bind is null).
  bool (*same)(const R& a, const R& b);
};

template <typename R>
struct Table {
  const char* name;
  int since;
  const char* constraints;
  std::vector<Column<R>> columns;  // In the file's order (version order).

  // The position of `column` in `columns`, which is its index in a SelectSql row
  // (-1 when the table has no such column).
  int Index(std::string_view column) const {
    for (size_t i = 0; i < columns.size(); ++i) {
      if (column == columns[i].def.name) return static_cast<int>(i);
    }
    return -1;
  }
  TableDef Def() const {
    TableDef def{name, since, constraints, {}};
    for (const Column<R>& c : columns) def.columns.push_back(c.def);
    return def;
  }
  // Whether a and b would be stored as the same row, the column named `except` aside
  // ("" = none). Every column the table stores counts, so a field added to the table is
  // compared without a list to keep up.
  bool SameRow(const R& a, const R& b, std::string_view except = "") const {
    for (const Column<R>& c : columns) {
      if (c.same != nullptr && except != c.def.name && !c.same(a, b)) return false;
    }
    return true;
  }
};

// The tables. A stage or attempt row's job id is its "job_id" column (bound by the caller:
// BindRow's `job_id`); submit_requests holds a job's request_id, id (as job_id) and
// request_hash.
const Table<JobRecord>& JobsTable();
const Table<StageRecord>& StagesTable();
const Table<AttemptRecord>& AttemptsTable();
const Table<WorkerRecord>& WorkersTable();
const Table<CheckpointRecord>& CheckpointsTable();
const Table<EventRecord>& EventsTable();
const Table<JobRecord>& SubmitRequestsTable();
// Every checkpoint directory a job was given (CheckpointDirRecord): never deleted with a job.
const Table<CheckpointDirRecord>& CheckpointDirsTable();
// meta(key, value): schema_version, max_job_number, probe rows. Created before the
// version is read; no record type.
const TableDef& MetaTable();
// Every table, meta first, in creation order.
std::vector<TableDef> AllTables();

// CREATE TABLE IF NOT EXISTS with the columns that `version` has.
std::string CreateTableSql(const TableDef& table, int version);
// The statements that take a file of schema `from` to schema `to` (from 0 = a new file):
// per version, CREATE TABLE for the tables it added, ALTER TABLE ADD COLUMN for the
// columns it added to older tables.
std::vector<std::string> MigrationSteps(int from, int to);

// "a, b, c": the column names in list order.
std::string ColumnNames(const std::vector<ColumnDef>& columns);

// "SELECT <every column> FROM <table>": column i of a row is table.columns[i].
template <typename R>
std::string SelectSql(const Table<R>& table) {
  return "SELECT " + ColumnNames(table.Def().columns) + " FROM " + table.name;
}

// "INSERT OR REPLACE INTO <table> (<every column>) VALUES (?, ...)" (verb "OR IGNORE" to
// keep an existing row).
template <typename R>
std::string InsertSql(const Table<R>& table, std::string_view verb = "OR REPLACE") {
  std::string params;
  for (size_t i = 0; i < table.columns.size(); ++i) params += i == 0 ? "?" : ", ?";
  return std::string("INSERT ").append(verb).append(" INTO ") + table.name + " (" +
         ColumnNames(table.Def().columns) + ") VALUES (" + params + ")";
}

// Binds every column of `row` to an InsertSql statement; `job_id` goes to the column
// without a codec (a job's id in a table of its parts).
template <typename R>
void BindRow(Stmt& q, const Table<R>& table, const R& row, const std::string& job_id = "") {
  for (size_t i = 0; i < table.columns.size(); ++i) {
    const int param = static_cast<int>(i) + 1;
    if (table.columns[i].bind == nullptr) {
      q.Bind(param, job_id);
    } else {
      table.columns[i].bind(q, param, row);
    }
  }
}

// Reads the current row of a SelectSql statement into `row` (every column with a codec).
template <typename R>
absl::Status ReadRow(Stmt& q, const Table<R>& table, R& row) {
  for (size_t i = 0; i < table.columns.size(); ++i) {
    if (table.columns[i].read != nullptr) {
      RETURN_IF_ERROR(table.columns[i].read(q, static_cast<int>(i), row));
    }
  }
  return absl::OkStatus();
}

// ReadRow plus what a row of an older schema leaves to derive: an attempt's slots (0 for
// every rank before schema 5), a worker's devices (`capacity` times `device`).
absl::StatusOr<JobRecord> ReadJob(Stmt& q);
absl::StatusOr<StageRecord> ReadStage(Stmt& q);
absl::StatusOr<AttemptRecord> ReadAttempt(Stmt& q);
absl::StatusOr<WorkerRecord> ReadWorker(Stmt& q);
absl::StatusOr<CheckpointRecord> ReadCheckpoint(Stmt& q);
absl::StatusOr<EventRecord> ReadEvent(Stmt& q);
absl::StatusOr<CheckpointDirRecord> ReadCheckpointDir(Stmt& q);

}  // namespace ulysses::coordinator::store_schema

#endif  // ULYSSES_COORDINATOR_STORE_SCHEMA_H_
