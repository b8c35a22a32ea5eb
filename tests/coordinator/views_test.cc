// Proto views of the coordinator's records (coordinator/views.h).
#include "coordinator/views.h"

#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"

namespace ulysses::coordinator {
namespace {

using google::protobuf::util::TimeUtil;

JobRecord TwoStageJob() {
  JobRecord r;
  r.id = "job-000007";
  r.name = "demo";
  r.state = v1::JOB_STATE_RUNNING;
  r.reason = "all 2 ranks of stage 0 running";
  r.created_ms = 1'700'000'000'000;
  r.priority = 3;
  r.generation = 2;
  r.restarts = 1;
  r.checkpoint_dir = "/ckpt/job-000007";
  r.spec_yaml = "kind: TrainJob\n";
  StageRecord s0;
  s0.index = 0;
  s0.seq_len = 64;
  s0.steps = 10;
  s0.step = 4;
  s0.loss = 2.5;
  s0.sp = 2;
  s0.eval_seq_len = 64;
  s0.eval_loss = 2.25;
  s0.eval_accuracy = 0.5;
  s0.figures.set_mfu(0.25);
  s0.figures.set_slowest_rank(1);
  s0.figures.set_slowest_step_seconds(0.75);
  StageRecord s1;
  s1.index = 1;
  s1.seq_len = 128;
  s1.steps = 5;
  r.stages = {s0, s1};
  AttemptRecord a;
  a.generation = 2;
  a.worker_ids = {"w-a", "w-b"};
  a.master_port = 29500;
  r.attempts = {a};
  CheckpointRecord c;
  c.job_id = r.id;
  c.stage = 0;
  c.step = 4;
  c.path = "/ckpt/job-000007/step-00000004";
  c.committed_ms = 1'700'000'001'000;
  r.last_checkpoint = c;
  return r;
}

TEST(ViewsTest, JobShowsStagesProgressEvalAndCheckpoint) {
  v1::Job p = JobToProto(TwoStageJob(), /*full=*/true);
  EXPECT_EQ(p.id(), "job-000007");
  EXPECT_EQ(p.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(p.priority(), 3);
  EXPECT_EQ(p.generation(), 2);
  EXPECT_EQ(TimeUtil::TimestampToMilliseconds(p.created_at()), 1'700'000'000'000);
  EXPECT_EQ(TimeUtil::TimestampToMilliseconds(p.started_at()), 0);  // 0 = unset.
  ASSERT_EQ(p.stages_size(), 2);
  EXPECT_EQ(p.stages(0).sp(), 2);
  ASSERT_TRUE(p.stages(0).has_progress());
  EXPECT_EQ(p.stages(0).progress().step(), 4);
  EXPECT_EQ(p.stages(0).progress().steps(), 10);
  EXPECT_DOUBLE_EQ(p.stages(0).progress().loss(), 2.5);
  // Rank 0's timing figures, as far as it reported them.
  EXPECT_DOUBLE_EQ(p.stages(0).progress().mfu(), 0.25);
  EXPECT_EQ(p.stages(0).progress().slowest_rank(), 1);
  EXPECT_DOUBLE_EQ(p.stages(0).progress().slowest_step_seconds(), 0.75);
  EXPECT_FALSE(p.stages(0).progress().has_median_step_seconds());
  EXPECT_EQ(p.stages(0).progress().stage(), 0);
  ASSERT_TRUE(p.stages(0).has_eval());
  EXPECT_DOUBLE_EQ(p.stages(0).eval().accuracy(), 0.5);
  EXPECT_FALSE(p.stages(1).has_progress());  // No step yet.
  EXPECT_FALSE(p.stages(1).has_eval());
  ASSERT_TRUE(p.has_last_checkpoint());
  EXPECT_EQ(p.last_checkpoint().path(), "/ckpt/job-000007/step-00000004");
  ASSERT_EQ(p.attempts_size(), 1);
  EXPECT_EQ(p.attempts(0).worker_ids(1), "w-b");
  EXPECT_EQ(p.attempts(0).master_port(), 29500);
  EXPECT_EQ(p.spec_yaml(), "kind: TrainJob\n");
}

// Where each rank ran (slot, device, node) is in the attempt, with a warning for each SP
// group whose ranks are on more than one node (its all-to-all crosses the network).
TEST(ViewsTest, AttemptShowsEachRanksSlotDeviceAndNodeAndWarnsWhenAnSpGroupSpansNodes) {
  AttemptRecord a;
  a.generation = 1;
  a.worker_ids = {"w-n1", "w-n1", "w-n2", "w-n3"};
  a.slots = {0, 1, 0, 0};
  a.devices = {"cuda:0", "cuda:1", "cuda:0", "cuda:0"};
  a.node_labels = {"n1", "n1", "n2", "n3"};
  // sp 2 x dp 2: group 0 inside n1, group 1 across n2 and n3.
  v1::Attempt p = AttemptToProto(a, 2);
  EXPECT_EQ(std::vector<int>(p.slots().begin(), p.slots().end()), a.slots);
  EXPECT_EQ(std::vector<std::string>(p.devices().begin(), p.devices().end()), a.devices);
  EXPECT_EQ(std::vector<std::string>(p.node_labels().begin(), p.node_labels().end()),
            a.node_labels);
  ASSERT_EQ(p.warnings_size(), 1);
  EXPECT_EQ(p.warnings(0),
            "SP group 1 (ranks 2-3) spans nodes n2, n3: its all-to-all crosses the network (no "
            "node had 2 free slots)");
  // One SP group of 4 spans three nodes; sp 1 never warns.
  EXPECT_EQ(AttemptToProto(a, 4).warnings_size(), 1);
  EXPECT_EQ(AttemptToProto(a, 1).warnings_size(), 0);
}

TEST(ViewsTest, ListViewLeavesAttemptsOut) {
  v1::Job p = JobToProto(TwoStageJob(), /*full=*/false);
  EXPECT_EQ(p.attempts_size(), 0);
  EXPECT_EQ(p.stages_size(), 2);
}

TEST(ViewsTest, WorkerHeartbeatAgeComesFromTheSteadyClock) {
  WorkerRt w;
  w.rec.id = "w-a";
  w.rec.name = "a";
  w.rec.host = "10.0.0.1";
  w.state = v1::WORKER_STATE_BUSY;
  w.last_seen_steady = 5'000;
  v1::WorkRef ref;
  ref.set_job_id("job-000001");
  ref.set_rank(1);
  w.slots[0] = ref;
  v1::Worker p = WorkerToProto(w, /*now_steady_ms=*/7'500, /*now_unix_ms=*/1'700'000'010'000);
  EXPECT_EQ(p.id(), "w-a");
  EXPECT_EQ(p.state(), v1::WORKER_STATE_BUSY);
  EXPECT_DOUBLE_EQ(p.heartbeat_age_seconds(), 2.5);
  EXPECT_EQ(TimeUtil::TimestampToMilliseconds(p.last_heartbeat_at()), 1'700'000'007'500);
  EXPECT_EQ(p.running().ref().rank(), 1);
  // A clock that went backwards never shows a negative age.
  EXPECT_DOUBLE_EQ(WorkerToProto(w, 4'000, 1'700'000'010'000).heartbeat_age_seconds(), 0);
}

TEST(ViewsTest, CheckpointTextNamesWhereARestartBegins) {
  JobRecord r = TwoStageJob();
  EXPECT_EQ(CheckpointText(r), "the checkpoint of stage 1 of 2 at step 4");
  r.last_checkpoint.reset();
  EXPECT_EQ(CheckpointText(r), "the start of the stage (no committed checkpoint)");
}

TEST(ViewsTest, AttemptsAreBoundedInBytesKeepingTheNewest) {
  JobRecord r = TwoStageJob();
  r.attempts.clear();
  for (int g = 1; g <= 400; ++g) {
    AttemptRecord a;
    a.generation = g;
    for (int w = 0; w < 32; ++w) a.worker_ids.push_back("w-" + std::string(200, 'a' + w % 26));
    r.attempts.push_back(a);
  }
  v1::Job p = JobToProto(r, true);
  size_t bytes = 0;
  for (const v1::Attempt& a : p.attempts()) bytes += a.ByteSizeLong();
  EXPECT_LE(bytes, kMaxAttemptsViewBytes);
  ASSERT_GT(p.attempts_size(), 1);
  EXPECT_LT(p.attempts_size(), 400);
  EXPECT_EQ(p.attempts(p.attempts_size() - 1).generation(), 400);  // Newest last, in order.
  EXPECT_EQ(p.attempts(0).generation(), 400 - p.attempts_size() + 1);
  EXPECT_LT(p.ByteSizeLong(), 4u << 20);
}

}  // namespace
}  // namespace ulysses::coordinator
