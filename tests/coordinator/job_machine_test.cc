// The job state machine (coordinator/job_machine.h) on plain State, without gRPC or a
// store: transitions, the one restart helper, and that every side effect waits in the
// Txn for the commit.
#include "coordinator/job_machine.h"

#include <memory>
#include <string>
#include <vector>

#include "coordinator/worker_protocol.h"
#include "gtest/gtest.h"

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
    job_ = j.get();
    state_.jobs[j->rec.id] = std::move(j);
  }

  // Launches the job on both workers and clears the Txn (as a commit would).
  void LaunchOnBoth() {
    Txn txn;
    machine_.Launch(*job_, {"w-a", "w-b"}, txn);
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
  machine_.Launch(*job_, {"w-a", "w-b"}, txn);
  EXPECT_EQ(job_->rec.generation, 1);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_SCHEDULING);
  ASSERT_EQ(txn.outbound.size(), 2u);
  EXPECT_EQ(txn.outbound[1].second.assignment().ref().rank(), 1);
  EXPECT_EQ(txn.outbound[0].second.assignment().master_addr(), "a.local");
  EXPECT_EQ(state_.workers["w-b"]->assigned->rank(), 1);
  EXPECT_TRUE(txn.jobs.count(job_));
  EXPECT_EQ(txn.batch.events.size(), 2u);  // attempt_started + state_change.
  EXPECT_TRUE(sinks_["w-a"].sent.empty());
  EXPECT_TRUE(sinks_["w-b"].sent.empty());
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
                         txn);
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
                           txn);
  }
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_FAILED);
  EXPECT_NE(job_->rec.reason.find("failure 3 of max_failures 3"), std::string::npos)
      << job_->rec.reason;
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
  state_.workers["w-a"]->assigned.reset();
  state_.workers["w-b"]->assigned.reset();
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
  EXPECT_EQ(job_->rec.failures, 1);
  EXPECT_GT(job_->rec.not_before_ms, 0);
  EXPECT_EQ(job_->rec.attempts.back().outcome, v1::ATTEMPT_OUTCOME_LOST);
  EXPECT_EQ(metrics_->restarts->WithLabels({"worker_lost"})->Value(), 1);
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
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_PREEMPTED);
  LaunchOnBoth();
  machine_.OnRankPreempted(*job_, 0, 75, "exited 75", txn);
  EXPECT_EQ(job_->rec.state, v1::JOB_STATE_FAILED);
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

}  // namespace
}  // namespace ulysses::coordinator
