// Store: real SQLite files in a temp dir; "crash" = dropping the Store without any
// clean-up step and reopening the same file.
#include "coordinator/store.h"

#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cmath>
#include <csignal>
#include <filesystem>

#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using testing::TempDir;

JobRecord MakeJob(const std::string& id, int64_t number) {
  JobRecord j;
  j.id = id;
  j.number = number;
  j.name = "demo";
  j.spec_yaml = "apiVersion: ulysses/v1\n";
  j.state = v1::JOB_STATE_RUNNING;
  j.reason = "running";
  j.priority = 5;
  j.created_ms = 1000;
  j.generation = 3;
  j.restarts = 2;
  j.preemptions = 1;
  j.failures = 1;
  j.checkpoint_dir = "/ckpt/" + id;
  StageRecord s0;
  s0.index = 0;
  s0.sp = 2;
  s0.steps = 10;
  s0.step = 7;
  s0.loss = 2.5;
  j.stages.push_back(s0);
  AttemptRecord a;
  a.generation = 3;
  a.worker_ids = {"w-a", "w-b"};
  a.master_addr = "10.0.0.1";
  a.master_port = 29501;
  j.attempts.push_back(a);
  return j;
}

TEST(StoreTest, BatchRoundTripsThroughReopen) {
  TempDir dir;
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    Store::Batch b;
    b.jobs.push_back(MakeJob("job-000001", 1));
    b.workers.push_back({"w-a", "a", "node1", "cpu", "10.0.0.1", 1, 5, 6});
    b.checkpoints.push_back({"job-000001", 3, 0, 5, "/ckpt/job-000001/s0-5", 100, 0.5, 77});
    b.events.push_back({"job-000001", 1, 10, "payload"});
    ASSERT_TRUE((*store)->Write(b).ok());
  }  // Dropped without any shutdown step.
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->jobs.size(), 1u);
  const JobRecord& j = snap->jobs[0];
  EXPECT_EQ(j.id, "job-000001");
  EXPECT_EQ(j.state, v1::JOB_STATE_RUNNING);
  EXPECT_EQ(j.generation, 3);
  EXPECT_EQ(j.restarts, 2);
  EXPECT_EQ(j.preemptions, 1);
  ASSERT_EQ(j.stages.size(), 1u);
  EXPECT_EQ(j.stages[0].step, 7);
  EXPECT_EQ(j.stages[0].sp, 2);
  ASSERT_EQ(j.attempts.size(), 1u);
  EXPECT_EQ(j.attempts[0].worker_ids, (std::vector<std::string>{"w-a", "w-b"}));
  EXPECT_EQ(j.attempts[0].master_port, 29501);
  ASSERT_TRUE(j.last_checkpoint.has_value());
  EXPECT_EQ(j.last_checkpoint->step, 5);
  EXPECT_EQ(snap->max_job_number, 1);
  ASSERT_EQ(snap->workers.size(), 1u);
  EXPECT_EQ(snap->workers[0].node_label, "node1");
  auto events = (*store)->LoadEvents("job-000001", 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].payload, "payload");
}

// The finding: the state dir was 0755 (the db 0600). Now the directory is owner-only too,
// created so or tightened at open.
TEST(StoreTest, TheStateDirIsOwnerOnly) {
  TempDir dir;
  const std::string open_dir = dir.path() + "/was-open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0755), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0755), 0);
  for (const std::string& state : {open_dir, dir.path() + "/new/state"}) {
    ASSERT_TRUE(Store::Open(state).ok()) << state;
    struct stat st;
    ASSERT_EQ(stat(state.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << state;
    ASSERT_EQ(stat((state + "/coordinator.db").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << state;
  }
}

TEST(StoreTest, UpsertReplacesTheJobRow) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  Store::Batch b;
  b.jobs.push_back(MakeJob("job-000001", 1));
  ASSERT_TRUE((*store)->Write(b).ok());
  b.jobs[0].state = v1::JOB_STATE_SUCCEEDED;
  b.jobs[0].restarts = 9;
  ASSERT_TRUE((*store)->Write(b).ok());
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].state, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(snap->jobs[0].restarts, 9);
}

// Fault injection with a real SQLite trigger: an event with sequence -1 aborts the
// transaction after the job and worker rows of the same batch were written.
void InstallFailingTrigger(const std::string& dir) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/coordinator.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TRIGGER inject AFTER INSERT ON events WHEN NEW.sequence = -1 "
                         "BEGIN SELECT RAISE(ABORT, 'injected failure'); END",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
}

// A write the database refuses for its data (a constraint) fails alone: nothing of it is
// written and the store takes the next batch.
TEST(StoreTest, RefusedBatchLeavesNothingAndTheStoreWritable) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  InstallFailingTrigger(dir.path());
  Store::Batch b;
  b.jobs.push_back(MakeJob("job-000001", 1));
  b.workers.push_back({"w-a", "a", "", "cpu", "h", 1, 0, 0});
  b.events.push_back({"job-000001", -1, 0, "x"});
  absl::Status s = (*store)->Write(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(s.message()).find("injected failure"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("the store stays writable"), std::string::npos) << s;
  EXPECT_TRUE((*store)->writable());
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  EXPECT_TRUE(snap->jobs.empty());
  EXPECT_TRUE(snap->workers.empty());

  // A NaN in a REAL NOT NULL column (SQLite stores NaN as NULL): refused the same way.
  Store::Batch nan_batch;
  nan_batch.jobs.push_back(MakeJob("job-000002", 2));
  nan_batch.jobs[0].stages[0].loss = std::nan("");
  s = (*store)->Write(nan_batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(s.message()).find("NOT NULL constraint failed: stages.loss"),
            std::string::npos)
      << s;
  EXPECT_TRUE((*store)->writable());

  // The next valid batch is written.
  Store::Batch ok_batch;
  ok_batch.jobs.push_back(MakeJob("job-000003", 3));
  ASSERT_TRUE((*store)->Write(ok_batch).ok());
  snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].id, "job-000003");
}

// An I/O failure is sticky. The failure is real: a file-size limit (RLIMIT_FSIZE) makes the
// kernel refuse the WAL append with EFBIG, as a full disk refuses it with ENOSPC.
TEST(StoreTest, IoFailureLeavesNothingAndTurnsSticky) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  Store::Batch first;
  first.jobs.push_back(MakeJob("job-000001", 1));
  ASSERT_TRUE((*store)->Write(first).ok());

  Store::Batch big;
  big.jobs.push_back(MakeJob("job-000002", 2));
  big.jobs[0].spec_yaml.assign(4 << 20, 'x');  // Must grow the WAL past its current size.
  const std::string wal = dir.path() + "/coordinator.db-wal";
  ASSERT_TRUE(std::filesystem::exists(wal));
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a core dump.
  struct rlimit limited = saved;
  limited.rlim_cur = static_cast<rlim_t>(std::filesystem::file_size(wal)) + 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  absl::Status s = (*store)->Write(big);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(std::string(s.message()).find("store now read-only"), std::string::npos) << s;
  EXPECT_FALSE((*store)->writable());
  // Sticky: even a small valid batch is refused now, with the first error.
  Store::Batch ok_batch;
  ok_batch.jobs.push_back(MakeJob("job-000003", 3));
  absl::Status again = (*store)->Write(ok_batch);
  EXPECT_EQ(again, s);
  // Nothing of either batch reached the file: a fresh open sees only the first job.
  store->reset();
  auto reopened = Store::Open(dir.path());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto snap = (*reopened)->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].id, "job-000001");
}

TEST(StoreTest, LoadJobAndLoadWorkerReadOneRecord) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  Store::Batch b;
  b.jobs.push_back(MakeJob("job-000001", 1));
  b.jobs.push_back(MakeJob("job-000002", 2));
  b.workers.push_back({"w-a", "a", "node1", "cpu", "10.0.0.1", 1, 5, 6});
  b.checkpoints.push_back({"job-000001", 3, 0, 5, "/ckpt/job-000001/s0-5", 100, 0.5, 77});
  ASSERT_TRUE((*store)->Write(b).ok());
  auto job = (*store)->LoadJob("job-000001");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->has_value());
  EXPECT_EQ((*job)->id, "job-000001");
  EXPECT_EQ((*job)->generation, 3);
  ASSERT_EQ((*job)->stages.size(), 1u);
  EXPECT_EQ((*job)->stages[0].step, 7);
  ASSERT_EQ((*job)->attempts.size(), 1u);
  EXPECT_EQ((*job)->attempts[0].worker_ids, (std::vector<std::string>{"w-a", "w-b"}));
  ASSERT_TRUE((*job)->last_checkpoint.has_value());
  EXPECT_EQ((*job)->last_checkpoint->step, 5);
  auto other = (*store)->LoadJob("job-000002");
  ASSERT_TRUE(other.ok() && other->has_value());
  EXPECT_FALSE((*other)->last_checkpoint.has_value());
  auto missing = (*store)->LoadJob("job-000009");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  auto worker = (*store)->LoadWorker("w-a");
  ASSERT_TRUE(worker.ok() && worker->has_value());
  EXPECT_EQ((*worker)->node_label, "node1");
  auto no_worker = (*store)->LoadWorker("w-b");
  ASSERT_TRUE(no_worker.ok());
  EXPECT_FALSE(no_worker->has_value());
}

TEST(StoreTest, RefusesANewerSchema) {
  TempDir dir;
  { ASSERT_TRUE(Store::Open(dir.path()).ok()); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/coordinator.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE meta SET value='99' WHERE key='schema_version'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = Store::Open(dir.path());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(store.status().message()).find("schema version 99"), std::string::npos);
}

// Owner, tenant and worker identity (schema 2) round-trip, and a schema-1 file (made by
// dropping those columns) is migrated in place: its rows keep their data with empty
// owner/tenant/identity, and the new columns are writable.
TEST(StoreTest, OwnerTenantAndIdentityPersistAndSchema1IsMigrated) {
  TempDir dir;
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok());
    Store::Batch b;
    b.jobs.push_back(MakeJob("job-000001", 1));
    WorkerRecord w;
    w.id = "w-a";
    w.name = "a";
    w.host = "h";
    b.workers.push_back(w);
    ASSERT_TRUE((*store)->Write(b).ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/coordinator.db").c_str(), &db), SQLITE_OK);
  for (const char* sql :
       {"ALTER TABLE jobs DROP COLUMN infra_failures",
        "ALTER TABLE jobs DROP COLUMN max_infra_failures",
        "ALTER TABLE jobs DROP COLUMN failure_window_s",
        "ALTER TABLE jobs DROP COLUMN recent_failures", "ALTER TABLE jobs DROP COLUMN preemptible",
        "ALTER TABLE jobs DROP COLUMN owner", "ALTER TABLE jobs DROP COLUMN tenant",
        "ALTER TABLE workers DROP COLUMN identity", "ALTER TABLE attempts DROP COLUMN slots",
        "ALTER TABLE attempts DROP COLUMN devices", "ALTER TABLE attempts DROP COLUMN node_labels",
        "ALTER TABLE workers DROP COLUMN devices", "ALTER TABLE jobs DROP COLUMN goodput",
        "UPDATE meta SET value='1' WHERE key='schema_version'"}) {
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }
  sqlite3_close(db);
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].generation, 3);  // Old data intact.
  EXPECT_EQ(snap->jobs[0].tenant, "");
  ASSERT_EQ(snap->workers.size(), 1u);
  EXPECT_EQ(snap->workers[0].identity, "");
  Store::Batch b;
  JobRecord j = snap->jobs[0];
  j.owner = "alice";
  j.tenant = "research";
  b.jobs.push_back(j);
  WorkerRecord w = snap->workers[0];
  w.identity = "worker:a";
  b.workers.push_back(w);
  ASSERT_TRUE((*store)->Write(b).ok());
  auto job = (*store)->LoadJob("job-000001");
  ASSERT_TRUE(job.ok() && job->has_value());
  EXPECT_EQ((*job)->owner, "alice");
  EXPECT_EQ((*job)->tenant, "research");
  auto worker = (*store)->LoadWorker("w-a");
  ASSERT_TRUE(worker.ok() && worker->has_value());
  EXPECT_EQ((*worker)->identity, "worker:a");
}

// Counts the stage and attempt rows written from now on (SQLite triggers on the real file).
class RowWriteCounter {
 public:
  explicit RowWriteCounter(const std::string& dir) {
    EXPECT_EQ(sqlite3_open((dir + "/coordinator.db").c_str(), &db_), SQLITE_OK);
    Exec("CREATE TABLE IF NOT EXISTS row_writes (tbl TEXT)");
    Exec(
        "CREATE TRIGGER IF NOT EXISTS count_stages AFTER INSERT ON stages "
        "BEGIN INSERT INTO row_writes VALUES('stages'); END");
    Exec(
        "CREATE TRIGGER IF NOT EXISTS count_attempts AFTER INSERT ON attempts "
        "BEGIN INSERT INTO row_writes VALUES('attempts'); END");
  }
  ~RowWriteCounter() { sqlite3_close(db_); }
  int64_t Count(const std::string& table) {
    sqlite3_stmt* q = nullptr;
    EXPECT_EQ(
        sqlite3_prepare_v2(db_, "SELECT COUNT(*) FROM row_writes WHERE tbl=?", -1, &q, nullptr),
        SQLITE_OK);
    sqlite3_bind_text(q, 1, table.c_str(), -1, SQLITE_TRANSIENT);
    int64_t n = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    return n;
  }
  void Exec(const std::string& sql) {
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }

 private:
  sqlite3* db_ = nullptr;
};

JobRecord SixtyFourStageJob() {
  JobRecord j = MakeJob("job-000001", 1);
  j.stages.clear();
  for (int i = 0; i < 64; ++i) {
    StageRecord s;
    s.index = i;
    s.steps = 10;
    j.stages.push_back(s);
  }
  return j;
}

TEST(StoreTest, ATransitionWritesOnlyTheStageAndAttemptRowsThatChanged) {
  TempDir dir;
  JobRecord job = SixtyFourStageJob();
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok());
    RowWriteCounter rows(dir.path());
    Store::Batch first;
    first.jobs.push_back(job);
    ASSERT_TRUE((*store)->Write(first).ok());
    EXPECT_EQ(rows.Count("stages"), 64);  // New: all of them.
    EXPECT_EQ(rows.Count("attempts"), 1);
    job.stages[3].step = 5;  // One step of one stage.
    job.attempts.push_back(job.attempts.back());
    job.attempts.back().generation = 4;
    Store::Batch second;
    second.jobs.push_back(job);
    ASSERT_TRUE((*store)->Write(second).ok());
    EXPECT_EQ(rows.Count("stages"), 65);
    EXPECT_EQ(rows.Count("attempts"), 2);
  }
  // After a restart the rows loaded count as written.
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  RowWriteCounter rows(dir.path());
  ASSERT_TRUE((*store)->Load().ok());
  const int64_t before = rows.Count("stages");
  job.stages[4].state = v1::STAGE_STATE_RUNNING;
  Store::Batch third;
  third.jobs.push_back(job);
  ASSERT_TRUE((*store)->Write(third).ok());
  EXPECT_EQ(rows.Count("stages"), before + 1);
  auto loaded = (*store)->LoadJob(job.id);
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->stages[3].step, 5);
  EXPECT_EQ((*loaded)->stages[4].state, v1::STAGE_STATE_RUNNING);
  EXPECT_EQ((*loaded)->attempts.size(), 2u);
}

TEST(StoreTest, AfterARefusedWriteTheJobIsWrittenWholeAgain) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  JobRecord job = SixtyFourStageJob();
  Store::Batch b;
  b.jobs.push_back(job);
  ASSERT_TRUE((*store)->Write(b).ok());
  RowWriteCounter rows(dir.path());
  // The second stage change is refused (rolled back) ...
  rows.Exec(
      "CREATE TRIGGER refuse AFTER INSERT ON stages WHEN NEW.step = 9 "
      "BEGIN SELECT RAISE(ABORT, 'refused'); END");
  job.stages[1].step = 1;
  job.stages[2].step = 9;
  Store::Batch refused;
  refused.jobs.push_back(job);
  ASSERT_FALSE((*store)->Write(refused).ok());
  ASSERT_TRUE((*store)->writable());
  rows.Exec("DROP TRIGGER refuse");
  // ... so stage 1's row is not on disk: the next write must not skip it.
  job.stages[2].step = 8;
  Store::Batch next;
  next.jobs.push_back(job);
  ASSERT_TRUE((*store)->Write(next).ok());
  auto loaded = (*store)->LoadJob(job.id);
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->stages[1].step, 1);
  EXPECT_EQ((*loaded)->stages[2].step, 8);
}

TEST(StoreTest, KeepsTheNewestEventsPerJob) {
  TempDir dir;
  StoreOptions options;
  options.events_per_job = 3;
  auto store = Store::Open(dir.path(), options);
  ASSERT_TRUE(store.ok());
  for (int64_t seq = 1; seq <= 10; ++seq) {
    Store::Batch b;
    b.events.push_back({"job-000001", seq, seq, "e" + std::to_string(seq)});
    if (seq <= 2) b.events.push_back({"job-000002", seq, seq, "other"});
    ASSERT_TRUE((*store)->Write(b).ok());
  }
  auto events = (*store)->LoadEvents("job-000001", 100);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].sequence, 8);
  EXPECT_EQ((*events)[2].payload, "e10");
  auto other = (*store)->LoadEvents("job-000002", 100);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->size(), 2u);  // Pruned per job, not globally.
}

TEST(StoreTest, DeletesWorkersAndKeepsRequestIds) {
  TempDir dir;
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok());
    Store::Batch b;
    b.workers.push_back({"w-a", "a", "node1", "cpu", "10.0.0.1", 1, 5, 6});
    b.workers.push_back({"w-b", "b", "node1", "cpu", "10.0.0.2", 1, 5, 6});
    JobRecord j = MakeJob("job-000001", 1);
    j.request_id = "req-1";
    j.request_hash = "abc";
    b.jobs.push_back(j);
    ASSERT_TRUE((*store)->Write(b).ok());
    Store::Batch del;
    del.deleted_workers.push_back("w-a");
    ASSERT_TRUE((*store)->Write(del).ok());
  }
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(snap->workers.size(), 1u);
  EXPECT_EQ(snap->workers[0].id, "w-b");
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].request_id, "req-1");
  EXPECT_EQ(snap->jobs[0].request_hash, "abc");
}

// What a file of schema 4 lacks.
constexpr const char* kDropVersion5Columns =
    "ALTER TABLE attempts DROP COLUMN slots; ALTER TABLE attempts DROP COLUMN devices; "
    "ALTER TABLE attempts DROP COLUMN node_labels; ALTER TABLE workers DROP COLUMN devices";

// What a file of schema 3 lacks besides.
constexpr const char* kDropVersion4Columns =
    "ALTER TABLE jobs DROP COLUMN infra_failures; ALTER TABLE jobs DROP COLUMN "
    "max_infra_failures; ALTER TABLE jobs DROP COLUMN failure_window_s; ALTER TABLE jobs DROP "
    "COLUMN recent_failures; ALTER TABLE jobs DROP COLUMN preemptible";

// Turns the store file in `dir` into an older one: drops what schema 6 added (every caller
// wants an older file), runs `sql` (dropping what came between), then sets its schema version.
void Downgrade(const std::string& dir, std::vector<std::string> sql, int version) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/coordinator.db").c_str(), &db), SQLITE_OK);
  sql.insert(sql.begin(), "ALTER TABLE jobs DROP COLUMN goodput");
  for (const std::string& statement : sql) {
    ASSERT_EQ(sqlite3_exec(db, statement.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
        << statement;
  }
  const std::string set_version =
      "UPDATE meta SET value='" + std::to_string(version) + "' WHERE key='schema_version'";
  ASSERT_EQ(sqlite3_exec(db, set_version.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
}

TEST(StoreTest, MigratesAVersionTwoFile) {
  TempDir dir;
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok());
    Store::Batch b;
    b.jobs.push_back(MakeJob("job-000001", 1));
    ASSERT_TRUE((*store)->Write(b).ok());
  }
  // Make it a version-2 file: no submit_requests table, no version-4 columns.
  ASSERT_NO_FATAL_FAILURE(Downgrade(
      dir.path(), {kDropVersion5Columns, kDropVersion4Columns, "DROP TABLE submit_requests"}, 2));
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  JobRecord j = MakeJob("job-000002", 2);
  j.request_id = "req-2";
  Store::Batch b;
  b.jobs.push_back(j);
  ASSERT_TRUE((*store)->Write(b).ok());
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(snap->jobs.size(), 2u);
  EXPECT_EQ(snap->jobs[1].request_id, "req-2");
}

// Failure budgets and the preemption opt-out (schema 4) round-trip; a version-3 file gets
// the spec defaults for its jobs and keeps everything else.
TEST(StoreTest, FailureBudgetsPersistAndAVersionThreeFileIsMigrated) {
  TempDir dir;
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok());
    JobRecord j = MakeJob("job-000001", 1);
    j.failures = 2;
    j.infra_failures = 7;
    j.max_infra_failures = 9;
    j.failure_window_s = 600;
    j.recent_failures = {{1000, true}, {2000, false}, {3000, true}};
    j.preemptible = false;
    Store::Batch b;
    b.jobs.push_back(j);
    ASSERT_TRUE((*store)->Write(b).ok());
    auto back = (*store)->LoadJob("job-000001");
    ASSERT_TRUE(back.ok() && back->has_value()) << back.status();
    EXPECT_EQ((*back)->infra_failures, 7);
    EXPECT_EQ((*back)->max_infra_failures, 9);
    EXPECT_EQ((*back)->failure_window_s, 600);
    ASSERT_EQ((*back)->recent_failures.size(), 3u);
    EXPECT_EQ((*back)->recent_failures[1].ms, 2000);
    EXPECT_FALSE((*back)->recent_failures[1].infra);
    EXPECT_TRUE((*back)->recent_failures[2].infra);
    EXPECT_FALSE((*back)->preemptible);
  }
  ASSERT_NO_FATAL_FAILURE(Downgrade(dir.path(), {kDropVersion5Columns, kDropVersion4Columns}, 3));
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].failures, 2);  // Old data intact.
  EXPECT_EQ(snap->jobs[0].infra_failures, 0);
  EXPECT_EQ(snap->jobs[0].max_infra_failures, 20);
  EXPECT_EQ(snap->jobs[0].failure_window_s, 86400);
  EXPECT_TRUE(snap->jobs[0].recent_failures.empty());
  EXPECT_TRUE(snap->jobs[0].preemptible);
}

// Multi-slot workers (schema 5): each rank's slot, device and node label in an attempt, and
// each worker's devices, survive a reopen; a file of schema 4 migrates to slot 0 for every
// rank and one slot per worker on its device.
TEST(StoreTest, SlotsOfAttemptsAndWorkersRoundTripAndMigrateFromVersionFour) {
  TempDir dir;
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    Store::Batch b;
    JobRecord j = MakeJob("job-000001", 1);
    j.attempts[0].slots = {3, 1};
    j.attempts[0].devices = {"cuda:3", "cuda:1"};
    j.attempts[0].node_labels = {"node-a", "node-a"};
    b.jobs.push_back(j);
    WorkerRecord w{"w-a", "a", "node-a", "cuda:0", "10.0.0.1", 4, 5, 6, "id"};
    w.devices = {"cuda:0", "cuda:1", "cuda:2", "cuda:3"};
    b.workers.push_back(w);
    ASSERT_TRUE((*store)->Write(b).ok());
    auto back = (*store)->LoadJob("job-000001");
    ASSERT_TRUE(back.ok() && back->has_value()) << back.status();
    EXPECT_EQ((*back)->attempts[0].slots, (std::vector<int>{3, 1}));
    EXPECT_EQ((*back)->attempts[0].devices, (std::vector<std::string>{"cuda:3", "cuda:1"}));
    EXPECT_EQ((*back)->attempts[0].node_labels, (std::vector<std::string>{"node-a", "node-a"}));
    auto worker = (*store)->LoadWorker("w-a");
    ASSERT_TRUE(worker.ok() && worker->has_value()) << worker.status();
    EXPECT_EQ((*worker)->devices, w.devices);
  }
  ASSERT_NO_FATAL_FAILURE(Downgrade(dir.path(), {kDropVersion5Columns}, 4));
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].attempts[0].worker_ids, (std::vector<std::string>{"w-a", "w-b"}));
  EXPECT_EQ(snap->jobs[0].attempts[0].slots, (std::vector<int>{0, 0}));
  EXPECT_TRUE(snap->jobs[0].attempts[0].devices.empty());
  ASSERT_EQ(snap->workers.size(), 1u);
  EXPECT_EQ(snap->workers[0].devices, (std::vector<std::string>(4, "cuda:0")));
}

// The goodput record (coordinator/goodput.h) is written with its job and read back whole; a
// job of a schema-5 file (before goodput accounting) reads as a record of zeros.
TEST(StoreTest, GoodputPersistsWithTheJobAndAVersionFiveFileIsMigrated) {
  TempDir dir;
  JobRecord j = MakeJob("job-000001", 1);
  GoodputSteps steps;
  GoodputStart(j.goodput, steps, 3, 2, 1'000);
  GoodputStep(j.goodput, steps, 1, 0.5, 2'000);
  GoodputCommit(j.goodput, steps, 1, 0.25, 2'500);
  GoodputEnd(j.goodput, v1::ATTEMPT_OUTCOME_PREEMPTED, 4'000);
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    Store::Batch b;
    b.jobs.push_back(j);
    ASSERT_TRUE((*store)->Write(b).ok());
  }
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    auto snap = (*store)->Load();
    ASSERT_TRUE(snap.ok()) << snap.status();
    ASSERT_EQ(snap->jobs.size(), 1u);
    EXPECT_EQ(EncodeGoodput(snap->jobs[0].goodput), EncodeGoodput(j.goodput));
    EXPECT_GT(snap->jobs[0].goodput.productive_gpu_s, 0);
  }
  ASSERT_NO_FATAL_FAILURE(Downgrade(dir.path(), {}, 5));
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->jobs.size(), 1u);
  EXPECT_EQ(snap->jobs[0].goodput.generation, 0);
  EXPECT_EQ(snap->jobs[0].goodput.productive_gpu_s, 0);
}

}  // namespace
}  // namespace ulysses::coordinator
