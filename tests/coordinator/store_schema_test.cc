// The Store's column lists (coordinator/store_schema.h) against real SQLite files: a new
// file has exactly the listed columns, the versions already shipped keep their columns, a
// file written by schema 1 migrates to the same columns as a new file, and a record with
// every field set comes back equal.
#include "coordinator/store_schema.h"

#include <sqlite3.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "coordinator/failure_budget.h"
#include "coordinator/goodput.h"
#include "coordinator/store.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using store_schema::AllTables;
using store_schema::ColumnDef;
using store_schema::TableDef;
using testing::TempDir;

// One row of PRAGMA table_info: name, type, notnull, default ("" = none), pk position.
using ColumnInfo = std::tuple<std::string, std::string, int, std::string, int>;

class Db {
 public:
  explicit Db(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK) << path;
  }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void Exec(const std::string& sql) {
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK)
        << sql << ": " << (err ? err : "");
    sqlite3_free(err);
  }
  // Every row of `sql`, each column as text ("" for NULL).
  std::vector<std::vector<std::string>> Rows(const std::string& sql) {
    std::vector<std::vector<std::string>> rows;
    sqlite3_stmt* q = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &q, nullptr), SQLITE_OK) << sql;
    while (q != nullptr && sqlite3_step(q) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int c = 0; c < sqlite3_column_count(q); ++c) {
        const unsigned char* text = sqlite3_column_text(q, c);
        row.push_back(text ? reinterpret_cast<const char*>(text) : "");
      }
      rows.push_back(row);
    }
    sqlite3_finalize(q);
    return rows;
  }
  std::vector<ColumnInfo> TableInfo(const std::string& table) {
    std::vector<ColumnInfo> info;
    for (const auto& r : Rows("PRAGMA table_info(" + table + ")")) {
      info.emplace_back(r[1], r[2], std::stoi(r[3]), r[4], std::stoi(r[5]));
    }
    return info;
  }
  std::set<std::string> Tables() {
    std::set<std::string> names;
    for (const auto& r : Rows("SELECT name FROM sqlite_master WHERE type='table'")) {
      names.insert(r[0]);
    }
    return names;
  }

 private:
  sqlite3* db_ = nullptr;
};

std::string DbPath(const TempDir& dir) { return dir.path() + "/coordinator.db"; }

// What PRAGMA table_info must say of `c` in `table`, read off its declaration.
ColumnInfo Expected(const TableDef& table, const ColumnDef& c) {
  const std::string decl = c.decl;
  const std::string type = decl.substr(0, decl.find(' '));
  const int notnull = decl.find("NOT NULL") != std::string::npos ? 1 : 0;
  std::string dflt;
  if (size_t at = decl.find("DEFAULT "); at != std::string::npos) dflt = decl.substr(at + 8);
  int pk = decl.find("PRIMARY KEY") != std::string::npos ? 1 : 0;
  // A table constraint "PRIMARY KEY (a, b)": the column's position in it.
  const std::string constraints = table.constraints;
  if (size_t open = constraints.find("PRIMARY KEY ("); open != std::string::npos) {
    std::string keys = constraints.substr(open + 13, constraints.find(')') - open - 13);
    int position = 1;
    for (size_t start = 0; start <= keys.size(); ++position) {
      size_t end = keys.find(", ", start);
      if (end == std::string::npos) end = keys.size();
      if (keys.substr(start, end - start) == c.name) pk = position;
      start = end + 2;
    }
  }
  return {c.name, type, notnull, dflt, pk};
}

TEST(StoreSchemaTest, ANewFileHasExactlyTheListedColumnsInListOrder) {
  TempDir dir;
  ASSERT_TRUE(Store::Open(dir.path()).ok());
  Db db(DbPath(dir));
  std::set<std::string> listed;
  for (const TableDef& table : AllTables()) {
    listed.insert(table.name);
    std::vector<ColumnInfo> expected;
    int since = table.since;
    for (const ColumnDef& c : table.columns) {
      // The file's order is version order (ALTER TABLE appends): so must the list's be.
      EXPECT_GE(c.since, since) << table.name << "." << c.name << " is listed after a newer column";
      EXPECT_LE(c.since, kSchemaVersion) << table.name << "." << c.name;
      since = c.since;
      expected.push_back(Expected(table, c));
    }
    EXPECT_EQ(db.TableInfo(table.name), expected) << table.name;
  }
  EXPECT_EQ(db.Tables(), listed);  // No table outside the lists.
}

// The columns each shipped schema version added (files of these versions exist): a new
// column needs a new version, never an edit here. Append versions after 6 as they ship.
TEST(StoreSchemaTest, TheShippedVersionsKeepTheirColumns) {
  const std::map<std::string, std::vector<std::pair<int, std::string>>> shipped = {
      {"meta", {{1, "key"}, {1, "value"}}},
      {"jobs",
       {{1, "id"},
        {1, "number"},
        {1, "name"},
        {1, "spec_yaml"},
        {1, "state"},
        {1, "reason"},
        {1, "priority"},
        {1, "created_ms"},
        {1, "started_ms"},
        {1, "finished_ms"},
        {1, "state_entered_ms"},
        {1, "stage_index"},
        {1, "generation"},
        {1, "restarts"},
        {1, "preemptions"},
        {1, "failures"},
        {1, "preemptions_budget_used"},
        {1, "max_failures"},
        {1, "max_preemptions"},
        {1, "node_label"},
        {1, "checkpoint_dir"},
        {1, "out_dir"},
        {1, "loss"},
        {1, "not_before_ms"},
        {2, "owner"},
        {2, "tenant"},
        {4, "infra_failures"},
        {4, "max_infra_failures"},
        {4, "failure_window_s"},
        {4, "recent_failures"},
        {4, "preemptible"},
        {6, "goodput"}}},
      {"stages",
       {{1, "job_id"},
        {1, "idx"},
        {1, "state"},
        {1, "seq_len"},
        {1, "steps"},
        {1, "step"},
        {1, "sp"},
        {1, "dp"},
        {1, "loss"},
        {1, "tokens_per_s"},
        {1, "eval_loss"},
        {1, "eval_accuracy"},
        {1, "eval_seq_len"},
        {1, "attempts"},
        {1, "started_ms"},
        {1, "finished_ms"}}},
      {"attempts",
       {{1, "job_id"},
        {1, "generation"},
        {1, "stage"},
        {1, "worker_ids"},
        {1, "master_addr"},
        {1, "master_port"},
        {1, "started_ms"},
        {1, "ended_ms"},
        {1, "outcome"},
        {1, "exit_code"},
        {1, "reason"},
        {5, "slots"},
        {5, "devices"},
        {5, "node_labels"}}},
      {"workers",
       {{1, "id"},
        {1, "name"},
        {1, "node_label"},
        {1, "device"},
        {1, "host"},
        {1, "capacity"},
        {1, "registered_ms"},
        {1, "last_seen_ms"},
        {2, "identity"},
        {5, "devices"}}},
      {"checkpoints",
       {{1, "job_id"},
        {1, "generation"},
        {1, "stage"},
        {1, "step"},
        {1, "path"},
        {1, "bytes"},
        {1, "seconds"},
        {1, "committed_ms"}}},
      {"events", {{1, "job_id"}, {1, "sequence"}, {1, "time_ms"}, {1, "payload"}}},
      {"submit_requests", {{3, "request_id"}, {3, "job_id"}, {3, "request_hash"}}},
  };
  constexpr int kLastShipped = 6;
  std::set<std::string> seen;
  for (const TableDef& table : AllTables()) {
    auto it = shipped.find(table.name);
    if (it == shipped.end()) {
      EXPECT_GT(table.since, kLastShipped) << table.name << " is new: give it a new version";
      continue;
    }
    seen.insert(table.name);
    std::vector<std::pair<int, std::string>> listed;
    for (const ColumnDef& c : table.columns) {
      if (c.since <= kLastShipped) listed.emplace_back(c.since, c.name);
    }
    EXPECT_EQ(listed, it->second) << table.name;
  }
  EXPECT_EQ(seen.size(), shipped.size());  // No shipped table dropped.
}

// The tables as schema 1 created them (what ulysses-coordinator of schema 1 shipped).
constexpr const char* kVersionOneFile[] = {
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    "INSERT INTO meta VALUES('schema_version', '1')",
    R"sql(CREATE TABLE jobs (
      id TEXT PRIMARY KEY, number INTEGER NOT NULL, name TEXT NOT NULL, spec_yaml TEXT NOT NULL,
      state INTEGER NOT NULL, reason TEXT NOT NULL, priority INTEGER NOT NULL,
      created_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER NOT NULL,
      state_entered_ms INTEGER NOT NULL, stage_index INTEGER NOT NULL, generation INTEGER NOT NULL,
      restarts INTEGER NOT NULL, preemptions INTEGER NOT NULL, failures INTEGER NOT NULL,
      preemptions_budget_used INTEGER NOT NULL, max_failures INTEGER NOT NULL,
      max_preemptions INTEGER NOT NULL, node_label TEXT NOT NULL, checkpoint_dir TEXT NOT NULL,
      out_dir TEXT NOT NULL, loss REAL NOT NULL, not_before_ms INTEGER NOT NULL))sql",
    R"sql(CREATE TABLE stages (
      job_id TEXT NOT NULL, idx INTEGER NOT NULL, state INTEGER NOT NULL, seq_len INTEGER NOT NULL,
      steps INTEGER NOT NULL, step INTEGER NOT NULL, sp INTEGER NOT NULL, dp INTEGER NOT NULL,
      loss REAL NOT NULL, tokens_per_s REAL NOT NULL, eval_loss REAL NOT NULL,
      eval_accuracy REAL NOT NULL, eval_seq_len INTEGER NOT NULL, attempts INTEGER NOT NULL,
      started_ms INTEGER NOT NULL, finished_ms INTEGER NOT NULL, PRIMARY KEY (job_id, idx)))sql",
    R"sql(CREATE TABLE attempts (
      job_id TEXT NOT NULL, generation INTEGER NOT NULL, stage INTEGER NOT NULL,
      worker_ids TEXT NOT NULL, master_addr TEXT NOT NULL, master_port INTEGER NOT NULL,
      started_ms INTEGER NOT NULL, ended_ms INTEGER NOT NULL, outcome INTEGER NOT NULL,
      exit_code INTEGER NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (job_id, generation)))sql",
    R"sql(CREATE TABLE workers (
      id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, node_label TEXT NOT NULL,
      device TEXT NOT NULL, host TEXT NOT NULL, capacity INTEGER NOT NULL,
      registered_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL))sql",
    R"sql(CREATE TABLE checkpoints (
      job_id TEXT NOT NULL, generation INTEGER NOT NULL, stage INTEGER NOT NULL,
      step INTEGER NOT NULL, path TEXT NOT NULL, bytes INTEGER NOT NULL, seconds REAL NOT NULL,
      committed_ms INTEGER NOT NULL, PRIMARY KEY (job_id, stage, step)))sql",
    R"sql(CREATE TABLE events (
      job_id TEXT NOT NULL, sequence INTEGER NOT NULL, time_ms INTEGER NOT NULL,
      payload BLOB NOT NULL, PRIMARY KEY (job_id, sequence)))sql",
    // One row per table, positionally, as schema 1 wrote them.
    "INSERT INTO jobs VALUES('job-000007', 7, 'old', 'spec: 1', 2, 'running', 4, 100, 101, 0, "
    "102, 1, 3, 2, 1, 1, 1, 5, 6, 'gpu', '/ckpt/old', '/out/old', 1.5, 103)",
    "INSERT INTO stages VALUES('job-000007', 0, 3, 1024, 40, 40, 2, 1, 2.25, 900.5, 2.5, 0.75, "
    "512, 1, 110, 120)",
    "INSERT INTO attempts VALUES('job-000007', 3, 1, 'w-a,w-b', '10.0.0.9', 29500, 130, 0, 1, 0, "
    "'')",
    "INSERT INTO workers VALUES('w-a', 'a', 'gpu', 'cuda:0', '10.0.0.9', 2, 140, 150)",
    "INSERT INTO checkpoints VALUES('job-000007', 3, 0, 40, '/ckpt/old/s0-40', 999, 1.25, 160)",
    "INSERT INTO events VALUES('job-000007', 1, 170, x'0a0b')",
};

TEST(StoreSchemaTest, AVersionOneFileMigratesToTheColumnsOfANewFileAndKeepsItsRows) {
  TempDir fresh;
  ASSERT_TRUE(Store::Open(fresh.path()).ok());
  TempDir old;
  {
    Db db(DbPath(old));
    for (const char* sql : kVersionOneFile) db.Exec(sql);
  }
  auto store = Store::Open(old.path());
  ASSERT_TRUE(store.ok()) << store.status();
  {
    Db migrated(DbPath(old));
    Db made_new(DbPath(fresh));
    for (const TableDef& table : AllTables()) {
      EXPECT_EQ(migrated.TableInfo(table.name), made_new.TableInfo(table.name)) << table.name;
    }
  }
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->jobs.size(), 1u);
  const JobRecord& j = snap->jobs[0];
  EXPECT_EQ(j.id, "job-000007");
  EXPECT_EQ(j.state, static_cast<v1::JobState>(2));
  EXPECT_EQ(j.generation, 3);
  EXPECT_EQ(j.max_preemptions, 6);
  EXPECT_EQ(j.out_dir, "/out/old");
  EXPECT_EQ(j.loss, 1.5);
  EXPECT_EQ(j.not_before_ms, 103);
  // Added later: the migration's defaults.
  EXPECT_EQ(j.owner, "");
  EXPECT_EQ(j.max_infra_failures, 20);
  EXPECT_EQ(j.failure_window_s, 86400);
  EXPECT_TRUE(j.preemptible);
  EXPECT_EQ(EncodeGoodput(j.goodput), EncodeGoodput(GoodputRecord{}));
  ASSERT_EQ(j.stages.size(), 1u);
  EXPECT_EQ(j.stages[0].eval_seq_len, 512);
  EXPECT_EQ(j.stages[0].finished_ms, 120);
  ASSERT_EQ(j.attempts.size(), 1u);
  EXPECT_EQ(j.attempts[0].worker_ids, (std::vector<std::string>{"w-a", "w-b"}));
  EXPECT_EQ(j.attempts[0].slots, (std::vector<int>{0, 0}));  // Slot 0 for every rank.
  EXPECT_TRUE(j.attempts[0].devices.empty());
  ASSERT_TRUE(j.last_checkpoint.has_value());
  EXPECT_EQ(j.last_checkpoint->path, "/ckpt/old/s0-40");
  ASSERT_EQ(snap->workers.size(), 1u);
  EXPECT_EQ(snap->workers[0].last_seen_ms, 150);
  // One slot per capacity on its device.
  EXPECT_EQ(snap->workers[0].devices, (std::vector<std::string>{"cuda:0", "cuda:0"}));
  auto events = (*store)->LoadEvents("job-000007", 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].payload, std::string("\x0a\x0b"));
}

// Every stored field set, each to a value no other field of its record has (a swapped
// column shows).
JobRecord FullJob() {
  JobRecord j;
  j.id = "job-000042";
  j.number = 42;
  j.name = "full";
  j.owner = "alice";
  j.tenant = "research";
  j.spec_yaml = "apiVersion: ulysses/v1\nkind: TrainJob\n";
  j.state = v1::JOB_STATE_RUNNING;
  j.reason = "training stage 2";
  j.priority = 9;
  j.created_ms = 1001;
  j.started_ms = 1002;
  j.finished_ms = 1003;
  j.state_entered_ms = 1004;
  j.stage_index = 1;
  j.generation = 17;
  j.restarts = 11;
  j.preemptions = 12;
  j.failures = 13;
  j.infra_failures = 14;
  j.preemptions_budget_used = 15;
  j.max_failures = 16;
  j.max_infra_failures = 18;
  j.failure_window_s = 3600;
  j.recent_failures = {{5001, true}, {5002, false}};
  j.max_preemptions = 19;
  j.preemptible = false;
  j.node_label = "h100";
  j.checkpoint_dir = "/ckpt/full";
  j.out_dir = "/out/full";
  j.loss = 3.125;
  j.not_before_ms = 1005;
  j.request_id = "req-42";
  j.request_hash = "hash-42";
  j.goodput.allocated_gpu_s = 100.5;
  j.goodput.productive_gpu_s = 80.25;
  j.goodput.lost_gpu_s = {1.5, 2.5, 3.5, 4.5, 5.5};
  j.goodput.generation = 17;
  j.goodput.world = 4;
  j.goodput.started_ms = 1006;
  j.goodput.mark_ms = 1007;
  j.goodput.trained = true;
  j.goodput.ended_ms = 1008;
  j.goodput.settled = true;
  j.goodput.end_reason = LostReason::kCheckpointStall;
  for (int i = 0; i < 2; ++i) {
    StageRecord s;
    s.index = i;
    s.state = i == 0 ? v1::STAGE_STATE_COMPLETED : v1::STAGE_STATE_RUNNING;
    s.seq_len = 2048 << i;
    s.steps = 300 + i;
    s.step = 200 + i;
    s.sp = 4;
    s.dp = 2;
    s.loss = 2.5 + i;
    s.tokens_per_s = 1234.5 + i;
    s.eval_loss = 2.75 + i;
    s.eval_accuracy = 0.625 + i;
    s.eval_seq_len = 4096 + i;
    s.attempts = 5 + i;
    s.started_ms = 2001 + i;
    s.finished_ms = 2101 + i;
    j.stages.push_back(s);
  }
  for (int g = 16; g <= 17; ++g) {
    AttemptRecord a;
    a.generation = g;
    a.stage = 1;
    a.worker_ids = {"w-a", "w-b", "w-a"};
    a.slots = {0, 3, 1};
    a.devices = {"cuda:0", "cuda:3", "cuda:1"};
    a.node_labels = {"h100", "h100-b", "h100"};
    a.master_addr = "10.1.2.3";
    a.master_port = 29400 + g;
    a.started_ms = 3001 + g;
    a.ended_ms = g == 16 ? 3101 : 0;
    a.outcome = g == 16 ? v1::ATTEMPT_OUTCOME_FAILED : v1::ATTEMPT_OUTCOME_RUNNING;
    a.exit_code = g == 16 ? 7 : 0;
    a.reason = g == 16 ? "rank 1 exited 7" : "";
    j.attempts.push_back(a);
  }
  return j;
}

void ExpectSameJob(const JobRecord& got, const JobRecord& want) {
  EXPECT_EQ(got.id, want.id);
  EXPECT_EQ(got.number, want.number);
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.owner, want.owner);
  EXPECT_EQ(got.tenant, want.tenant);
  EXPECT_EQ(got.spec_yaml, want.spec_yaml);
  EXPECT_EQ(got.state, want.state);
  EXPECT_EQ(got.reason, want.reason);
  EXPECT_EQ(got.priority, want.priority);
  EXPECT_EQ(got.created_ms, want.created_ms);
  EXPECT_EQ(got.started_ms, want.started_ms);
  EXPECT_EQ(got.finished_ms, want.finished_ms);
  EXPECT_EQ(got.state_entered_ms, want.state_entered_ms);
  EXPECT_EQ(got.stage_index, want.stage_index);
  EXPECT_EQ(got.generation, want.generation);
  EXPECT_EQ(got.restarts, want.restarts);
  EXPECT_EQ(got.preemptions, want.preemptions);
  EXPECT_EQ(got.failures, want.failures);
  EXPECT_EQ(got.infra_failures, want.infra_failures);
  EXPECT_EQ(got.preemptions_budget_used, want.preemptions_budget_used);
  EXPECT_EQ(got.max_failures, want.max_failures);
  EXPECT_EQ(got.max_infra_failures, want.max_infra_failures);
  EXPECT_EQ(got.failure_window_s, want.failure_window_s);
  EXPECT_EQ(EncodeFailureMarks(got.recent_failures), EncodeFailureMarks(want.recent_failures));
  EXPECT_EQ(got.max_preemptions, want.max_preemptions);
  EXPECT_EQ(got.preemptible, want.preemptible);
  EXPECT_EQ(got.node_label, want.node_label);
  EXPECT_EQ(got.checkpoint_dir, want.checkpoint_dir);
  EXPECT_EQ(got.out_dir, want.out_dir);
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.not_before_ms, want.not_before_ms);
  EXPECT_EQ(got.request_id, want.request_id);
  EXPECT_EQ(got.request_hash, want.request_hash);
  EXPECT_EQ(EncodeGoodput(got.goodput), EncodeGoodput(want.goodput));
  ASSERT_EQ(got.stages.size(), want.stages.size());
  for (size_t i = 0; i < want.stages.size(); ++i) {
    const StageRecord& g = got.stages[i];
    const StageRecord& w = want.stages[i];
    SCOPED_TRACE("stage " + std::to_string(i));
    EXPECT_EQ(g.index, w.index);
    EXPECT_EQ(g.state, w.state);
    EXPECT_EQ(g.seq_len, w.seq_len);
    EXPECT_EQ(g.steps, w.steps);
    EXPECT_EQ(g.step, w.step);
    EXPECT_EQ(g.sp, w.sp);
    EXPECT_EQ(g.dp, w.dp);
    EXPECT_EQ(g.loss, w.loss);
    EXPECT_EQ(g.tokens_per_s, w.tokens_per_s);
    EXPECT_EQ(g.eval_loss, w.eval_loss);
    EXPECT_EQ(g.eval_accuracy, w.eval_accuracy);
    EXPECT_EQ(g.eval_seq_len, w.eval_seq_len);
    EXPECT_EQ(g.attempts, w.attempts);
    EXPECT_EQ(g.started_ms, w.started_ms);
    EXPECT_EQ(g.finished_ms, w.finished_ms);
  }
  ASSERT_EQ(got.attempts.size(), want.attempts.size());
  for (size_t i = 0; i < want.attempts.size(); ++i) {
    const AttemptRecord& g = got.attempts[i];
    const AttemptRecord& w = want.attempts[i];
    SCOPED_TRACE("attempt " + std::to_string(i));
    EXPECT_EQ(g.generation, w.generation);
    EXPECT_EQ(g.stage, w.stage);
    EXPECT_EQ(g.worker_ids, w.worker_ids);
    EXPECT_EQ(g.slots, w.slots);
    EXPECT_EQ(g.devices, w.devices);
    EXPECT_EQ(g.node_labels, w.node_labels);
    EXPECT_EQ(g.master_addr, w.master_addr);
    EXPECT_EQ(g.master_port, w.master_port);
    EXPECT_EQ(g.started_ms, w.started_ms);
    EXPECT_EQ(g.ended_ms, w.ended_ms);
    EXPECT_EQ(g.outcome, w.outcome);
    EXPECT_EQ(g.exit_code, w.exit_code);
    EXPECT_EQ(g.reason, w.reason);
  }
}

void ExpectSameWorker(const WorkerRecord& got, const WorkerRecord& want) {
  EXPECT_EQ(got.id, want.id);
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.node_label, want.node_label);
  EXPECT_EQ(got.device, want.device);
  EXPECT_EQ(got.host, want.host);
  EXPECT_EQ(got.capacity, want.capacity);
  EXPECT_EQ(got.registered_ms, want.registered_ms);
  EXPECT_EQ(got.last_seen_ms, want.last_seen_ms);
  EXPECT_EQ(got.identity, want.identity);
  EXPECT_EQ(got.devices, want.devices);
}

// A worker with every field set.
WorkerRecord FullWorker() {
  WorkerRecord worker;
  worker.id = "w-b";
  worker.name = "node-b";
  worker.node_label = "h100-b";
  worker.device = "cuda:2";
  worker.host = "10.1.2.4";
  worker.capacity = 3;
  worker.registered_ms = 4001;
  worker.last_seen_ms = 4002;
  worker.identity = "worker:node-b";
  worker.devices = {"cuda:2", "cuda:3", "cuda:5"};
  return worker;
}

TEST(StoreSchemaTest, AFullyPopulatedRecordOfEveryTableRoundTripsEveryField) {
  TempDir dir;
  const JobRecord job = FullJob();
  const WorkerRecord worker = FullWorker();
  const CheckpointRecord checkpoint{job.id, 17, 1, 201, "/ckpt/full/s1-201", 65536, 2.5, 4003};
  const EventRecord event{job.id, 9, 4004, std::string("\x01\x00\xff", 3)};
  {
    auto store = Store::Open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    Store::Batch b;
    b.jobs.push_back(job);
    b.workers.push_back(worker);
    b.checkpoints.push_back(checkpoint);
    b.events.push_back(event);
    ASSERT_TRUE((*store)->Write(b).ok());
  }
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  auto snap = (*store)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->jobs.size(), 1u);
  {
    SCOPED_TRACE("Load");
    ExpectSameJob(snap->jobs[0], job);
  }
  auto one = (*store)->LoadJob(job.id);
  ASSERT_TRUE(one.ok() && one->has_value()) << one.status();
  {
    SCOPED_TRACE("LoadJob");
    ExpectSameJob(**one, job);
  }
  ASSERT_EQ(snap->workers.size(), 1u);
  ExpectSameWorker(snap->workers[0], worker);
  auto w = (*store)->LoadWorker(worker.id);
  ASSERT_TRUE(w.ok() && w->has_value()) << w.status();
  ExpectSameWorker(**w, worker);
  auto checkpoints = (*store)->LoadCheckpoints(job.id);
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_EQ(checkpoints->size(), 1u);
  const CheckpointRecord& c = (*checkpoints)[0];
  EXPECT_EQ(
      std::tie(c.job_id, c.generation, c.stage, c.step, c.path, c.bytes, c.seconds, c.committed_ms),
      std::tie(checkpoint.job_id, checkpoint.generation, checkpoint.stage, checkpoint.step,
               checkpoint.path, checkpoint.bytes, checkpoint.seconds, checkpoint.committed_ms));
  ASSERT_TRUE(snap->jobs[0].last_checkpoint.has_value());
  EXPECT_EQ(snap->jobs[0].last_checkpoint->path, checkpoint.path);
  auto events = (*store)->LoadEvents(job.id, 10);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  const EventRecord& e = (*events)[0];
  EXPECT_EQ(std::tie(e.job_id, e.sequence, e.time_ms, e.payload),
            std::tie(event.job_id, event.sequence, event.time_ms, event.payload));
}

// SameRow (a re-registration that changes nothing stored writes nothing) compares every
// column the table stores, plain, list and encoded, and skips only the one excepted.
TEST(StoreSchemaTest, SameRowComparesEveryStoredColumnButTheOneExcepted) {
  const auto& workers = store_schema::WorkersTable();
  const WorkerRecord worker = FullWorker();
  EXPECT_TRUE(workers.SameRow(worker, worker));
  WorkerRecord later = worker;
  later.last_seen_ms += 1;
  EXPECT_FALSE(workers.SameRow(worker, later));
  EXPECT_TRUE(workers.SameRow(worker, later, "last_seen_ms"));
  WorkerRecord moved = later;
  moved.host = "10.1.2.5";
  EXPECT_FALSE(workers.SameRow(worker, moved, "last_seen_ms"));
  WorkerRecord regpu = later;
  regpu.devices.back() = "cuda:6";  // A list column.
  EXPECT_FALSE(workers.SameRow(worker, regpu, "last_seen_ms"));
  const auto& jobs = store_schema::JobsTable();
  const JobRecord job = FullJob();
  EXPECT_TRUE(jobs.SameRow(job, job));
  JobRecord other = job;
  other.goodput.productive_gpu_s += 1;  // An encoded column.
  EXPECT_FALSE(jobs.SameRow(job, other));
}

}  // namespace
}  // namespace ulysses::coordinator
