// Store: real SQLite files in a temp dir; "crash" = dropping the Store without any
// clean-up step and reopening the same file.
#include "coordinator/store.h"

#include <sqlite3.h>
#include <sys/resource.h>

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
       {"ALTER TABLE jobs DROP COLUMN owner", "ALTER TABLE jobs DROP COLUMN tenant",
        "ALTER TABLE workers DROP COLUMN identity",
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

}  // namespace
}  // namespace ulysses::coordinator
