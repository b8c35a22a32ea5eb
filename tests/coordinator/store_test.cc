// Store: real SQLite files in a temp dir; "crash" = dropping the Store without any
// clean-up step and reopening the same file.
#include "coordinator/store.h"

#include <sqlite3.h>

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

TEST(StoreTest, FailedBatchLeavesNothingAndTurnsSticky) {
  TempDir dir;
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  // Fault injection with a real SQLite trigger: an event with sequence -1 aborts the
  // transaction after the job and worker rows of the same batch were written.
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir.path() + "/coordinator.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TRIGGER inject AFTER INSERT ON events WHEN NEW.sequence = -1 "
                           "BEGIN SELECT RAISE(ABORT, 'injected failure'); END",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  Store::Batch b;
  b.jobs.push_back(MakeJob("job-000001", 1));
  b.workers.push_back({"w-a", "a", "", "cpu", "h", 1, 0, 0});
  b.events.push_back({"job-000001", -1, 0, "x"});
  absl::Status s = (*store)->Write(b);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("injected failure"), std::string::npos) << s;
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok());
  EXPECT_TRUE(snap->jobs.empty());
  EXPECT_TRUE(snap->workers.empty());
  // Sticky: even a valid batch is refused now.
  Store::Batch ok_batch;
  ok_batch.jobs.push_back(MakeJob("job-000002", 2));
  EXPECT_FALSE((*store)->Write(ok_batch).ok());
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

}  // namespace
}  // namespace ulysses::coordinator
