// Goodput accounting through the real coordinator (gRPC, SQLite, /metrics) with FakeWorker
// peers: lost GPU time lands under the cause that ended the attempt, the figures add up,
// survive a coordinator restart and reach ulysses_lost_gpu_seconds_total and
// ulysses_job_goodput_ratio. The exact arithmetic is coordinator_job_machine_test
// (GoodputTest); here only what holds whatever the wall clock did. Part of
// coordinator_grpc_test.
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using testing::FakeWorker;
using testing::JobYaml;
using testing::PollUntil;

class GoodputGrpcTest : public testing::CoordinatorServerTest {
 protected:
  void Configure(CoordinatorConfig* c) override {
    // An ended attempt settles after max(graces) + heartbeat_timeout_s = 2.5 s.
    c->abort_grace_s = 0.2;
    c->cancel_grace_s = 0.5;
  }
  // Rank 0's step with its wall time, as the agent reports an engine step event.
  void Step(FakeWorker& w, const v1::WorkRef& ref, int64_t step) {
    v1::WorkerMessage m;
    *m.mutable_progress()->mutable_ref() = ref;
    v1::StepProgress* p = m.mutable_progress()->mutable_progress();
    p->set_stage(ref.stage());
    p->set_step(step);
    p->set_loss(2.0);
    p->set_tokens_per_s(100);
    p->set_step_seconds(0.01);
    ASSERT_TRUE(w.Send(std::move(m)));
  }
  // A committed checkpoint that blocked training for `blocked` seconds; waits for its Ack.
  void Commit(FakeWorker& w, const v1::Assignment& a, int64_t step, double blocked) {
    v1::WorkerMessage m;
    *m.mutable_checkpoint()->mutable_ref() = a.ref();
    v1::Checkpoint* c = m.mutable_checkpoint()->mutable_checkpoint();
    c->set_stage(a.ref().stage());
    c->set_step(step);
    c->set_path(a.checkpoint_dir() + "/step-" + std::to_string(step));
    c->set_bytes(1 << 20);
    c->set_seconds(blocked);
    c->set_blocked_seconds(blocked);
    auto ack = SendForAck(w, std::move(m));
    ASSERT_TRUE(ack.has_value());
    ASSERT_EQ(ack->result(), v1::ACK_CODE_OK) << ack->message();
  }
  // A sample's value in the /metrics text (-1 when absent).
  double Sample(const std::string& series) {
    for (absl::string_view line : absl::StrSplit(Metrics(), '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        double v = -1;
        return absl::SimpleAtod(line.substr(series.size() + 1), &v) ? v : -1;
      }
    }
    return -1;
  }
  static void ExpectAddsUp(const v1::Goodput& g) {
    const double parts = g.productive_gpu_seconds() + g.lost_failure_gpu_seconds() +
                         g.lost_preemption_gpu_seconds() + g.lost_restart_gpu_seconds() +
                         g.lost_checkpoint_stall_gpu_seconds() + g.lost_cancelled_gpu_seconds() +
                         g.uncommitted_gpu_seconds();
    EXPECT_NEAR(parts, g.allocated_gpu_seconds(), 1e-6) << g.DebugString();
    EXPECT_NEAR(g.ratio(), g.productive_gpu_seconds() / g.allocated_gpu_seconds(), 1e-12);
    EXPECT_GE(g.ratio(), 0);
    EXPECT_LE(g.ratio(), 1);
  }
};

TEST_F(GoodputGrpcTest, APreemptedAttemptsLostWorkIsUnderPreemptionAndSurvivesARestart) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  auto id = Submit(JobYaml("gp", "    - {seq_len: 256, steps: 8, sp_degree: 2}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto first = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(first.size(), 2u);
  for (auto& [rank, wa] : first) wa.first->Started(wa.second.ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  FakeWorker& r0 = *first[0].first;
  const v1::Assignment& a0 = first[0].second;
  Step(r0, a0.ref(), 1);
  Step(r0, a0.ref(), 2);
  Commit(r0, a0, 2, 0.001);
  Step(r0, a0.ref(), 3);
  // Training past the commit that the preemption throws away (the scenario's length).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  v1::WorkerMessage notice;
  *notice.mutable_preempting()->mutable_ref() = a0.ref();
  r0.Send(notice);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_CHECKPOINTING));
  r0.Exited(a0.ref(), 75);
  first[1].first->Exited(first[1].second.ref(), 75);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_PREEMPTED));
  const v1::Goodput ended = GetJob(*id).goodput();
  EXPECT_GE(ended.lost_preemption_gpu_seconds(), 2 * 0.05) << ended.DebugString();
  EXPECT_EQ(ended.lost_failure_gpu_seconds(), 0);
  EXPECT_EQ(ended.lost_cancelled_gpu_seconds(), 0);
  EXPECT_EQ(ended.uncommitted_gpu_seconds(), 0);
  EXPECT_GT(ended.allocated_gpu_seconds(), 0);
  ExpectAddsUp(ended);
  // The settled attempt reaches the counter (after its grace) and the store.
  ASSERT_TRUE(PollUntil(
      [&] {
        server_->coordinator()->TickForTesting();
        return Sample("ulysses_lost_gpu_seconds_total{reason=\"preemption\"}") > 0;
      },
      std::chrono::seconds(30)));
  EXPECT_NEAR(Sample("ulysses_lost_gpu_seconds_total{reason=\"preemption\"}"),
              ended.lost_preemption_gpu_seconds(), 1e-6);
  EXPECT_EQ(Sample("ulysses_lost_gpu_seconds_total{reason=\"failure\"}"), 0);
  EXPECT_NEAR(Sample("ulysses_productive_gpu_seconds_total"), ended.productive_gpu_seconds(), 1e-6);
  // The queued job's ratio is exported while it lives.
  EXPECT_NEAR(Sample("ulysses_job_goodput_ratio{job_id=\"" + *id + "\"}"), ended.ratio(), 1e-6);
  workers_.clear();
  RestartServer();
  const v1::Goodput restored = GetJob(*id).goodput();
  EXPECT_DOUBLE_EQ(restored.allocated_gpu_seconds(), ended.allocated_gpu_seconds());
  EXPECT_DOUBLE_EQ(restored.productive_gpu_seconds(), ended.productive_gpu_seconds());
  EXPECT_DOUBLE_EQ(restored.lost_preemption_gpu_seconds(), ended.lost_preemption_gpu_seconds());
  EXPECT_DOUBLE_EQ(restored.lost_restart_gpu_seconds(), ended.lost_restart_gpu_seconds());
  EXPECT_DOUBLE_EQ(restored.lost_checkpoint_stall_gpu_seconds(),
                   ended.lost_checkpoint_stall_gpu_seconds());
}

TEST_F(GoodputGrpcTest, AFailureIsUnderFailureAndAFinishedJobsRatioIsProductiveOverAllocated) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("gf", "    - {seq_len: 256, steps: 4, sp_degree: 1}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto a1 = w1.WaitAssignment();
  ASSERT_TRUE(a1.has_value());
  w1.Started(a1->ref());
  Step(w1, a1->ref(), 1);
  Commit(w1, *a1, 1, 0.001);
  Step(w1, a1->ref(), 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Work the failure loses.
  w1.Exited(a1->ref(), 1, "boom");
  auto a2 = w1.WaitAssignment();  // The restart (generation 2) settles generation 1.
  ASSERT_TRUE(a2.has_value());
  EXPECT_EQ(a2->ref().generation(), 2);
  const v1::Goodput failed = GetJob(*id).goodput();
  EXPECT_GE(failed.lost_failure_gpu_seconds(), 0.05) << failed.DebugString();
  EXPECT_EQ(failed.lost_preemption_gpu_seconds(), 0);
  ExpectAddsUp(failed);
  w1.Started(a2->ref());
  for (int64_t s = 2; s <= 4; ++s) Step(w1, a2->ref(), s);
  ASSERT_TRUE(w1.CommitLast(*a2).has_value());
  w1.Exited(a2->ref(), 0);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_SUCCEEDED));
  const v1::Goodput done = GetJob(*id).goodput();
  ExpectAddsUp(done);
  EXPECT_EQ(done.uncommitted_gpu_seconds(), 0);
  EXPECT_DOUBLE_EQ(done.lost_failure_gpu_seconds(), failed.lost_failure_gpu_seconds());
  EXPECT_GE(done.productive_gpu_seconds(), failed.productive_gpu_seconds());
  EXPECT_GT(done.allocated_gpu_seconds(), failed.allocated_gpu_seconds());
  // An ended job has no ratio series (like every per-job series).
  EXPECT_EQ(Sample("ulysses_job_goodput_ratio{job_id=\"" + *id + "\"}"), -1);
}

}  // namespace
}  // namespace ulysses::coordinator
