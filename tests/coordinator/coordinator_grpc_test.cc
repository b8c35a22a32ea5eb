// gRPC integration tests: an in-process CoordinatorServer on 127.0.0.1:0 (real gRPC,
// real SQLite in a temp dir, real metrics HTTP server) driven by FakeWorker protocol
// peers and JobService clients (fixture: grpc_fixture.h).
#include <sqlite3.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc/grpc_util.h"
#include "common/metrics/catalog.h"
#include "common/spec/job_spec_parser.h"
#include "coordinator/server.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"
#include "tests/testing/subprocess.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::coordinator {
namespace {

using testing::FakeWorker;
using testing::JobYaml;
using testing::PollUntil;
using testing::TempDir;

class CoordinatorGrpcTest : public testing::CoordinatorServerTest {};

TEST_F(CoordinatorGrpcTest, SubmitAssignsRanksAndProgressShowsInGetJob) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  FakeWorker& w3 = AddWorker("w3");
  auto id = Submit(JobYaml("demo", "    - {seq_len: 256, steps: 4, sp_degree: 2}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto assigned = CollectAssignments({&w1, &w2, &w3}, 2);
  ASSERT_EQ(assigned.size(), 2u);
  ASSERT_TRUE(assigned.count(0) && assigned.count(1));
  const v1::Assignment& a0 = assigned[0].second;
  const v1::Assignment& a1 = assigned[1].second;
  EXPECT_EQ(a0.ref().generation(), 1);
  EXPECT_EQ(a1.ref().generation(), 1);
  EXPECT_EQ(a0.world_size(), 2);
  EXPECT_EQ(a0.sp(), 2);
  EXPECT_EQ(a0.ref().job_id(), *id);
  // master_addr is rank 0's worker host; both ranks get the same rendezvous.
  EXPECT_EQ(a0.master_addr(), a1.master_addr());
  EXPECT_EQ(a0.master_port(), a1.master_port());
  EXPECT_GE(a0.master_port(), config_.rendezvous_port_min);
  EXPECT_LE(a0.master_port(), config_.rendezvous_port_max);
  std::string rank0_host = assigned[0].first == &w1   ? "10.0.0.1"
                           : assigned[0].first == &w2 ? "10.0.0.2"
                                                      : "10.0.0.3";
  EXPECT_EQ(a0.master_addr(), rank0_host);
  EXPECT_EQ(a0.checkpoint_dir(), config_.checkpoint_root + "/" + *id);
  // The checkpoint directory is in the spec document itself, not an override the engine
  // would parse again (engine_spec.h).
  EXPECT_EQ(a0.overrides_size(), 0);
  absl::StatusOr<spec::JobSpec> engine_spec = spec::ParseJobSpec(a0.spec_yaml());
  ASSERT_TRUE(engine_spec.ok()) << engine_spec.status();
  EXPECT_EQ(engine_spec->checkpoint.dir, a0.checkpoint_dir());
  EXPECT_NE(a0.spec_yaml().find("seq_len: 256"), std::string::npos);
  // The third worker got nothing.
  std::set<FakeWorker*> used = {assigned[0].first, assigned[1].first};
  for (FakeWorker* w : {&w1, &w2, &w3}) {
    if (!used.count(w)) {
      EXPECT_FALSE(w->WaitAssignment(std::chrono::milliseconds(300)));
    }
  }
  EXPECT_EQ(GetJob(*id).state(), v1::JOB_STATE_SCHEDULING);

  for (auto& [rank, wa] : assigned) wa.first->Started(wa.second.ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  assigned[0].first->Progress(a0.ref(), 3, 2.5, 1234);
  ASSERT_TRUE(PollUntil([&] { return GetJob(*id).stages(0).progress().step() == 3; }));
  v1::Job job = GetJob(*id);
  EXPECT_DOUBLE_EQ(job.stages(0).progress().loss(), 2.5);
  EXPECT_DOUBLE_EQ(job.stages(0).progress().tokens_per_s(), 1234);
  EXPECT_DOUBLE_EQ(job.loss(), 2.5);

  const std::string step4 = a0.checkpoint_dir() + "/step-00000004";
  testing::WriteCommittedCheckpoint(step4, 0, 4);
  uint64_t seq = assigned[0].first->Checkpoint(a0.ref(), 4, step4);
  auto ack = assigned[0].first->WaitAck(seq);
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->result(), v1::ACK_CODE_OK);
  for (auto& [rank, wa] : assigned) wa.first->Exited(wa.second.ref(), 0);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_SUCCEEDED));
  job = GetJob(*id);
  EXPECT_EQ(job.last_checkpoint().step(), 4);
  EXPECT_EQ(job.last_checkpoint().path(), step4);
  EXPECT_EQ(job.stages(0).state(), v1::STAGE_STATE_COMPLETED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_TRUE(job.has_finished_at());
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_SUCCEEDED);
}

TEST_F(CoordinatorGrpcTest, HeartbeatLossAbortsSurvivorsAndRestartsWithNewGeneration) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  auto id = Submit(JobYaml("lossy", "    - {seq_len: 256, steps: 4, sp_degree: 2}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto first = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(first.size(), 2u);
  for (auto& [rank, wa] : first) wa.first->Started(wa.second.ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));

  FakeWorker* victim = first[1].first;
  FakeWorker* survivor = first[0].first;
  victim->Disconnect();  // No more heartbeats, no goodbye.
  FakeWorker& w3 = AddWorker("w3");
  auto abort = survivor->WaitAbort(std::chrono::seconds(10));
  ASSERT_TRUE(abort) << "survivor was not told to abort";
  EXPECT_EQ(abort->ref().generation(), 1);
  EXPECT_EQ(abort->ref().job_id(), *id);
  EXPECT_GT(abort->grace_period_ms(), 0);
  EXPECT_NE(abort->reason().find("lost"), std::string::npos) << abort->reason();
  v1::Job job = GetJob(*id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.failures(), 0);
  EXPECT_EQ(job.infra_failures(), 1);  // A lost worker is an infrastructure failure.
  EXPECT_EQ(job.counting_infra_failures(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LOST);

  // The survivor's rank is killed; it reports the exit and becomes free again.
  survivor->Exited(first[0].second.ref(), 137);
  auto second = CollectAssignments({survivor, &w3}, 2);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].second.ref().generation(), 2);
  EXPECT_EQ(second[1].second.ref().generation(), 2);

  // Fencing: a late report from generation 1 is rejected.
  uint64_t seq = survivor->Progress(first[0].second.ref(), 2, 1.0);
  auto ack = survivor->WaitAck(seq);
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->result(), v1::ACK_CODE_STALE);
  EXPECT_NE(ack->message().find("stale generation 1"), std::string::npos) << ack->message();
  EXPECT_FALSE(GetJob(*id).stages(0).has_progress());
}

TEST_F(CoordinatorGrpcTest, Exit75CountsAsPreemptionNotFailure) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  auto id = Submit(
      JobYaml("preempt", "    - {seq_len: 256, steps: 4, sp_degree: 2}\n", "{max_failures: 1}"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto first = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(first.size(), 2u);
  for (auto& [rank, wa] : first) wa.first->Started(wa.second.ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  v1::WorkerMessage notice;
  *notice.mutable_preempting()->mutable_ref() = first[0].second.ref();
  first[0].first->Send(notice);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_CHECKPOINTING));
  first[0].first->Checkpoint(first[0].second.ref(), 2,
                             first[0].second.checkpoint_dir() + "/step-00000002");
  first[0].first->Exited(first[0].second.ref(), 75);
  auto abort = first[1].first->WaitAbort();
  ASSERT_TRUE(abort);
  first[1].first->Exited(first[1].second.ref(), 75);
  // The worker that announced its own shutdown drains: generation 2 waits for a replacement
  // and never lands on it.
  FakeWorker* draining = first[0].first;
  FakeWorker* survivor = first[1].first;
  FakeWorker& w3 = AddWorker("w3");
  auto second = CollectAssignments({survivor, &w3}, 2);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].second.ref().generation(), 2);
  EXPECT_EQ(second[1].second.ref().generation(), 2);
  EXPECT_FALSE(draining->WaitAssignment(std::chrono::milliseconds(200)).has_value())
      << "work was placed on a draining worker";
  // ListWorkers shows which worker drains (ulyssesctl get workers: "IDLE,DRAINING").
  grpc::ClientContext list_ctx;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(jobs_->ListWorkers(&list_ctx, v1::ListWorkersRequest(), &workers).ok());
  int draining_seen = 0;
  for (const v1::Worker& w : workers.workers()) {
    EXPECT_EQ(w.draining(), w.name() == draining->name()) << w.name();
    draining_seen += w.draining() ? 1 : 0;
  }
  EXPECT_EQ(draining_seen, 1);
  v1::Job job = GetJob(*id);
  EXPECT_EQ(job.preemptions(), 1);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.failures(), 0);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_EQ(job.last_checkpoint().step(), 2);
}

// The grace ran out and the worker SIGKILLed its preempted rank: still a preemption
// (contract::OutcomeOf), resumed from the last committed checkpoint, not a failure.
TEST_F(CoordinatorGrpcTest, PreemptedRankKilledAfterItsGraceIsAPreemption) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("killed", "    - {seq_len: 256, steps: 4}\n",
                           "{max_failures: 1, max_infra_failures: 1}"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto first = CollectAssignments({&w1}, 1);
  ASSERT_EQ(first.size(), 1u);
  w1.Started(first[0].second.ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  w1.Killed(first[0].second.ref(), SIGKILL, /*preempted=*/true);
  // The attempt ends at once (the job then requeues, so its state moves on).
  ASSERT_TRUE(PollUntil(
      [&] {
        v1::Job j = GetJob(*id);
        return j.attempts_size() > 0 && j.attempts(0).outcome() != v1::ATTEMPT_OUTCOME_RUNNING;
      },
      std::chrono::seconds(15)));
  v1::Job job = GetJob(*id);
  EXPECT_EQ(job.preemptions(), 1);
  EXPECT_EQ(job.failures(), 0);
  EXPECT_EQ(job.restarts(), 0);
  ASSERT_GE(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_EQ(job.attempts(0).exit_code(), 128 + SIGKILL);
  EXPECT_NE(job.attempts(0).reason().find("was killed by signal 9"), std::string::npos)
      << job.attempts(0).reason();

  // Without a preemption request the same kill is an (infrastructure) failure.
  auto second = CollectAssignments({&w1}, 1);
  ASSERT_EQ(second.size(), 1u);
  w1.Started(second[0].second.ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  w1.Killed(second[0].second.ref(), SIGKILL, /*preempted=*/false);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_FAILED));  // max_infra_failures: 1
  EXPECT_EQ(GetJob(*id).infra_failures(), 1);
  EXPECT_EQ(GetJob(*id).failures(), 0);
}

// Priority preemption over the real session protocol: the low job's ranks are asked to
// checkpoint and stop (Abort.preempt), the high job gets their workers, and the low job
// resumes from its preemption checkpoint once they are free again.
TEST_F(CoordinatorGrpcTest, AHighPriorityJobPreemptsARunningLowOne) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  auto low = Submit(JobYaml("low", "    - {seq_len: 256, steps: 8, sp_degree: 2}\n"));
  ASSERT_TRUE(low.ok()) << low.status();
  auto first = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(first.size(), 2u);
  for (auto& [rank, wa] : first) wa.first->Started(wa.second.ref());
  ASSERT_TRUE(WaitState(*low, v1::JOB_STATE_RUNNING));
  first[0].first->Checkpoint(first[0].second.ref(), 2,
                             first[0].second.checkpoint_dir() + "/step-00000002");

  auto high =
      Submit(JobYaml("high", "    - {seq_len: 256, steps: 2, sp_degree: 2}\n", "{priority: 10}"));
  ASSERT_TRUE(high.ok()) << high.status();
  for (auto& [rank, wa] : first) {
    auto abort = wa.first->WaitAbort();
    ASSERT_TRUE(abort) << "rank " << rank << " was not asked to stop";
    EXPECT_TRUE(abort->preempt());
    EXPECT_EQ(abort->ref().job_id(), *low);
    EXPECT_EQ(abort->grace_period_ms(), 30000);  // cancel_grace_s.
  }
  v1::Job job = GetJob(*low);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CHECKPOINTING);
  EXPECT_NE(job.reason().find("preempted for " + *high + " (priority 10 > 0)"), std::string::npos)
      << job.reason();
  EXPECT_NE(GetJob(*high).reason().find("preempting " + *low), std::string::npos)
      << GetJob(*high).reason();
  // The ranks commit the preemption checkpoint and exit 75; the workers go to the high job.
  first[0].first->Checkpoint(first[0].second.ref(), 3,
                             first[0].second.checkpoint_dir() + "/step-00000003");
  for (auto& [rank, wa] : first) wa.first->Exited(wa.second.ref(), 75);
  auto second = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(second.size(), 2u);
  for (auto& [rank, wa] : second) {
    EXPECT_EQ(wa.second.ref().job_id(), *high);
    wa.first->Started(wa.second.ref());
  }
  job = GetJob(*low);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PREEMPTED);
  EXPECT_EQ(job.preemptions(), 1);
  EXPECT_EQ(job.failures() + job.infra_failures(), 0);
  EXPECT_EQ(job.last_checkpoint().step(), 3);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_PREEMPTED);
  // The high job finishes; the low one resumes (generation 2) on the same workers.
  ASSERT_TRUE(second[0].first->CommitLast(second[0].second));
  for (auto& [rank, wa] : second) wa.first->Exited(wa.second.ref(), 0);
  ASSERT_TRUE(WaitState(*high, v1::JOB_STATE_SUCCEEDED));
  auto third = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(third.size(), 2u);
  for (auto& [rank, wa] : third) {
    EXPECT_EQ(wa.second.ref().job_id(), *low);
    EXPECT_EQ(wa.second.ref().generation(), 2);
  }
}

TEST_F(CoordinatorGrpcTest, StageTransitionChangesGroupSize) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  auto id = Submit(JobYaml("staged",
                           "    - {seq_len: 256, steps: 2, sp_degree: 1}\n"
                           "    - {seq_len: 512, steps: 2, sp_degree: 2}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto s0 = CollectAssignments({&w1, &w2}, 1);
  ASSERT_EQ(s0.size(), 1u);
  EXPECT_EQ(s0[0].second.world_size(), 1);
  EXPECT_EQ(s0[0].second.ref().stage(), 0);
  s0[0].first->Started(s0[0].second.ref());
  s0[0].first->Exited(s0[0].second.ref(), 0);
  auto s1 = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s1[0].second.world_size(), 2);
  EXPECT_EQ(s1[1].second.ref().stage(), 1);
  EXPECT_EQ(s1[1].second.ref().generation(), 2);
  EXPECT_EQ(s1[1].second.seq_len(), 512);
  v1::Job job = GetJob(*id);
  EXPECT_EQ(job.stage_index(), 1);
  EXPECT_EQ(job.stages(0).state(), v1::STAGE_STATE_COMPLETED);
  EXPECT_EQ(job.stages(1).state(), v1::STAGE_STATE_RUNNING);
  ASSERT_TRUE(s1[0].first->CommitLast(s1[0].second));
  for (auto& [rank, wa] : s1) wa.first->Exited(wa.second.ref(), 0);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_SUCCEEDED));
  EXPECT_EQ(GetJob(*id).stage_index(), 2);
}

TEST_F(CoordinatorGrpcTest, Exit2FailsImmediatelyWithTheMessage) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("badinput", "    - {seq_len: 256, steps: 2}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a);
  w1.Exited(a->ref(), 2, "data.train: /nope.bin does not exist");
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_FAILED));
  v1::Job job = GetJob(*id);
  EXPECT_NE(job.reason().find("/nope.bin does not exist"), std::string::npos) << job.reason();
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_BAD_INPUT);
  EXPECT_FALSE(w1.WaitAssignment(std::chrono::milliseconds(300)));
}

TEST_F(CoordinatorGrpcTest, RankFailuresRetryUpToMaxFailures) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("flaky", "    - {seq_len: 256, steps: 2}\n", "{max_failures: 2}"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto a1 = w1.WaitAssignment();
  ASSERT_TRUE(a1);
  w1.Exited(a1->ref(), 1, "boom");
  auto a2 = w1.WaitAssignment();
  ASSERT_TRUE(a2);
  EXPECT_EQ(a2->ref().generation(), 2);
  w1.Exited(a2->ref(), 1, "boom again");
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_FAILED));
  v1::Job job = GetJob(*id);
  EXPECT_EQ(job.failures(), 2);
  EXPECT_NE(job.reason().find("boom again"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("max_failures 2"), std::string::npos) << job.reason();
}

TEST_F(CoordinatorGrpcTest, PendingJobExplainsWhyAndHigherPriorityGoesFirst) {
  auto low =
      Submit(JobYaml("low", "    - {seq_len: 256, steps: 2, sp_degree: 2}\n", "{priority: 0}"));
  auto high =
      Submit(JobYaml("high", "    - {seq_len: 256, steps: 2, sp_degree: 2}\n", "{priority: 10}"));
  ASSERT_TRUE(low.ok() && high.ok());
  FakeWorker& w1 = AddWorker("w1");
  // One slot in the whole cluster: the reason says the job cannot run until it grows.
  ASSERT_TRUE(PollUntil([&] {
    return GetJob(*high).reason() ==
           "stage 1 of 1: needs 2 free slots, 1 available; unschedulable: the registered workers "
           "have 1 slot in all for a group of 2 (start workers with a larger --capacity, add "
           "workers, or lower the stage's sp_degree x dp_degree)";
  })) << GetJob(*high).reason();
  EXPECT_EQ(GetJob(*high).state(), v1::JOB_STATE_PENDING);
  FakeWorker& w2 = AddWorker("w2");
  auto a = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].second.ref().job_id(), *high);
  EXPECT_EQ(GetJob(*low).state(), v1::JOB_STATE_PENDING);
  EXPECT_TRUE(PollUntil([&] {
    return GetJob(*low).reason() == "stage 1 of 1: needs 2 free slots, 0 available";
  })) << GetJob(*low).reason();
}

// A job whose stage needs more slots than the registered cluster has in all is accepted (the
// cluster may grow) with an Unschedulable condition naming the stage, what it needs, what the
// cluster has and the fix: in the SubmitJob response, GetJob, the watch snapshot, and as a
// persisted event. A worker that brings the slots clears it (an event too) and the job runs.
TEST_F(CoordinatorGrpcTest, AJobLargerThanTheClusterIsAcceptedAsUnschedulableUntilItGrows) {
  FakeWorker& w1 = AddWorker("w1");  // registered (one slot) when AddWorker returns
  v1::SubmitJobRequest req;
  req.set_spec_yaml(JobYaml("big",
                            "    - {seq_len: 256, steps: 1}\n"
                            "    - {seq_len: 512, steps: 1, sp_degree: 2}\n"));
  v1::SubmitJobResponse resp;
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    grpc::Status s = jobs_->SubmitJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string id = resp.job_id();
  const std::string message =
      "stage 2 of 2 needs 2 slots (sp 2 x dp 1); the registered workers have 1 slot in all for "
      "a group of 2 (start workers with a larger --capacity, add workers, or lower the stage's "
      "sp_degree x dp_degree)";
  ASSERT_EQ(resp.job().conditions_size(), 1) << resp.job().DebugString();
  const v1::JobCondition& c = resp.job().conditions(0);
  EXPECT_EQ(c.type(), "Unschedulable");
  EXPECT_TRUE(c.status());
  EXPECT_EQ(c.reason(), "ClusterTooSmall");
  EXPECT_EQ(c.stage(), 1);  // 0-based in the API; "stage 2 of 2" in the message
  EXPECT_EQ(c.message(), message);
  EXPECT_TRUE(c.has_last_transition_time());
  // Watch from here: the snapshot carries the condition, the stream its clearing.
  std::mutex mu;
  std::vector<v1::JobEvent> events;  // guarded by mu
  std::promise<void> subscribed;
  grpc::ClientContext watch_ctx;
  SetDeadlineAfter(&watch_ctx, absl::Seconds(60));
  std::thread watcher([&] {
    v1::WatchJobRequest wreq;
    wreq.set_job_id(id);
    auto reader = jobs_->WatchJob(&watch_ctx, wreq);
    v1::JobEvent ev;
    bool first = true;
    while (reader->Read(&ev)) {
      {
        std::lock_guard<std::mutex> lock(mu);
        events.push_back(ev);
      }
      if (first) subscribed.set_value();
      first = false;
    }
    if (first) subscribed.set_value();
    reader->Finish();
  });
  absl::Cleanup stop_watcher = [&] {
    if (!watcher.joinable()) return;
    watch_ctx.TryCancel();
    watcher.join();
  };
  subscribed.get_future().wait();
  // Stage 1 (one slot) runs meanwhile; the condition stays and is persisted as one event.
  auto a1 = w1.WaitAssignment();
  ASSERT_TRUE(a1);
  v1::Job job = GetJob(id);
  ASSERT_EQ(job.conditions_size(), 1);
  EXPECT_EQ(job.conditions(0).message(), message);
  int condition_events = 0;
  for (const v1::JobEvent& e : job.events()) {
    if (e.has_condition()) {
      ++condition_events;
      EXPECT_TRUE(e.condition().status());
      EXPECT_EQ(e.condition().message(), message);
    }
  }
  EXPECT_EQ(condition_events, 1) << job.DebugString();
  // The cluster grows to 2 slots: the condition clears before stage 2 needs them.
  FakeWorker& w2 = AddWorker("w2");
  ASSERT_TRUE(PollUntil([&] { return GetJob(id).conditions_size() == 0; }))
      << GetJob(id).DebugString();
  job = GetJob(id);
  ASSERT_FALSE(job.events().empty());
  bool cleared = false;
  for (const v1::JobEvent& e : job.events())
    cleared |= e.has_condition() && !e.condition().status();
  EXPECT_TRUE(cleared) << job.DebugString();
  w1.Started(a1->ref());
  ASSERT_TRUE(w1.CommitLast(*a1));
  w1.Exited(a1->ref(), 0);
  auto a = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].second.ref().stage(), 1);
  ASSERT_TRUE(PollUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return std::any_of(events.begin(), events.end(), [](const v1::JobEvent& e) {
      return e.has_condition() && !e.condition().status();
    });
  }));
  watch_ctx.TryCancel();
  watcher.join();
  ASSERT_FALSE(events.empty());
  ASSERT_TRUE(events.front().has_snapshot());
  ASSERT_EQ(events.front().snapshot().conditions_size(), 1);
  EXPECT_EQ(events.front().snapshot().conditions(0).message(), message);
}

TEST_F(CoordinatorGrpcTest, BadSpecIsRejectedWithTheValidationMessageAndNoTrace) {
  auto id = Submit(JobYaml("bad", "    - {seq_len: 255, steps: 2, sp_degree: 2}\n"));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(id.status().message()).find("spec.stages[0].seq_len: 255"),
            std::string::npos)
      << id.status();
  // Nothing was written: no job row, and ListJobs is empty.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir_.path() + "/coordinator.db").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM jobs", -1, &q, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(q, 0), 0);
  sqlite3_finalize(q);
  sqlite3_close(db);
  v1::ListJobsResponse list;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(5));
  ASSERT_TRUE(jobs_->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  // The next valid job still gets the first id.
  auto ok = Submit(JobYaml("good", "    - {seq_len: 256, steps: 2}\n"));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "job-000001");
}

TEST_F(CoordinatorGrpcTest, WatchJobStreamsSnapshotThenEventsAndEnds) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("watched", "    - {seq_len: 256, steps: 2}\n"));
  ASSERT_TRUE(id.ok());
  std::vector<v1::JobEvent> events;
  grpc::Status final_status;
  // The worker is driven only once the stream has delivered its snapshot: a watch that
  // starts after the job ended gets just the snapshot, which is not what this tests.
  std::promise<void> subscribed;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(30));
  std::thread watcher([&] {
    v1::WatchJobRequest req;
    req.set_job_id(*id);
    auto reader = jobs_->WatchJob(&ctx, req);
    v1::JobEvent ev;
    bool first = true;
    while (reader->Read(&ev)) {
      events.push_back(ev);
      if (first) subscribed.set_value();
      first = false;
    }
    if (first) subscribed.set_value();  // stream ended without a snapshot: fail below
    final_status = reader->Finish();
  });
  // A failed ASSERT below returns with the watcher still reading: end its stream and
  // join it, so the test reports its failure instead of std::terminate on a joinable thread.
  absl::Cleanup stop_watcher = [&] {
    if (!watcher.joinable()) return;
    ctx.TryCancel();
    watcher.join();
  };
  subscribed.get_future().wait();
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a);
  w1.Started(a->ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  w1.Progress(a->ref(), 1, 3.0);
  w1.Progress(a->ref(), 2, 2.0);
  ASSERT_TRUE(w1.CommitLast(*a));
  w1.Exited(a->ref(), 0);
  watcher.join();
  EXPECT_TRUE(final_status.ok()) << final_status.error_message();
  ASSERT_GE(events.size(), 4u);
  EXPECT_TRUE(events.front().has_snapshot());
  EXPECT_EQ(events.front().snapshot().id(), *id);
  int progress = 0;
  for (const auto& e : events) progress += e.has_progress();
  EXPECT_EQ(progress, 2);
  ASSERT_TRUE(events.back().has_state_change());
  EXPECT_EQ(events.back().state_change().to(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorGrpcTest, LogsTailAndCancelAndResume) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("logs", "    - {seq_len: 256, steps: 2}\n"));
  ASSERT_TRUE(id.ok());
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a);
  w1.Log(a->ref(), "line one");
  w1.Log(a->ref(), "line two");
  ASSERT_TRUE(PollUntil([&] {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    v1::GetJobLogsRequest req;
    req.set_job_id(*id);
    req.set_tail_lines(2);
    auto reader = jobs_->GetJobLogs(&ctx, req);
    std::vector<std::string> lines;
    v1::GetJobLogsResponse resp;
    while (reader->Read(&resp)) {
      for (const auto& l : resp.lines()) lines.push_back(l.text());
    }
    return reader->Finish().ok() && lines == std::vector<std::string>{"line one", "line two"};
  }));
  // Cancel: the rank is aborted and the job is CANCELLED; resume requeues it.
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    v1::CancelJobRequest req;
    req.set_job_id(*id);
    v1::CancelJobResponse resp;
    ASSERT_TRUE(jobs_->CancelJob(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.job().state(), v1::JOB_STATE_CANCELLED);
  }
  auto abort = w1.WaitAbort();
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->ref().generation(), 1);
  w1.Exited(a->ref(), 143);
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    v1::CancelJobRequest req;
    req.set_job_id(*id);
    v1::CancelJobResponse resp;
    grpc::Status again = jobs_->CancelJob(&ctx, req, &resp);
    EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    v1::ResumeJobRequest req;
    req.set_job_id(*id);
    v1::ResumeJobResponse resp;
    ASSERT_TRUE(jobs_->ResumeJob(&ctx, req, &resp).ok());
  }
  auto again = w1.WaitAssignment();
  ASSERT_TRUE(again);
  EXPECT_EQ(again->ref().generation(), 2);
}

// The finding (issue 44): `logs -f` showed no training progress. Rank 0's progress becomes a
// job log line, at most one per progress_log_interval_s (10 s) and the stage's last step
// always, with the stage counted from 1 as people read it.
TEST_F(CoordinatorGrpcTest, LogsCarryRankZerosProgressRateLimited) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("chatty", "    - {seq_len: 256, steps: 50}\n"));
  ASSERT_TRUE(id.ok());
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a);
  w1.Started(a->ref());
  v1::GetJobLogsRequest follow;
  follow.set_job_id(*id);
  follow.set_follow(true);
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(30));
  auto reader = jobs_->GetJobLogs(&ctx, follow);
  for (int step = 1; step <= 5; ++step) w1.Progress(a->ref(), step, 4.5, 1234);
  w1.Progress(a->ref(), 50, 2.25, 1234);
  std::vector<std::string> progress;
  v1::GetJobLogsResponse r;
  while (progress.size() < 2 && reader->Read(&r)) {
    for (const v1::LogLine& line : r.lines()) {
      if (absl::StartsWith(line.text(), "progress: ")) progress.push_back(line.text());
    }
  }
  ctx.TryCancel();
  while (reader->Read(&r)) {
  }
  (void)reader->Finish();
  ASSERT_EQ(progress.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(progress[0],
                               "progress: stage 1 of 1, step 1/50, loss 4.5000, 1234 tokens/s"))
      << progress[0];
  EXPECT_TRUE(absl::StrContains(progress[0], "checkpoint age ")) << progress[0];
  EXPECT_TRUE(absl::StartsWith(progress[1], "progress: stage 1 of 1, step 50/50, loss 2.2500"))
      << progress[1];
  // Steps 2..5 came within the interval: not logged.
  int lines = 0;
  for (const v1::LogLine& line : Logs(*id)) lines += absl::StartsWith(line.text(), "progress: ");
  EXPECT_EQ(lines, 2);
}

TEST_F(CoordinatorGrpcTest, MetricsPassPromtool) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("metered", "    - {seq_len: 256, steps: 2}\n"));
  ASSERT_TRUE(id.ok());
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a);
  w1.Started(a->ref());
  w1.Progress(a->ref(), 1, 4.5);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  ASSERT_TRUE(PollUntil([&] { return GetJob(*id).stages(0).progress().step() == 1; }));
  httplib::Client http("127.0.0.1", server_->metrics_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const std::string& body = res->body;
  for (const char* needle :
       {"ulysses_jobs{state=\"running\"} 1", "ulysses_queue_length 0",
        "ulysses_workers{state=\"busy\"} 1", "ulysses_build_info{",
        "ulysses_worker_slots{state=\"busy\"} 1", "ulysses_worker_slots{state=\"free\"} 0",
        "ulysses_worker_heartbeat_age_seconds{worker=\"w-w1\"}",
        "ulysses_rpc_duration_seconds_bucket{method=\"/ulysses.v1.JobService/SubmitJob\"",
        "ulysses_gang_wait_seconds_count 1"}) {
    EXPECT_NE(body.find(needle), std::string::npos) << needle << "\n" << body;
  }
  EXPECT_NE(body.find("ulysses_train_loss{job_id=\"" + *id + "\"} 4.5"), std::string::npos);
  const ::ulysses::testing::Result check =
      ::ulysses::testing::Run({"/usr/bin/promtool", "check", "metrics"}, {.stdin_data = body});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  // A finished job's per-job series are removed (bounded label sets).
  ASSERT_TRUE(w1.CommitLast(*a));
  w1.Exited(a->ref(), 0);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_SUCCEEDED));
  auto after = http.Get("/metrics");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->body.find("job_id=\"" + *id + "\""), std::string::npos);
}

// metrics.job_series (coordinator_metrics.h JobSeries): the unauthenticated listener shows
// no job ids at `none` and a tenant label on each at `labels`; cluster-wide figures stay.
template <JobSeries kPolicy>
class JobSeriesTest : public testing::CoordinatorServerTest {
  void Configure(CoordinatorConfig* c) override { c->metrics_job_series = kPolicy; }

 protected:
  // A running job (admin, tenant "default") with a progress report; its id.
  std::string RunningJob() {
    FakeWorker& w1 = AddWorker("w1");
    auto id = Submit(JobYaml("metered", "    - {seq_len: 256, steps: 2}\n"));
    EXPECT_TRUE(id.ok());
    auto a = w1.WaitAssignment();
    EXPECT_TRUE(a);
    if (!id.ok() || !a) return "";
    w1.Started(a->ref());
    w1.Progress(a->ref(), 1, 4.5);
    EXPECT_TRUE(PollUntil([&] { return GetJob(*id).stages(0).progress().step() == 1; }));
    return *id;
  }
};
using JobSeriesNoneTest = JobSeriesTest<JobSeries::kNone>;
using JobSeriesLabelsTest = JobSeriesTest<JobSeries::kLabels>;

TEST_F(JobSeriesNoneTest, ScrapeNamesNoJob) {
  const std::string id = RunningJob();
  ASSERT_FALSE(id.empty());
  const std::string body = Metrics();
  EXPECT_EQ(body.find("job_id="), std::string::npos) << body;
  EXPECT_EQ(body.find(id), std::string::npos) << body;
  EXPECT_NE(body.find("ulysses_jobs{state=\"running\"} 1"), std::string::npos) << body;
  const ::ulysses::testing::Result check =
      ::ulysses::testing::Run({"/usr/bin/promtool", "check", "metrics"}, {.stdin_data = body});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

TEST_F(JobSeriesLabelsTest, EveryJobSeriesCarriesItsTenant) {
  const std::string id = RunningJob();
  ASSERT_FALSE(id.empty());
  const std::string body = Metrics();
  EXPECT_NE(body.find("ulysses_train_loss{job_id=\"" + id + "\",tenant=\"default\"} 4.5"),
            std::string::npos)
      << body;
  // No job series without it.
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (absl::StrContains(line, "job_id=")) {
      EXPECT_TRUE(absl::StrContains(line, "tenant=\"default\"")) << line;
    }
  }
  const ::ulysses::testing::Result check =
      ::ulysses::testing::Run({"/usr/bin/promtool", "check", "metrics"}, {.stdin_data = body});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
}

// The coordinator registers exactly its rows of the metrics catalogue
// (common/metrics/catalog.h), with their types: docs/METRICS.md, the dashboard and the
// alert rules are checked against that catalogue (tests/deploy), so the scrape is too.
TEST_F(CoordinatorGrpcTest, ScrapeExportsExactlyTheCoordinatorsCatalogueRows) {
  // One RPC so every family that has label-less series has been touched at least once.
  ASSERT_TRUE(Submit(JobYaml("catalogue", "    - {seq_len: 256, steps: 2}\n")).ok());
  httplib::Client http("127.0.0.1", server_->metrics_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  std::map<std::string, std::string> exported;  // family -> type, from "# TYPE name type"
  std::istringstream scrape(res->body);
  for (std::string line; std::getline(scrape, line);) {
    std::istringstream words(line);
    std::string hash, keyword, name, type;
    words >> hash >> keyword >> name >> type;
    if (hash == "#" && keyword == "TYPE") exported[name] = type;
  }
  std::map<std::string, std::string> catalogue;  // The coordinator's rows: name -> type.
  for (const metrics::MetricDef& def : metrics::Catalog()) {
    for (const std::string& binary : def.binaries) {
      if (binary == metrics::kCoordinatorBinary) {
        catalogue[def.name] = std::string(metrics::MetricTypeName(def.type));
      }
    }
  }
  ASSERT_GT(catalogue.size(), 20u);
  EXPECT_EQ(exported, catalogue);
}

// Value of the one sample line starting with `series` (e.g. `ulysses_x{job_id="j"}`), or
// nullopt when the scrape has no such line.
std::optional<double> SampleValue(const std::string& body, const std::string& series) {
  std::istringstream scrape(body);
  for (std::string line; std::getline(scrape, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nullopt;
}

// Job-level gauges (issue #12): the stage's shape, ETA, work at risk and evaluation per
// stage, fed by real worker-session messages and read from the real scrape; they leave
// with the job.
TEST_F(CoordinatorGrpcTest, JobLevelGaugesFollowTheJobAndLeaveWithIt) {
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("gauged", "    - {seq_len: 256, steps: 10}\n"));
  ASSERT_TRUE(id.ok());
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a);
  w1.Started(a->ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  httplib::Client http("127.0.0.1", server_->metrics_port());
  auto scrape = [&] {
    auto res = http.Get("/metrics");
    return res && res->status == 200 ? res->body : std::string();
  };
  const std::string job = "{job_id=\"" + *id + "\"}";
  std::string body = scrape();
  // Set when the group runs, before any step.
  EXPECT_EQ(SampleValue(body, "ulysses_train_seq_len" + job), 256) << body;
  EXPECT_EQ(SampleValue(body, "ulysses_train_group_size" + job), 1);
  EXPECT_EQ(SampleValue(body, "ulysses_train_steps" + job), 10);
  EXPECT_EQ(SampleValue(body, "ulysses_train_stage" + job), 1);  // stage 1 of 1, 1-based
  // Work at risk: the job runs without a checkpoint, so it is counted from the attempt start;
  // the job's work_at_risk_since (top's CKPT_AGE) is the same instant.
  EXPECT_GE(SampleValue(body, "ulysses_checkpoint_age_seconds" + job).value_or(-1), 0);
  auto ms = [](const google::protobuf::Timestamp& t) {
    return t.seconds() * 1000 + t.nanos() / 1'000'000;
  };
  {
    const v1::Job j = GetJob(*id);
    ASSERT_TRUE(j.has_work_at_risk_since());
    ASSERT_GT(j.attempts_size(), 0);
    EXPECT_EQ(ms(j.work_at_risk_since()), ms(j.attempts(j.attempts_size() - 1).started_at()));
  }
  // One progress report gives no rate; the ETA appears with the second.
  w1.Progress(a->ref(), 1, 4.5);
  ASSERT_TRUE(PollUntil([&] { return GetJob(*id).stages(0).progress().step() == 1; }));
  EXPECT_EQ(SampleValue(scrape(), "ulysses_stage_eta_seconds" + job), std::nullopt);
  w1.Progress(a->ref(), 3, 4.0);
  ASSERT_TRUE(PollUntil([&] { return GetJob(*id).stages(0).progress().step() == 3; }));
  EXPECT_GE(SampleValue(scrape(), "ulysses_stage_eta_seconds" + job).value_or(-1), 0);

  // Evaluation: loss always, accuracy only when the evaluation measured it.
  auto eval = [&](std::optional<double> accuracy) {
    v1::WorkerMessage m;
    *m.mutable_eval()->mutable_ref() = a->ref();
    v1::EvalResult* r = m.mutable_eval()->mutable_result();
    r->set_stage(0);
    r->set_seq_len(256);
    r->set_loss(3.5);
    if (accuracy) r->set_accuracy(*accuracy);
    w1.Send(std::move(m));
  };
  // The first stage (index 0 in the report) is labelled stage="1".
  const std::string stage0 = "{job_id=\"" + *id + "\",stage=\"1\"}";
  eval(std::nullopt);
  ASSERT_TRUE(
      PollUntil([&] { return SampleValue(scrape(), "ulysses_eval_loss" + stage0) == 3.5; }));
  EXPECT_EQ(SampleValue(scrape(), "ulysses_eval_accuracy" + stage0), std::nullopt);
  eval(0.75);
  ASSERT_TRUE(
      PollUntil([&] { return SampleValue(scrape(), "ulysses_eval_accuracy" + stage0) == 0.75; }));

  // A committed checkpoint restarts the work-at-risk clock (it is still reported).
  auto ack = w1.WaitAck(w1.Checkpoint(a->ref(), 3, a->checkpoint_dir() + "/step-00000003"));
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->result(), v1::ACK_CODE_OK) << ack->message();
  EXPECT_GE(SampleValue(scrape(), "ulysses_checkpoint_age_seconds" + job).value_or(-1), 0);
  {
    const v1::Job j = GetJob(*id);
    ASSERT_TRUE(j.has_last_checkpoint());
    EXPECT_EQ(ms(j.work_at_risk_since()), ms(j.last_checkpoint().committed_at()));
  }

  // The job ends: every series naming it goes (bounded cardinality).
  ASSERT_TRUE(w1.CommitLast(*a));
  w1.Exited(a->ref(), 0);
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_SUCCEEDED));
  body = scrape();
  EXPECT_EQ(body.find("job_id=\"" + *id + "\""), std::string::npos) << body;
}

TEST_F(CoordinatorGrpcTest, ListJobsFiltersByStateAndPages) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto id = Submit(JobYaml("paged-" + std::to_string(i), "    - {seq_len: 256, steps: 2}\n"));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  auto list = [&](const std::string& token, std::vector<v1::JobState> states) {
    v1::ListJobsRequest req;
    req.set_page_size(2);
    req.set_page_token(token);
    for (auto s : states) req.add_states(s);
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    EXPECT_TRUE(jobs_->ListJobs(&ctx, req, &resp).ok());
    return resp;
  };
  v1::ListJobsResponse first = list("", {});
  ASSERT_EQ(first.jobs_size(), 2);
  EXPECT_EQ(first.jobs(0).id(), ids[2]);  // Newest first.
  EXPECT_EQ(first.jobs(1).id(), ids[1]);
  ASSERT_FALSE(first.next_page_token().empty());
  v1::ListJobsResponse second = list(first.next_page_token(), {});
  ASSERT_EQ(second.jobs_size(), 1);
  EXPECT_EQ(second.jobs(0).id(), ids[0]);
  EXPECT_TRUE(second.next_page_token().empty());
  EXPECT_EQ(list("", {v1::JOB_STATE_PENDING}).jobs_size(), 2);
  EXPECT_EQ(list("", {v1::JOB_STATE_RUNNING}).jobs_size(), 0);
  v1::ListJobsRequest bad;
  bad.set_page_token("not-a-token");
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(5));
  EXPECT_EQ(jobs_->ListJobs(&ctx, bad, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The standard grpc.health.v1.Health/Check answers SERVING (HealthCheckBytes in
// grpc_fixture.h calls it as a raw generic RPC).
TEST_F(CoordinatorGrpcTest, HealthServiceReportsServing) {
  EXPECT_EQ(HealthCheckBytes(), std::string("\x08\x01", 2));
}

}  // namespace
}  // namespace ulysses::coordinator
