#include "coordinator/store_schema.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "coordinator/failure_budget.h"
#include "coordinator/goodput.h"

namespace ulysses::coordinator::store_schema {
namespace {

constexpr char kSqliteCodeUrl[] = "type.ulysses/sqlite.result_code";

// The record type and field type of a data member pointer.
template <typename M>
struct MemberOf;
template <typename R, typename T>
struct MemberOf<T R::*> {
  using Record = R;
  using Type = T;
};
template <auto M>
using RecordOf = typename MemberOf<decltype(M)>::Record;

template <typename T>
void BindValue(Stmt& q, int i, const T& v) {
  if constexpr (std::is_enum_v<T>) {
    q.Bind(i, static_cast<int>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    q.Bind(i, v ? 1 : 0);
  } else {
    q.Bind(i, v);
  }
}

template <typename T>
void ReadValue(Stmt& q, int i, T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    v = q.Text(i);
  } else if constexpr (std::is_same_v<T, bool>) {
    v = q.Int(i) != 0;
  } else if constexpr (std::is_floating_point_v<T>) {
    v = q.Double(i);
  } else {
    v = static_cast<T>(q.Int(i));  // Integers and enums.
  }
}

// A column holding field M as is (text, integer, real; enums as their number, bool as 0/1).
template <auto M>
Column<RecordOf<M>> Field(const char* name, const char* decl, int since = 1) {
  using R = RecordOf<M>;
  return {{name, decl, since},
          [](Stmt& q, int i, const R& r) { BindValue(q, i, r.*M); },
          [](Stmt& q, int i, R& r) {
            ReadValue(q, i, r.*M);
            return absl::OkStatus();
          },
          [](const R& a, const R& b) { return a.*M == b.*M; }};
}

// A column holding the list M comma-joined ("" = empty). Integer entries that do not
// parse read back as 0.
template <auto M>
Column<RecordOf<M>> CommaList(const char* name, const char* decl, int since = 1) {
  using R = RecordOf<M>;
  return {{name, decl, since},
          [](Stmt& q, int i, const R& r) { q.Bind(i, absl::StrJoin(r.*M, ",")); },
          [](Stmt& q, int i, R& r) {
            auto& list = r.*M;
            using Entry = typename std::decay_t<decltype(list)>::value_type;
            list.clear();
            const std::string text = q.Text(i);
            if (text.empty()) return absl::OkStatus();
            for (absl::string_view part : absl::StrSplit(text, ',')) {
              if constexpr (std::is_same_v<Entry, std::string>) {
                list.emplace_back(part);
              } else {
                Entry value = 0;
                if (!absl::SimpleAtoi(part, &value)) value = 0;
                list.push_back(value);
              }
            }
            return absl::OkStatus();
          },
          [](const R& a, const R& b) { return a.*M == b.*M; }};
}

// A column holding field M as Encode(field) text, read back with Decode (which may refuse).
template <auto M, auto Encode, auto Decode>
Column<RecordOf<M>> Encoded(const char* name, const char* decl, int since) {
  using R = RecordOf<M>;
  return {{name, decl, since},
          [](Stmt& q, int i, const R& r) { q.Bind(i, Encode(r.*M)); },
          [](Stmt& q, int i, R& r) -> absl::Status {
            ASSIGN_OR_RETURN(r.*M, Decode(q.Text(i)));
            return absl::OkStatus();
          },
          [](const R& a, const R& b) { return Encode(a.*M) == Encode(b.*M); }};
}

// The id of the job a row belongs to, in a table of a job's parts (bound and read by the
// caller).
template <typename R>
Column<R> JobIdColumn() {
  return {{"job_id", "TEXT NOT NULL", 1}, nullptr, nullptr, nullptr};
}

template <typename R>
absl::StatusOr<R> Read(Stmt& q, const Table<R>& table) {
  R row;
  RETURN_IF_ERROR(ReadRow(q, table, row));
  return row;
}

}  // namespace

absl::Status SqliteError(int rc, absl::string_view what, absl::string_view message) {
  absl::Status status = absl::InternalError(absl::StrCat("sqlite ", what, ": ", message));
  status.SetPayload(kSqliteCodeUrl, absl::Cord(absl::StrCat(rc)));
  return status;
}

int SqliteResultCode(const absl::Status& status) {
  auto payload = status.GetPayload(kSqliteCodeUrl);  // absl::optional<absl::Cord>
  int rc = 0;
  if (!payload || !absl::SimpleAtoi(payload->Flatten(), &rc)) return 0;
  return rc;
}

// Schema versions: 1 initial; 2 jobs.owner, jobs.tenant, workers.identity (auth; older
// jobs: no owner/tenant, admins only); 3 submit_requests (idempotent SubmitJob); 4 failure
// budgets by kind and the preemption opt-out (coordinator/failure_budget.h; older jobs get
// the spec defaults); 5 multi-slot workers: each rank's slot, device and node label in an
// attempt ("" = slot 0 for every rank; device and label unknown) and each worker's devices
// ("" = one slot per capacity on `device`); 6 jobs.goodput (coordinator/goodput.h; "" =
// zeros: before accounting).

const Table<JobRecord>& JobsTable() {
  static const auto* table = new Table<JobRecord>{
      "jobs",
      1,
      "",
      {
          Field<&JobRecord::id>("id", "TEXT PRIMARY KEY"),
          Field<&JobRecord::number>("number", "INTEGER NOT NULL"),
          Field<&JobRecord::name>("name", "TEXT NOT NULL"),
          Field<&JobRecord::spec_yaml>("spec_yaml", "TEXT NOT NULL"),
          Field<&JobRecord::state>("state", "INTEGER NOT NULL"),
          Field<&JobRecord::reason>("reason", "TEXT NOT NULL"),
          Field<&JobRecord::priority>("priority", "INTEGER NOT NULL"),
          Field<&JobRecord::created_ms>("created_ms", "INTEGER NOT NULL"),
          Field<&JobRecord::started_ms>("started_ms", "INTEGER NOT NULL"),
          Field<&JobRecord::finished_ms>("finished_ms", "INTEGER NOT NULL"),
          Field<&JobRecord::state_entered_ms>("state_entered_ms", "INTEGER NOT NULL"),
          Field<&JobRecord::stage_index>("stage_index", "INTEGER NOT NULL"),
          Field<&JobRecord::generation>("generation", "INTEGER NOT NULL"),
          Field<&JobRecord::restarts>("restarts", "INTEGER NOT NULL"),
          Field<&JobRecord::preemptions>("preemptions", "INTEGER NOT NULL"),
          Field<&JobRecord::failures>("failures", "INTEGER NOT NULL"),
          Field<&JobRecord::preemptions_budget_used>("preemptions_budget_used", "INTEGER NOT NULL"),
          Field<&JobRecord::max_failures>("max_failures", "INTEGER NOT NULL"),
          Field<&JobRecord::max_preemptions>("max_preemptions", "INTEGER NOT NULL"),
          Field<&JobRecord::node_label>("node_label", "TEXT NOT NULL"),
          Field<&JobRecord::checkpoint_dir>("checkpoint_dir", "TEXT NOT NULL"),
          Field<&JobRecord::out_dir>("out_dir", "TEXT NOT NULL"),
          Field<&JobRecord::loss>("loss", "REAL NOT NULL"),
          Field<&JobRecord::not_before_ms>("not_before_ms", "INTEGER NOT NULL"),
          Field<&JobRecord::owner>("owner", "TEXT NOT NULL DEFAULT ''", 2),
          Field<&JobRecord::tenant>("tenant", "TEXT NOT NULL DEFAULT ''", 2),
          Field<&JobRecord::infra_failures>("infra_failures", "INTEGER NOT NULL DEFAULT 0", 4),
          Field<&JobRecord::max_infra_failures>("max_infra_failures", "INTEGER NOT NULL DEFAULT 20",
                                                4),
          Field<&JobRecord::failure_window_s>("failure_window_s", "INTEGER NOT NULL DEFAULT 86400",
                                              4),
          Encoded<&JobRecord::recent_failures, EncodeFailureMarks, DecodeFailureMarks>(
              "recent_failures", "TEXT NOT NULL DEFAULT ''", 4),
          Field<&JobRecord::preemptible>("preemptible", "INTEGER NOT NULL DEFAULT 1", 4),
          Encoded<&JobRecord::goodput, EncodeGoodput, DecodeGoodput>("goodput",
                                                                     "TEXT NOT NULL DEFAULT ''", 6),
      }};
  return *table;
}

const Table<StageRecord>& StagesTable() {
  static const auto* table = new Table<StageRecord>{
      "stages",
      1,
      "PRIMARY KEY (job_id, idx)",
      {
          JobIdColumn<StageRecord>(),
          Field<&StageRecord::index>("idx", "INTEGER NOT NULL"),
          Field<&StageRecord::state>("state", "INTEGER NOT NULL"),
          Field<&StageRecord::seq_len>("seq_len", "INTEGER NOT NULL"),
          Field<&StageRecord::steps>("steps", "INTEGER NOT NULL"),
          Field<&StageRecord::step>("step", "INTEGER NOT NULL"),
          Field<&StageRecord::sp>("sp", "INTEGER NOT NULL"),
          Field<&StageRecord::dp>("dp", "INTEGER NOT NULL"),
          Field<&StageRecord::loss>("loss", "REAL NOT NULL"),
          Field<&StageRecord::tokens_per_s>("tokens_per_s", "REAL NOT NULL"),
          Field<&StageRecord::eval_loss>("eval_loss", "REAL NOT NULL"),
          Field<&StageRecord::eval_accuracy>("eval_accuracy", "REAL NOT NULL"),
          Field<&StageRecord::eval_seq_len>("eval_seq_len", "INTEGER NOT NULL"),
          Field<&StageRecord::attempts>("attempts", "INTEGER NOT NULL"),
          Field<&StageRecord::started_ms>("started_ms", "INTEGER NOT NULL"),
          Field<&StageRecord::finished_ms>("finished_ms", "INTEGER NOT NULL"),
      }};
  return *table;
}

const Table<AttemptRecord>& AttemptsTable() {
  static const auto* table = new Table<AttemptRecord>{
      "attempts",
      1,
      "PRIMARY KEY (job_id, generation)",
      {
          JobIdColumn<AttemptRecord>(),
          Field<&AttemptRecord::generation>("generation", "INTEGER NOT NULL"),
          Field<&AttemptRecord::stage>("stage", "INTEGER NOT NULL"),
          CommaList<&AttemptRecord::worker_ids>("worker_ids", "TEXT NOT NULL"),
          Field<&AttemptRecord::master_addr>("master_addr", "TEXT NOT NULL"),
          Field<&AttemptRecord::master_port>("master_port", "INTEGER NOT NULL"),
          Field<&AttemptRecord::started_ms>("started_ms", "INTEGER NOT NULL"),
          Field<&AttemptRecord::ended_ms>("ended_ms", "INTEGER NOT NULL"),
          Field<&AttemptRecord::outcome>("outcome", "INTEGER NOT NULL"),
          Field<&AttemptRecord::exit_code>("exit_code", "INTEGER NOT NULL"),
          Field<&AttemptRecord::reason>("reason", "TEXT NOT NULL"),
          CommaList<&AttemptRecord::slots>("slots", "TEXT NOT NULL DEFAULT ''", 5),
          CommaList<&AttemptRecord::devices>("devices", "TEXT NOT NULL DEFAULT ''", 5),
          CommaList<&AttemptRecord::node_labels>("node_labels", "TEXT NOT NULL DEFAULT ''", 5),
      }};
  return *table;
}

const Table<WorkerRecord>& WorkersTable() {
  static const auto* table = new Table<WorkerRecord>{
      "workers",
      1,
      "",
      {
          Field<&WorkerRecord::id>("id", "TEXT PRIMARY KEY"),
          Field<&WorkerRecord::name>("name", "TEXT NOT NULL UNIQUE"),
          Field<&WorkerRecord::node_label>("node_label", "TEXT NOT NULL"),
          Field<&WorkerRecord::device>("device", "TEXT NOT NULL"),
          Field<&WorkerRecord::host>("host", "TEXT NOT NULL"),
          Field<&WorkerRecord::capacity>("capacity", "INTEGER NOT NULL"),
          Field<&WorkerRecord::registered_ms>("registered_ms", "INTEGER NOT NULL"),
          Field<&WorkerRecord::last_seen_ms>("last_seen_ms", "INTEGER NOT NULL"),
          Field<&WorkerRecord::identity>("identity", "TEXT NOT NULL DEFAULT ''", 2),
          CommaList<&WorkerRecord::devices>("devices", "TEXT NOT NULL DEFAULT ''", 5),
      }};
  return *table;
}

const Table<CheckpointRecord>& CheckpointsTable() {
  static const auto* table = new Table<CheckpointRecord>{
      "checkpoints",
      1,
      "PRIMARY KEY (job_id, stage, step)",
      {
          Field<&CheckpointRecord::job_id>("job_id", "TEXT NOT NULL"),
          Field<&CheckpointRecord::generation>("generation", "INTEGER NOT NULL"),
          Field<&CheckpointRecord::stage>("stage", "INTEGER NOT NULL"),
          Field<&CheckpointRecord::step>("step", "INTEGER NOT NULL"),
          Field<&CheckpointRecord::path>("path", "TEXT NOT NULL"),
          Field<&CheckpointRecord::bytes>("bytes", "INTEGER NOT NULL"),
          Field<&CheckpointRecord::seconds>("seconds", "REAL NOT NULL"),
          Field<&CheckpointRecord::committed_ms>("committed_ms", "INTEGER NOT NULL"),
      }};
  return *table;
}

const Table<CheckpointDirRecord>& CheckpointDirsTable() {
  static const auto* table = new Table<CheckpointDirRecord>{
      "checkpoint_dirs",
      7,
      "",
      {
          Field<&CheckpointDirRecord::path>("path", "TEXT PRIMARY KEY", 7),
          Field<&CheckpointDirRecord::tenant>("tenant", "TEXT NOT NULL", 7),
          Field<&CheckpointDirRecord::job_id>("job_id", "TEXT NOT NULL", 7),
          Field<&CheckpointDirRecord::number>("number", "INTEGER NOT NULL", 7),
          Field<&CheckpointDirRecord::created_ms>("created_ms", "INTEGER NOT NULL", 7),
      }};
  return *table;
}

const Table<EventRecord>& EventsTable() {
  static const auto* table = new Table<EventRecord>{
      "events",
      1,
      "PRIMARY KEY (job_id, sequence)",
      {
          Field<&EventRecord::job_id>("job_id", "TEXT NOT NULL"),
          Field<&EventRecord::sequence>("sequence", "INTEGER NOT NULL"),
          Field<&EventRecord::time_ms>("time_ms", "INTEGER NOT NULL"),
          // A serialized v1::JobEvent: bytes, not text.
          Column<EventRecord>{
              {"payload", "BLOB NOT NULL", 1},
              [](Stmt& q, int i, const EventRecord& e) { q.BindBlob(i, e.payload); },
              [](Stmt& q, int i, EventRecord& e) {
                e.payload = q.Text(i);
                return absl::OkStatus();
              },
              [](const EventRecord& a, const EventRecord& b) { return a.payload == b.payload; }},
      }};
  return *table;
}

const Table<JobRecord>& SubmitRequestsTable() {
  static const auto* table =
      new Table<JobRecord>{"submit_requests",
                           3,
                           "",
                           {
                               Field<&JobRecord::request_id>("request_id", "TEXT PRIMARY KEY", 3),
                               Field<&JobRecord::id>("job_id", "TEXT NOT NULL UNIQUE", 3),
                               Field<&JobRecord::request_hash>("request_hash", "TEXT NOT NULL", 3),
                           }};
  return *table;
}

const TableDef& MetaTable() {
  static const auto* table =
      new TableDef{"meta", 1, "", {{"key", "TEXT PRIMARY KEY", 1}, {"value", "TEXT", 1}}};
  return *table;
}

std::vector<TableDef> AllTables() {
  return {MetaTable(),           JobsTable().Def(),           StagesTable().Def(),
          AttemptsTable().Def(), WorkersTable().Def(),        CheckpointsTable().Def(),
          EventsTable().Def(),   SubmitRequestsTable().Def(), CheckpointDirsTable().Def()};
}

std::string ColumnNames(const std::vector<ColumnDef>& columns) {
  return absl::StrJoin(columns, ", ",
                       [](std::string* out, const ColumnDef& c) { absl::StrAppend(out, c.name); });
}

std::string CreateTableSql(const TableDef& table, int version) {
  std::vector<std::string> parts;
  for (const ColumnDef& c : table.columns) {
    if (c.since <= version) parts.push_back(absl::StrCat(c.name, " ", c.decl));
  }
  if (*table.constraints != '\0') parts.push_back(table.constraints);
  return absl::StrCat("CREATE TABLE IF NOT EXISTS ", table.name, " (", absl::StrJoin(parts, ", "),
                      ")");
}

std::vector<std::string> MigrationSteps(int from, int to) {
  std::vector<std::string> steps;
  const std::vector<TableDef> tables = AllTables();
  for (int version = from + 1; version <= to; ++version) {
    for (const TableDef& table : tables) {
      if (table.since == version) {
        steps.push_back(CreateTableSql(table, version));
      } else if (table.since < version) {
        for (const ColumnDef& c : table.columns) {
          if (c.since == version) {
            steps.push_back(
                absl::StrCat("ALTER TABLE ", table.name, " ADD COLUMN ", c.name, " ", c.decl));
          }
        }
      }
    }
  }
  return steps;
}

absl::StatusOr<JobRecord> ReadJob(Stmt& q) { return Read(q, JobsTable()); }

absl::StatusOr<StageRecord> ReadStage(Stmt& q) { return Read(q, StagesTable()); }

absl::StatusOr<AttemptRecord> ReadAttempt(Stmt& q) {
  ASSIGN_OR_RETURN(AttemptRecord a, Read(q, AttemptsTable()));
  // One slot per rank; rows from before schema 5 have none: every rank ran on slot 0.
  a.slots.resize(a.worker_ids.size(), 0);
  return a;
}

absl::StatusOr<WorkerRecord> ReadWorker(Stmt& q) {
  ASSIGN_OR_RETURN(WorkerRecord w, Read(q, WorkersTable()));
  if (w.devices.empty()) w.devices.assign(std::max(1, w.capacity), w.device);
  return w;
}

absl::StatusOr<CheckpointRecord> ReadCheckpoint(Stmt& q) { return Read(q, CheckpointsTable()); }

absl::StatusOr<EventRecord> ReadEvent(Stmt& q) { return Read(q, EventsTable()); }

absl::StatusOr<CheckpointDirRecord> ReadCheckpointDir(Stmt& q) {
  return Read(q, CheckpointDirsTable());
}

}  // namespace ulysses::coordinator::store_schema
