// The job state machine (coordinator/job_machine.h) on plain State, without gRPC or a
// store: transitions, the one restart helper, and that every side effect waits in the
// Txn for the commit.
#include "coordinator/job_machine.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/failure_budget.h"
#include "coordinator/worker_protocol.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

class RecordingWorkerSink : public WorkerSink {
 public:
  void Send(const v1::CoordinatorMessage& m) override { sent.push_back(m); }
  void Close(const absl::Status& s) override { closed.push_back(s); }
  std::vector<v1::CoordinatorMessage> sent;
  std::vector<absl::Status> closed;
};

class RecordingLogSink : public LogSink {
 public:
  void OnLines(const std::vector<v1::LogLine>& l) override { lines += static_cast<int>(l.size()); }
  void OnJobEnded() override { ended = true; }
  int lines = 0;
  bool ended = false;
};

class JobMachineTest : public ::testing::Test {
 protected:
  JobMachineTest()
      : metrics_(CoordinatorMetrics::Register(nullptr, [](CountsPart) { return StateCounts(); })),
        machine_(config_, *metrics_, state_),
        protocol_(config_, *metrics_, state_, machine_) {
    for (const char* name : {"a", "b"}) {
      auto w = std::make_unique<WorkerRt>();
      w->rec.id = std::string("w-") + name;
      w->rec.name = name;
      w->rec.host = std::string(name) + ".local";
      w->state = v1::WORKER_STATE_IDLE;
      w->sink = &sinks_[w->rec.id];
      w->session = 1;
      state_.workers[w->rec.id] = std::move(w);
    }
    auto j = std::make_unique<JobRt>();
    j->rec.id = "job-000001";
    j->rec.number = 1;
    j->rec.state = v1::JOB_STATE_PENDING;
    j->rec.max_failures = 3;
    StageRecord s;
    s.sp = 2;
    s.seq_len = 64;
    s.steps = 10;
    j->rec.stages = {s};
    j->rec.spec_yaml = testing::JobYaml("unit", "    - {seq_len: 256, steps: 10}\n");
    job_ = j.get();
    state_.jobs[j->rec.id] = std::move(j);
  }

  // Launches the job on both workers and clears the Txn (as a commit would).
  void LaunchOnBoth() {
    Txn txn;
    machine_.Launch(*job_, {"w-a", "w-b"}, {0, 0}, txn);
    ASSERT_EQ(job_->rec.state, v1::JOB_STATE_SCHEDULING);
    ASSERT_EQ(txn.outbound.size(), 2u);
  }

  int AbortsIn(const Txn& txn) {
    int n = 0;
    for (const auto& [w, m] : txn.outbound) n += m.has_abort() ? 1 : 0;
    return n;
  }

  CoordinatorConfig config_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  State state_;
  JobMachine machine_;
  WorkerProtocol protocol_;
  std::map<std::string, RecordingWorkerSink> sinks_;
  JobRt* job_ = nullptr;
};

TEST_F(JobMachineTest, LaunchAssignsEveryRankAndSendsNothingBeforeTheCommit) {
  Txn txn;
  machine_.Launch(*job_, {"w-a", "w-b"}, {0, 0}, txn);
  EXPECT_EQ(job_->rec.generation, 1);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_SCHEDULING);
  ASSERT_EQ(txn.outbound.size(), 2u);
  EXPECT_EQ(txn.outbound[1].second.assignment().ref().rank(), 1);
  EXPECT_EQ(txn.outbound[0].second.assignment().master_addr(), "a.local");
  EXPECT_EQ(state_.workers["w-b"]->slots.at(0).rank(), 1);
  EXPECT_TRUE(txn.jobs.count(job_));
  EXPECT_EQ(txn.batch.events.size(), 2u);  // attempt_started + state_change.
  EXPECT_TRUE(sinks_["w-a"].sent.empty());
  EXPECT_TRUE(sinks_["w-b"].sent.empty());
  // The spec's own interval: no interval, no control channel.
  EXPECT_FALSE(txn.outbound[0].second.assignment().has_checkpoint_interval());
}

TEST_F(JobMachineTest, SetStateQueuesItsLogLineForAfterTheCommit) {
  RecordingLogSink follower;
  job_->log_followers.insert(&follower);
  Txn txn;
  machine_.SetState(*job_, v1::JOB_STATE_CANCELLED, "cancelled by user", txn);
  EXPECT_EQ(follower.lines, 0);
  EXPECT_FALSE(follower.ended);
  ASSERT_EQ(txn.log_lines.size(), 1u);
  EXPECT_EQ(txn.log_lines[0].second.text(), "job PENDING -> CANCELLED: cancelled by user");
  EXPECT_EQ(job_->logs.size(), 1u);  // In the buffer at once (GetJobLogs reads it).
  ASSERT_EQ(txn.ended.size(), 1u);
  EXPECT_GT(job_->rec.finished_ms, 0);
}

TEST_F(JobMachineTest, RankFailureBacksOffAndFailsAtMaxFailures) {
  LaunchOnBoth();
  Txn txn;
  const int64_t before = NowMs();
  machine_.OnRankFailure(*job_, v1::ATTEMPT_OUTCOME_FAILED, 1, "rank 1 exited 1", "rank_failed",
                         contract::FailureKind::kApplication, txn);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job_->rec.failures, 1);
  EXPECT_EQ(job_->rec.restarts, 1);
  EXPECT_GE(job_->rec.not_before_ms, before + 1000);  // restart_backoff_base_s = 1.
  EXPECT_EQ(AbortsIn(txn), 2);
  EXPECT_EQ(job_->rec.attempts.back().outcome, v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(metrics_->restarts->WithLabels({"rank_failed"})->Value(), 1);
  for (int i = 0; i < 2; ++i) {
    LaunchOnBoth();
    machine_.OnRankFailure(*job_, v1::ATTEMPT_OUTCOME_FAILED, 1, "rank 1 exited 1", "rank_failed",
                           contract::FailureKind::kApplication, txn);
  }
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_FAILED);
  EXPECT_EQ(job_->rec.reason,
            "crash loop: rank 1 exited 1 (application failure 3 of max_failures 3 without a new "
            "checkpoint within 86400s)");
}

// The three ways a group breaks while it waits for reconnects after a coordinator
// restart all go through RestartGroup: aborted, one restart counted, RECOVERING at
// once (not_before_ms reset, whatever backoff was left), not counted as a failure.
enum class Break { kWorkerLost, kWorkerBackWithoutRank, kReconnectDeadline };

class RestartGroupTest : public JobMachineTest, public ::testing::WithParamInterface<Break> {};

TEST_P(RestartGroupTest, AbortsCountsARestartAndRequeuesWithoutBackoff) {
  LaunchOnBoth();
  job_->awaiting_reconnect = true;
  job_->reconnect_deadline_steady = SteadyMs() + 60'000;
  job_->rec.not_before_ms = NowMs() + 3'600'000;  // A stale backoff must not delay the restart.
  Txn txn;
  switch (GetParam()) {
    case Break::kWorkerLost:
      machine_.OnWorkerLost(*state_.workers["w-a"], "no heartbeat for 10.0s", txn);
      EXPECT_EQ(sinks_["w-a"].closed.size(), 1u);
      break;
    case Break::kWorkerBackWithoutRank: {
      v1::RegisterRequest r;
      r.set_name("a");
      r.set_host("a.local");
      r.set_device("cpu");
      r.set_capacity(1);
      ASSERT_TRUE(protocol_.Register(r, txn).ok());
      break;
    }
    case Break::kReconnectDeadline:
      machine_.CheckReconnectDeadline(*job_, job_->reconnect_deadline_steady - 1, txn);
      ASSERT_EQ(job_->rec.state, v1::JOB_STATE_SCHEDULING);  // Not yet.
      machine_.CheckReconnectDeadline(*job_, job_->reconnect_deadline_steady, txn);
      break;
  }
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job_->rec.not_before_ms, 0);
  EXPECT_EQ(job_->rec.restarts, 1);
  EXPECT_EQ(job_->rec.failures, 0);
  EXPECT_FALSE(job_->awaiting_reconnect);
  EXPECT_EQ(job_->rec.attempts.back().outcome, v1::ATTEMPT_OUTCOME_ABORTED);
  EXPECT_NE(job_->rec.reason.find("; restarting from the start of the stage"), std::string::npos)
      << job_->rec.reason;
  EXPECT_EQ(metrics_->restarts->WithLabels({"coordinator_restart"})->Value(), 1);
  EXPECT_GE(AbortsIn(txn), 1);              // The surviving rank(s) are stopped...
  EXPECT_TRUE(sinks_["w-b"].sent.empty());  // ...after the commit.
  // Requeued with no backoff: the next schedule launches generation 2 at once.
  state_.workers["w-a"]->slots.clear();
  state_.workers["w-b"]->slots.clear();
  state_.workers["w-a"]->state = v1::WORKER_STATE_IDLE;
  state_.workers["w-a"]->sink = &sinks_["w-a"];
  state_.workers["w-b"]->state = v1::WORKER_STATE_IDLE;
  Txn next;
  machine_.Schedule(next);
  EXPECT_EQ(job_->rec.generation, 2);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_SCHEDULING);
}

INSTANTIATE_TEST_SUITE_P(EveryBreak, RestartGroupTest,
                         ::testing::Values(Break::kWorkerLost, Break::kWorkerBackWithoutRank,
                                           Break::kReconnectDeadline));

TEST_F(JobMachineTest, ALostWorkerOutsideRecoveryIsAFailureWithBackoff) {
  LaunchOnBoth();
  Txn txn;
  machine_.OnWorkerLost(*state_.workers["w-b"], "no heartbeat for 10.0s", txn);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job_->rec.failures, 0);
  EXPECT_EQ(job_->rec.infra_failures, 1);  // Infrastructure: not against max_failures.
  EXPECT_GT(job_->rec.not_before_ms, 0);
  EXPECT_EQ(job_->rec.attempts.back().outcome, v1::ATTEMPT_OUTCOME_LOST);
  EXPECT_NE(job_->rec.reason.find("infrastructure failure 1 of max_infra_failures 20"),
            std::string::npos)
      << job_->rec.reason;
  EXPECT_EQ(metrics_->restarts->WithLabels({"worker_lost"})->Value(), 1);
}

// --- Failure budgets (coordinator/failure_budget.h) through the worker protocol. ---

class FailureBudgetTest : public JobMachineTest {
 protected:
  // Rank 0 of the current attempt ends as reported by its worker.
  void Exit(int exit_code, int signal, const std::string& error = "") {
    v1::WorkerMessage m;
    m.set_seq(++seq_);
    v1::AttemptExited* x = m.mutable_exited();
    x->mutable_ref()->set_job_id(job_->rec.id);
    x->mutable_ref()->set_generation(job_->rec.generation);
    x->mutable_ref()->set_rank(0);
    x->mutable_ref()->set_stage(0);
    x->set_exit_code(exit_code);
    x->set_signal(signal);
    x->set_error_message(error);
    Txn txn;
    protocol_.OnMessage(*state_.workers["w-a"], m, txn);
  }
  // A new checkpoint committed now (the job made progress).
  void Checkpoint(int64_t step) {
    CheckpointRecord c;
    c.job_id = job_->rec.id;
    c.step = step;
    c.committed_ms = NowMs() + 1;  // After the failure that was just counted.
    job_->rec.last_checkpoint = c;
  }
  // Ends the backoff and launches the next generation.
  void Relaunch() {
    for (const char* w : {"w-a", "w-b"}) {
      state_.workers[w]->slots.clear();
      state_.workers[w]->state = v1::WORKER_STATE_IDLE;
    }
    LaunchOnBoth();
  }
  // A pending one-stage job of `priority` that needs both workers (job-000002).
  JobRt& AddWaitingJob(int64_t priority) {
    auto h = std::make_unique<JobRt>();
    h->rec.id = "job-000002";
    h->rec.number = 2;
    h->rec.priority = priority;
    h->rec.state = v1::JOB_STATE_PENDING;
    StageRecord st;
    st.sp = 2;
    st.seq_len = 64;
    st.steps = 10;
    h->rec.stages = {st};
    h->rec.spec_yaml = testing::JobYaml("high", "    - {seq_len: 64, steps: 10}\n");
    JobRt& out = *h;
    state_.jobs[out.rec.id] = std::move(h);
    return out;
  }
  int64_t seq_ = 0;
};

TEST_F(FailureBudgetTest, ExitsAreClassifiedByKind) {
  struct Case {
    int exit_code, signal;
    bool infra;
  };
  for (const Case& c : {Case{1, 0, false}, Case{137, 9, true}, Case{69, 0, true},
                        Case{139, 11, false}, Case{143, 15, true}, Case{134, 6, false}}) {
    SCOPED_TRACE(::testing::Message() << "exit " << c.exit_code << " signal " << c.signal);
    job_->rec.max_failures = 100;
    Relaunch();
    const int app = job_->rec.failures, infra = job_->rec.infra_failures;
    Exit(c.exit_code, c.signal);
    ASSERT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING) << job_->rec.reason;
    EXPECT_EQ(job_->rec.failures, app + (c.infra ? 0 : 1));
    EXPECT_EQ(job_->rec.infra_failures, infra + (c.infra ? 1 : 0));
  }
  EXPECT_NE(job_->rec.reason.find("rank 0 was killed by signal 6"), std::string::npos)
      << job_->rec.reason;
}

TEST_F(FailureBudgetTest, ACrashLoopFailsFastWithTheRepeatedError) {
  // Node losses in between do not use up the application budget.
  for (int i = 0; i < 2; ++i) {
    Relaunch();
    Exit(1, 0, "step 7: loss is NaN");
    Relaunch();
    Exit(137, 9);
  }
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING);
  Relaunch();
  Exit(1, 0, "step 7: loss is NaN");
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_FAILED);
  EXPECT_EQ(job_->rec.reason,
            "crash loop: rank 0 exited 1: step 7: loss is NaN (application failure 3 of "
            "max_failures 3 without a new checkpoint within 86400s)");
  EXPECT_EQ(job_->rec.infra_failures, 2);
}

TEST_F(FailureBudgetTest, ProgressResetsTheBudgetsSoRoutineNodeLossIsSurvived) {
  job_->rec.max_infra_failures = 3;
  job_->rec.max_failures = 2;
  // Twelve node losses and five crashes, each after a new checkpoint: never FAILED.
  for (int i = 0; i < 12; ++i) {
    Relaunch();
    Checkpoint(10 * (i + 1));
    Exit(137, 9);
    ASSERT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING) << i << ": " << job_->rec.reason;
    if (i % 3 == 0) {
      Relaunch();
      Checkpoint(10 * (i + 1) + 5);
      Exit(1, 0, "flaky");
      ASSERT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING) << i << ": " << job_->rec.reason;
    }
  }
  EXPECT_EQ(job_->rec.infra_failures, 12);
  EXPECT_EQ(job_->rec.failures, 4);
  EXPECT_NE(job_->rec.reason.find("earlier failures forgotten: progress"), std::string::npos)
      << job_->rec.reason;
  // The backoff restarted from the base: 1 s, not 2^11 s.
  EXPECT_LE(job_->rec.not_before_ms, NowMs() + 1000);
  // Without progress the same losses spend the budget (the last checkpoint is not newer
  // than the last failure; its +1 ms could be, within one millisecond).
  // The last loss of the loop counts (no checkpoint since): two more spend the budget of 3.
  job_->rec.last_checkpoint->committed_ms = job_->rec.recent_failures.back().ms;
  Relaunch();
  Exit(137, 9);
  ASSERT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING);
  Relaunch();
  Exit(137, 9);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_FAILED);
  EXPECT_EQ(job_->rec.reason,
            "rank 0 was killed by signal 9 (infrastructure failure 3 of max_infra_failures 3 "
            "without a new checkpoint within 86400s)");
}

TEST_F(FailureBudgetTest, FailuresOlderThanTheWindowAreForgotten) {
  job_->rec.failure_window_s = 60;
  const int64_t now = NowMs();
  // Two crashes two minutes ago and one 30 s ago: only the recent one counts.
  job_->rec.recent_failures = {
      {now - 120'000, false}, {now - 119'000, false}, {now - 30'000, false}};
  EXPECT_EQ(CountingFailures(job_->rec, false, now), 1);
  Relaunch();
  Exit(1, 0);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_RECOVERING) << job_->rec.reason;
  EXPECT_EQ(job_->rec.recent_failures.size(), 2u);
  Relaunch();
  Exit(1, 0);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_FAILED);
  // No window: all of them count.
  job_->rec.failure_window_s = 0;
  EXPECT_EQ(CountingFailures(job_->rec, false, now + 86'400'000), 3);
  // A checkpoint after the newest failure: none counts.
  Checkpoint(5);
  job_->rec.last_checkpoint->committed_ms = NowMs() + 10;
  EXPECT_EQ(CountingFailures(job_->rec, false, NowMs()), 0);
}

TEST(FailureMarksTest, EncodeDecodeRoundTripAndRejectGarbage) {
  std::vector<FailureMark> marks = {{1700000000000, false}, {1700000001000, true}};
  EXPECT_EQ(EncodeFailureMarks(marks), "a1700000000000 i1700000001000");
  auto back = DecodeFailureMarks(EncodeFailureMarks(marks));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].ms, 1700000001000);
  EXPECT_TRUE((*back)[1].infra);
  EXPECT_TRUE(DecodeFailureMarks("")->empty());
  EXPECT_EQ(DecodeFailureMarks("a12 x5").status().message(),
            "jobs.recent_failures: 'x5' is not a<ms> or i<ms>");
  EXPECT_FALSE(DecodeFailureMarks("a").ok());
}

// --- Priority preemption through Schedule. ---

TEST_F(FailureBudgetTest, AHigherPriorityJobPreemptsTheLowOneWhichResumesLater) {
  config_.preemption_grace_s = 45;
  Relaunch();  // The low job (priority 0) runs on both workers.
  job_->rec.state = v1::JOB_STATE_RUNNING;
  JobRt& high = AddWaitingJob(10);

  Txn txn;
  machine_.Schedule(txn);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_CHECKPOINTING);
  EXPECT_EQ(job_->preempting_for, "job-000002");
  EXPECT_NE(
      job_->rec.reason.find("preempted for job-000002 (priority 10 > 0): checkpointing now; "),
      std::string::npos)
      << job_->rec.reason;
  EXPECT_NE(job_->rec.reason.find("GPU-seconds since the last checkpoint at risk"),
            std::string::npos)
      << job_->rec.reason;
  int preempting_aborts = 0;
  for (const auto& [w, m] : txn.outbound) {
    if (m.has_abort()) {
      EXPECT_TRUE(m.abort().preempt());
      EXPECT_EQ(m.abort().grace_period_ms(), 45000);  // preemption_grace_s, not cancel_grace_s.
      ++preempting_aborts;
    }
  }
  EXPECT_EQ(preempting_aborts, 2);
  EXPECT_EQ(high.rec.state, v1::JOB_STATE_PENDING);
  EXPECT_EQ(high.rec.reason,
            "stage 1 of 1: needs 2 free slots, 0 available; preempting job-000001 (priority 0)");
  // While it checkpoints, another schedule chooses no further victim and sends nothing.
  Txn again;
  machine_.Schedule(again);
  EXPECT_TRUE(again.outbound.empty());

  // The preemption checkpoint is committed; then rank 0 is SIGKILLed (its grace ran out, or
  // its worker predates Abort.preempt): still a preemption, not a failure.
  Checkpoint(6);
  Exit(137, 9);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_PREEMPTED);
  EXPECT_EQ(job_->rec.failures + job_->rec.infra_failures, 0);
  EXPECT_EQ(job_->rec.preemptions, 1);
  EXPECT_TRUE(job_->preempting_for.empty());
  EXPECT_NE(job_->rec.reason.find("for job-000002"), std::string::npos) << job_->rec.reason;
  EXPECT_EQ(metrics_->preemptions->WithLabels({"priority"})->Value(), 1);
  EXPECT_EQ(metrics_->preemptions->WithLabels({"worker"})->Value(), 0);
  // Both workers free: the high job starts; the low one waits behind it.
  for (const char* w : {"w-a", "w-b"}) {
    state_.workers[w]->slots.clear();
    state_.workers[w]->state = v1::WORKER_STATE_IDLE;
  }
  Txn placed;
  machine_.Schedule(placed);
  EXPECT_EQ(high.rec.state, v1::JOB_STATE_SCHEDULING);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_PREEMPTED);
  EXPECT_NE(job_->rec.reason.find("restarting from the checkpoint of stage 1 of 1 at step 6"),
            std::string::npos)
      << job_->rec.reason;
}

TEST_F(FailureBudgetTest, AJobThatOptedOutIsNeverPreempted) {
  job_->rec.preemptible = false;
  Relaunch();
  job_->rec.state = v1::JOB_STATE_RUNNING;
  AddWaitingJob(10);
  Txn txn;
  machine_.Schedule(txn);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(txn.outbound.empty());
}

TEST_F(FailureBudgetTest, ANonPreemptingPriorityClassWaitsInsteadOfPreempting) {
  config_.non_preempting_priorities = {10};
  Relaunch();
  job_->rec.state = v1::JOB_STATE_RUNNING;
  JobRt& high = AddWaitingJob(10);
  Txn txn;
  machine_.Schedule(txn);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(job_->preempting_for.empty());
  EXPECT_TRUE(txn.outbound.empty());
  EXPECT_EQ(high.rec.reason,
            "stage 1 of 1: needs 2 free slots, 0 available; priority 10 is a non-preempting class: "
            "waiting for running jobs to end");
  // Another priority, not in the list, preempts as before.
  high.rec.priority = 11;
  Txn other;
  machine_.Schedule(other);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_CHECKPOINTING);
}

TEST_F(JobMachineTest, LastStageCompletionSucceedsTheJob) {
  LaunchOnBoth();
  Txn txn;
  machine_.CompleteStage(*job_, txn);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job_->rec.stages[0].state, v1::STAGE_STATE_COMPLETED);
  EXPECT_EQ(job_->rec.stages[0].step, 10);
  EXPECT_EQ(job_->rec.attempts.back().outcome, v1::ATTEMPT_OUTCOME_SUCCEEDED);
}

TEST_F(JobMachineTest, PreemptionRequeuesUntilTheBudgetIsSpent) {
  job_->rec.max_preemptions = 1;
  LaunchOnBoth();
  Txn txn;
  machine_.OnRankPreempted(*job_, 0, 75, "exited 75", txn);
  // Requeued: waiting for placement again (the scheduler's queue), the attempt ended as a
  // preemption, the workers released, and the reason says so.
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_PREEMPTED);
  EXPECT_TRUE(IsQueued(job_->rec.state));
  EXPECT_GT(job_->queued_since_steady, 0);
  ASSERT_EQ(job_->rec.attempts.size(), 1u);
  EXPECT_EQ(job_->rec.attempts.back().outcome, v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_NE(job_->rec.reason.find("requeued"), std::string::npos) << job_->rec.reason;
  EXPECT_EQ(job_->rec.failures, 0);  // A preemption is not a failure.
  LaunchOnBoth();
  ASSERT_EQ(job_->rec.attempts.size(), 2u);
  machine_.OnRankPreempted(*job_, 0, 75, "exited 75", txn);
  // The budget (max_preemptions 1) is spent: failed for good, not requeued.
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_FAILED);
  EXPECT_FALSE(IsQueued(job_->rec.state));
  EXPECT_NE(job_->rec.reason.find("max_preemptions is 1"), std::string::npos) << job_->rec.reason;
  EXPECT_EQ(job_->rec.preemptions, 2);
}

TEST_F(JobMachineTest, LogBuffersAreBoundedInBytesPerJobAndInTotal) {
  config_.log_buffer_bytes_per_job = 64 << 10;
  config_.log_buffer_bytes_total = 100 << 10;
  auto add = [&](JobRt& job, int n, const std::string& tag) {
    Txn txn;
    for (int i = 0; i < n; ++i) {
      v1::LogLine line;
      line.set_text(tag + std::to_string(i) + std::string(1000, 'x'));
      machine_.AddLog(job, std::move(line), txn);
    }
  };
  auto sum = [](const JobRt& job) {
    int64_t bytes = 0;
    for (const v1::LogLine& l : job.logs) bytes += LogLineBytes(l);
    return bytes;
  };
  add(*job_, 200, "a");  // ~210 KB offered.
  EXPECT_LE(job_->log_bytes, 64 << 10);
  EXPECT_GT(job_->log_bytes, 60 << 10);
  EXPECT_EQ(job_->log_bytes, sum(*job_));
  EXPECT_EQ(job_->logs.back().text().substr(0, 4), "a199");  // The newest stay.
  EXPECT_EQ(job_->logs.back().sequence(), 200);

  auto other = std::make_unique<JobRt>();
  other->rec.id = "job-000002";
  JobRt& second = *other;
  state_.jobs[second.rec.id] = std::move(other);
  add(second, 60, "b");  // ~64 KB more: over the 100 KiB total.
  EXPECT_LE(state_.log_bytes, 100 << 10);
  EXPECT_EQ(state_.log_bytes, job_->log_bytes + second.log_bytes);
  EXPECT_EQ(job_->log_bytes, sum(*job_));
  EXPECT_EQ(second.log_bytes, sum(second));
  // The larger buffer gave up lines first; the newest line of each is kept.
  EXPECT_EQ(second.logs.back().text().substr(0, 3), "b59");
  EXPECT_EQ(job_->logs.back().text().substr(0, 4), "a199");
  machine_.ForgetLogs(second);
  EXPECT_EQ(state_.log_bytes, job_->log_bytes);
}

TEST_F(JobMachineTest, LostWorkersAreForgottenAfterTheirTtl) {
  config_.lost_worker_ttl_s = 60;
  Txn txn;
  machine_.OnWorkerLost(*state_.workers["w-a"], "no heartbeat for 10.0s", txn);
  const int64_t lost_at = state_.workers["w-a"]->lost_since_steady;
  ASSERT_GT(lost_at, 0);
  Txn early;
  machine_.ExpireLostWorkers(lost_at + 59'999, early);
  EXPECT_TRUE(state_.workers.count("w-a"));
  EXPECT_TRUE(early.batch.deleted_workers.empty());
  Txn late;
  machine_.ExpireLostWorkers(lost_at + 60'000, late);
  EXPECT_FALSE(state_.workers.count("w-a"));
  EXPECT_EQ(late.batch.deleted_workers, std::vector<std::string>{"w-a"});
  EXPECT_TRUE(state_.workers.count("w-b"));  // Not lost: kept.
  // A worker that registered again is not lost any more.
  machine_.OnWorkerLost(*state_.workers["w-b"], "no heartbeat", txn);
  v1::RegisterRequest r;
  r.set_name("b");
  r.set_host("b.local");
  ASSERT_TRUE(protocol_.Register(r, txn).ok());
  Txn later;
  machine_.ExpireLostWorkers(SteadyMs() + 3'600'000, later);
  EXPECT_TRUE(state_.workers.count("w-b"));
}

// --- every_steps: auto (job_interval.cc, policy coordinator/checkpoint_interval.h). ---

class AutoIntervalTest : public JobMachineTest {
 protected:
  AutoIntervalTest() {
    job_->rec.spec_yaml = testing::JobYaml("unit", "    - {seq_len: 256, steps: 10}\n") +
                          "  checkpoint: {every_steps: auto}\n";
    job_->rec.checkpoint_dir = "/ckpt/job-000001";
    config_.checkpoint_mtbf_prior_gpu_hours = 1000;  // 3.6e6 GPU-seconds; 1.8e6 s for 2 GPUs
  }
  // Rank 0's report (from w-a) of `m`'s kind, through the worker protocol.
  Txn Report(v1::WorkerMessage m) {
    m.set_seq(++seq_);
    Txn txn;
    protocol_.OnMessage(*state_.workers["w-a"], m, txn);
    return txn;
  }
  v1::WorkRef Rank0() const {
    v1::WorkRef ref;
    ref.set_job_id(job_->rec.id);
    ref.set_generation(job_->rec.generation);
    ref.set_rank(0);
    ref.set_stage(0);
    return ref;
  }
  Txn Checkpoint(int64_t step, double blocked_seconds) {
    v1::WorkerMessage m;
    *m.mutable_checkpoint()->mutable_ref() = Rank0();
    v1::Checkpoint* c = m.mutable_checkpoint()->mutable_checkpoint();
    c->set_path(absl::StrCat("/ckpt/job-000001/step-", step));
    c->set_stage(0);
    c->set_step(step);
    c->set_seconds(blocked_seconds + 1);
    c->set_blocked_seconds(blocked_seconds);
    return Report(m);
  }
  Txn Step(int64_t step, double step_seconds) {
    v1::WorkerMessage m;
    *m.mutable_progress()->mutable_ref() = Rank0();
    v1::StepProgress* p = m.mutable_progress()->mutable_progress();
    p->set_stage(0);
    p->set_step(step);
    p->set_steps(10);
    p->set_loss(1.0);
    p->set_step_seconds(step_seconds);
    return Report(m);
  }
  // The interval updates in `txn`, one per worker holding ranks.
  static std::vector<v1::CheckpointInterval> Updates(const Txn& txn) {
    std::vector<v1::CheckpointInterval> out;
    for (const auto& [w, m] : txn.outbound) {
      if (m.has_checkpoint_interval()) out.push_back(m.checkpoint_interval().interval());
    }
    return out;
  }
  uint64_t seq_ = 0;
};

// C from nothing (every step), then measured from rank 0's checkpoint report; M from the
// configured prior; converted to steps by the measured step time; each change goes to both
// workers with a new version and is what GetJob shows.
TEST_F(AutoIntervalTest, TheCoordinatorSendsYoungDalyFromMeasuredCostAndPriorMtbf) {
  Txn launch;
  machine_.Launch(*job_, {"w-a", "w-b"}, {0, 0}, launch);
  ASSERT_EQ(launch.outbound.size(), 2u);
  for (const auto& [w, m] : launch.outbound) {
    ASSERT_TRUE(m.assignment().has_checkpoint_interval()) << m.DebugString();
    const v1::CheckpointInterval& i = m.assignment().checkpoint_interval();
    EXPECT_EQ(i.version(), 1);
    EXPECT_EQ(i.every_steps(), 1);  // No cost known (checkpoint_cost_prior_s: 0).
    EXPECT_EQ(i.cost_source(), "none");
    EXPECT_EQ(i.mtbf_source(), "prior");
    EXPECT_NEAR(i.mtbf_seconds(), 1.8e6, 1.0);
    EXPECT_EQ(i.group_gpus(), 2);
  }
  // The stage end's save and a save of another stage are not the periodic cost.
  EXPECT_TRUE(Updates(Checkpoint(10, 50.0)).empty());
  // Rank 0's first periodic checkpoint blocked 0.5 s: T = sqrt(2 x 0.5 x 1.8e6) s, in seconds
  // (no step time yet), to both workers.
  Txn measured = Checkpoint(1, 0.5);
  std::vector<v1::CheckpointInterval> u = Updates(measured);
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].version(), 2);
  EXPECT_EQ(u[0].cost_source(), "measured");
  EXPECT_DOUBLE_EQ(u[0].cost_seconds(), 0.5);
  EXPECT_EQ(u[0].every_steps(), 0);
  EXPECT_NEAR(u[0].every_seconds(), std::sqrt(1.8e6), 1e-3);
  EXPECT_NEAR(u[0].interval_seconds(), std::sqrt(1.8e6), 1e-3);
  EXPECT_NE(u[0].reason().find("sqrt(2 x C 0.500 s (measured)"), std::string::npos)
      << u[0].reason();
  // A step time converts it to steps: 1341.6 s / 2 s = 671 steps.
  u = Updates(Step(2, 2.0));
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].version(), 3);
  EXPECT_EQ(u[0].every_steps(), 671);
  EXPECT_EQ(u[0].every_seconds(), 0);
  EXPECT_DOUBLE_EQ(u[0].step_seconds(), 2.0);
  // A small move is not sent: step 2.1 s smoothed to 2.025 s (663 steps, 1 % off).
  EXPECT_TRUE(Updates(Step(3, 2.1)).empty());
  // A second checkpoint measuring 2 s: the mean C is 1.25 s, T = sqrt(2 x 1.25 x 1.8e6) s.
  u = Updates(Checkpoint(4, 2.0));
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].version(), 4);
  EXPECT_DOUBLE_EQ(u[0].cost_seconds(), 1.25);
  EXPECT_EQ(u[0].every_steps(), std::llround(std::sqrt(4.5e6) / 2.025));
  ASSERT_TRUE(job_->interval.sent.has_value());
  EXPECT_EQ(job_->interval.version, 4);
}

// M from the failures observed for groups of the job's size (another job's failed 2-rank
// attempt of an hour; a 1-rank attempt does not count), and C from the configured prior
// before a measurement.
TEST_F(AutoIntervalTest, ObservedFailuresForTheGroupSizeAndACostPriorSetTheFirstInterval) {
  config_.checkpoint_cost_prior_s = 8;
  auto other = std::make_unique<JobRt>();
  other->rec.id = "job-000009";
  other->rec.tenant = job_->rec.tenant;
  AttemptRecord failed;
  failed.worker_ids = {"x", "y"};
  failed.started_ms = 1'000;
  failed.ended_ms = 1'000 + 3'600'000;
  failed.outcome = v1::ATTEMPT_OUTCOME_FAILED;
  failed.exit_code = contract::kExitPeerLost;  // An infrastructure failure.
  AttemptRecord single;
  single.worker_ids = {"x"};
  single.started_ms = 1'000;
  single.ended_ms = 1'000 + 3'600'000;
  single.outcome = v1::ATTEMPT_OUTCOME_LOST;
  other->rec.attempts = {failed, single};
  state_.jobs[other->rec.id] = std::move(other);
  Txn launch;
  machine_.Launch(*job_, {"w-a", "w-b"}, {0, 0}, launch);
  ASSERT_EQ(launch.outbound.size(), 2u);
  const v1::CheckpointInterval& i = launch.outbound[0].second.assignment().checkpoint_interval();
  // (3.6e6 prior + 7200 observed GPU-seconds) / (1 + 1 failure) / 2 GPUs.
  const double mtbf = (3.6e6 + 7200) / 2 / 2;
  EXPECT_EQ(i.mtbf_source(), "measured");
  EXPECT_NEAR(i.mtbf_seconds(), mtbf, 1.0);
  EXPECT_EQ(i.cost_source(), "prior");
  EXPECT_DOUBLE_EQ(i.cost_seconds(), 8);
  EXPECT_NEAR(i.every_seconds(), std::sqrt(2 * 8 * mtbf), 1e-2);
  EXPECT_EQ(i.every_steps(), 0);
}

// Before (b145c41) every failed attempt of every tenant counted: bob's crash loop (25 failures
// in 8 s) cut alice's auto interval from 60,405 s to 11,846 s and her reason quoted his
// failures. Now only the job's own tenant's infrastructure failures count: another tenant's
// lost and failed attempts and the tenant's own application failures (exit 1) leave it at the
// prior.
TEST_F(AutoIntervalTest, AnotherTenantsFailuresAndApplicationCrashesLeaveTheIntervalAlone) {
  auto bobs = std::make_unique<JobRt>();
  bobs->rec.id = "job-000009";
  bobs->rec.tenant = job_->rec.tenant + "-other";
  auto own = std::make_unique<JobRt>();
  own->rec.id = "job-000010";
  own->rec.tenant = job_->rec.tenant;
  for (int n = 0; n < 25; ++n) {
    AttemptRecord a;
    a.worker_ids = {"x", "y"};
    a.started_ms = 1'000 + n * 320;
    a.ended_ms = a.started_ms + 300;
    a.outcome = n % 2 == 0 ? v1::ATTEMPT_OUTCOME_FAILED : v1::ATTEMPT_OUTCOME_LOST;
    a.exit_code = n % 2 == 0 ? contract::kExitPeerLost : 0;
    bobs->rec.attempts.push_back(a);
    a.outcome = v1::ATTEMPT_OUTCOME_FAILED;
    a.exit_code = contract::kExitFailure;  // the tenant's own crash: not the machines
    own->rec.attempts.push_back(a);
  }
  state_.jobs[bobs->rec.id] = std::move(bobs);
  state_.jobs[own->rec.id] = std::move(own);
  Txn launch;
  machine_.Launch(*job_, {"w-a", "w-b"}, {0, 0}, launch);
  ASSERT_EQ(launch.outbound.size(), 2u);
  const v1::CheckpointInterval& i = launch.outbound[0].second.assignment().checkpoint_interval();
  EXPECT_EQ(i.mtbf_source(), "prior") << i.reason();
  // The own tenant's GPU-seconds count (25 x 0.3 s x 2 GPUs), none of bob's.
  EXPECT_NEAR(i.mtbf_seconds(), (3.6e6 + 15) / 2, 0.5) << i.reason();
  EXPECT_NE(i.reason().find("(prior: 0 failures in"), std::string::npos) << i.reason();
}

}  // namespace
}  // namespace ulysses::coordinator
