// Fencing of worker reports (docs/API.md "Fencing"), attacked through the real gRPC API
// against an in-process coordinator (grpc_fixture.h): a registered worker that does not
// hold an assignment cannot start, advance, checkpoint, log into, preempt or finish
// another worker's job; a stale or ended generation cannot either; a committed
// checkpoint must lie in its job's checkpoint dir. Each attack gets an error Ack, is
// counted by reason, and changes nothing.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using testing::FakeWorker;
using testing::JobYaml;
using testing::PollUntil;

class FencingGrpcTest : public testing::CoordinatorServerTest {
 protected:
  struct Running {
    FakeWorker* worker = nullptr;
    std::string id;
    v1::Assignment assignment;
  };
  // Worker `name` runs rank 0 of a new one-stage job of 60 steps, RUNNING.
  Running StartJob(const std::string& name, const std::string& job_name) {
    Running r;
    r.worker = &AddWorker(name);
    auto id = Submit(JobYaml(job_name, "    - {seq_len: 256, steps: 60}\n"));
    EXPECT_TRUE(id.ok()) << id.status();
    r.id = id.value_or("");
    auto a = r.worker->WaitAssignment();
    EXPECT_TRUE(a.has_value());
    if (!a) return r;
    r.assignment = *a;
    r.worker->Started(a->ref());
    EXPECT_TRUE(WaitState(r.id, v1::JOB_STATE_RUNNING));
    return r;
  }

  static v1::WorkerMessage Started(const v1::WorkRef& ref) {
    v1::WorkerMessage m;
    *m.mutable_started()->mutable_ref() = ref;
    m.mutable_started()->set_pid(1);
    return m;
  }
  static v1::WorkerMessage Progress(const v1::WorkRef& ref, int64_t step) {
    v1::WorkerMessage m;
    *m.mutable_progress()->mutable_ref() = ref;
    m.mutable_progress()->mutable_progress()->set_stage(ref.stage());
    m.mutable_progress()->mutable_progress()->set_step(step);
    m.mutable_progress()->mutable_progress()->set_loss(1.0);
    return m;
  }
  static v1::WorkerMessage Eval(const v1::WorkRef& ref) {
    v1::WorkerMessage m;
    *m.mutable_eval()->mutable_ref() = ref;
    m.mutable_eval()->mutable_result()->set_stage(ref.stage());
    m.mutable_eval()->mutable_result()->set_seq_len(256);
    m.mutable_eval()->mutable_result()->set_loss(0.5);
    m.mutable_eval()->mutable_result()->set_accuracy(0.9);
    return m;
  }
  static v1::WorkerMessage Checkpoint(const v1::WorkRef& ref, int64_t step,
                                      const std::string& path) {
    v1::WorkerMessage m;
    *m.mutable_checkpoint()->mutable_ref() = ref;
    v1::Checkpoint* c = m.mutable_checkpoint()->mutable_checkpoint();
    c->set_stage(ref.stage());
    c->set_step(step);
    c->set_path(path);
    c->set_bytes(1);
    return m;
  }
  static v1::WorkerMessage Log(const v1::WorkRef& ref, const std::string& text) {
    v1::WorkerMessage m;
    *m.mutable_logs()->mutable_ref() = ref;
    m.mutable_logs()->add_lines()->set_text(text);
    return m;
  }
  static v1::WorkerMessage Exited(const v1::WorkRef& ref, int code) {
    v1::WorkerMessage m;
    *m.mutable_exited()->mutable_ref() = ref;
    m.mutable_exited()->set_exit_code(code);
    return m;
  }
  static v1::WorkerMessage Preempting(const v1::WorkRef& ref) {
    v1::WorkerMessage m;
    *m.mutable_preempting()->mutable_ref() = ref;
    return m;
  }

  // Expects `m` from `w` to be rejected as stale (ACK_CODE_STALE) with `text` in the message.
  void ExpectStale(FakeWorker& w, v1::WorkerMessage m, const std::string& text) {
    SCOPED_TRACE(text);
    std::optional<v1::Ack> ack = SendForAck(w, std::move(m));
    ASSERT_TRUE(ack.has_value()) << "no Ack";
    EXPECT_EQ(ack->result(), v1::ACK_CODE_STALE) << ack->message();
    EXPECT_NE(ack->message().find(text), std::string::npos) << ack->message();
  }

  bool HasLogLine(const std::string& id, const std::string& text) {
    for (const v1::LogLine& l : Logs(id)) {
      if (l.text() == text) return true;
    }
    return false;
  }

  double Rejected(const std::string& reason) {
    const std::string metrics = Metrics();
    const std::string key = "ulysses_rejected_reports_total{reason=\"" + reason + "\"} ";
    size_t at = metrics.find(key);
    return at == std::string::npos ? 0 : std::stod(metrics.substr(at + key.size()));
  }
};

// Before: an anonymous worker drove a job to SUCCEEDED with fake started/exited{0}, made
// /root/.ssh/id_rsa its last_checkpoint and wrote "cancelled by admin" into its log.
TEST_F(FencingGrpcTest, AWorkerWithoutTheAssignmentChangesNothing) {
  Running r = StartJob("honest", "victim");
  ASSERT_NE(r.worker, nullptr);
  const v1::WorkRef ref = r.assignment.ref();  // What ListWorkers/GetJob reveal.
  r.worker->Progress(ref, 3, 2.5);
  ASSERT_TRUE(PollUntil([&] { return GetJob(r.id).stages(0).progress().step() == 3; }));
  FakeWorker& mallory = AddWorker("mallory");
  const v1::Job before = GetJob(r.id);

  const std::string not_assigned = "is not assigned to w-mallory";
  ExpectStale(mallory, Started(ref), not_assigned);
  ExpectStale(mallory, Progress(ref, 50), not_assigned);
  ExpectStale(mallory, Eval(ref), not_assigned);
  ExpectStale(mallory, Checkpoint(ref, 10, "/root/.ssh/id_rsa"), not_assigned);
  ExpectStale(mallory, Checkpoint(ref, 10, r.assignment.checkpoint_dir() + "/step-00000010"),
              not_assigned);
  ExpectStale(mallory, Log(ref, "cancelled by admin"), not_assigned);
  ExpectStale(mallory, Preempting(ref), not_assigned);
  ExpectStale(mallory, Exited(ref, 0), not_assigned);
  // A rank that does not exist in the attempt, and a job that does not exist.
  v1::WorkRef rank5 = ref;
  rank5.set_rank(5);
  ExpectStale(mallory, Progress(rank5, 50), not_assigned);
  v1::WorkRef ghost = ref;
  ghost.set_job_id("job-999999");
  ExpectStale(mallory, Exited(ghost, 0), "job-999999");

  const v1::Job after = GetJob(r.id);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.stages(0).progress().step(), 3);
  EXPECT_FALSE(after.stages(0).has_eval());
  EXPECT_FALSE(after.has_last_checkpoint());
  EXPECT_EQ(after.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_RUNNING);
  EXPECT_EQ(after.events_size(), before.events_size());
  EXPECT_FALSE(HasLogLine(r.id, "cancelled by admin"));
  EXPECT_EQ(Rejected("not_assigned"), 10);
  EXPECT_TRUE(Serving());

  // The assigned worker's reports still go through.
  r.worker->Send(Log(ref, "honest line"));
  auto ok =
      SendForAck(*r.worker, Checkpoint(ref, 10, r.assignment.checkpoint_dir() + "/step-00000010"));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->result(), v1::ACK_CODE_OK) << ok->message();
  EXPECT_EQ(GetJob(r.id).last_checkpoint().step(), 10);
  EXPECT_TRUE(PollUntil([&] { return HasLogLine(r.id, "honest line"); }));
}

TEST_F(FencingGrpcTest, ACheckpointOutsideItsJobsDirIsRejected) {
  Running r = StartJob("honest", "paths");
  ASSERT_NE(r.worker, nullptr);
  const v1::WorkRef ref = r.assignment.ref();
  const std::string dir = r.assignment.checkpoint_dir();
  for (const std::string& path :
       {std::string("/root/.ssh/id_rsa"), dir, dir + "/", dir + "/../job-000099/step-00000010",
        dir + "/step-00000010/../../../etc", dir + "-evil/step-00000010", std::string("step-1")}) {
    SCOPED_TRACE(path);
    auto ack = SendForAck(*r.worker, Checkpoint(ref, 10, path));
    ASSERT_TRUE(ack.has_value());
    EXPECT_EQ(ack->result(), v1::ACK_CODE_INVALID);
    EXPECT_NE(ack->message().find("checkpoint.checkpoint.path"), std::string::npos)
        << ack->message();
  }
  EXPECT_FALSE(GetJob(r.id).has_last_checkpoint());
  EXPECT_EQ(Rejected("checkpoint_outside_dir"), 7);  // Counted before the "." case below.
  // "." components are refused too (report the path as written); inside is accepted.
  auto dot = SendForAck(*r.worker, Checkpoint(ref, 10, dir + "/./step-00000010"));
  ASSERT_TRUE(dot.has_value());
  EXPECT_EQ(dot->result(), v1::ACK_CODE_INVALID);
  auto ack = SendForAck(*r.worker, Checkpoint(ref, 10, dir + "/step-00000010"));
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->result(), v1::ACK_CODE_OK) << ack->message();
}

TEST_F(FencingGrpcTest, SucceededAndPendingJobsTakeNoCheckpoint) {
  Running done = StartJob("honest", "done");
  ASSERT_NE(done.worker, nullptr);
  const v1::WorkRef ref = done.assignment.ref();
  const std::string step60 = done.assignment.checkpoint_dir() + "/step-00000060";
  testing::WriteCommittedCheckpoint(step60, 0, 60);
  auto ok = SendForAck(*done.worker, Checkpoint(ref, 60, step60));
  ASSERT_TRUE(ok && ok->result() == v1::ACK_CODE_OK);
  done.worker->Exited(ref, 0);
  ASSERT_TRUE(WaitState(done.id, v1::JOB_STATE_SUCCEEDED));
  FakeWorker& mallory = AddWorker("mallory");
  ExpectStale(mallory, Checkpoint(ref, 5, "/root/.ssh/id_rsa"), "is not assigned to w-mallory");
  // Not even the worker that ran it: the generation succeeded.
  ExpectStale(*done.worker, Checkpoint(ref, 5, done.assignment.checkpoint_dir() + "/step-5"),
              "has already succeeded");
  EXPECT_EQ(GetJob(done.id).last_checkpoint().path(), step60);

  // A job that never ran (4 workers needed): no generation has an attempt to hold.
  auto pending = Submit(JobYaml("pending", "    - {seq_len: 256, steps: 60, sp_degree: 4}\n"));
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(GetJob(*pending).state(), v1::JOB_STATE_PENDING);
  v1::WorkRef p;
  p.set_job_id(*pending);
  p.set_generation(1);
  ExpectStale(mallory, Checkpoint(p, 5, "/root/.ssh/id_rsa"), "is not assigned to w-mallory");
  EXPECT_FALSE(GetJob(*pending).has_last_checkpoint());
  EXPECT_EQ(GetJob(*pending).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Rejected("job_not_running"), 1);
  EXPECT_EQ(Rejected("not_assigned"), 2);
}

// Before: the worker that ran a job could append log lines to it after it ended, and an
// exit 0 without the final stage's checkpoint made the job SUCCEEDED.
TEST_F(FencingGrpcTest, AnEndedJobTakesNoLogsAndSucceedsOnlyWithItsFinalCheckpoint) {
  Running r = StartJob("honest", "claims");
  ASSERT_NE(r.worker, nullptr);
  const v1::WorkRef ref = r.assignment.ref();
  // A checkpoint of an earlier step is not the result: exit 0 now is a failure.
  auto ack = SendForAck(*r.worker, Checkpoint(ref, 30, r.assignment.checkpoint_dir() + "/s30"));
  ASSERT_TRUE(ack && ack->result() == v1::ACK_CODE_OK);
  r.worker->Exited(ref, 0);
  ASSERT_TRUE(PollUntil([&] { return GetJob(r.id).failures() == 1; }));
  v1::Job job = GetJob(r.id);
  EXPECT_NE(job.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_GE(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_NE(
      job.attempts(0).reason().find("without a committed checkpoint of its last step (step 60"),
      std::string::npos)
      << job.attempts(0).reason();
  // The next attempt commits step 60 and exits 0: SUCCEEDED.
  auto a2 = r.worker->WaitAssignment();
  ASSERT_TRUE(a2.has_value());
  r.worker->Started(a2->ref());
  ASSERT_TRUE(r.worker->CommitLast(*a2));
  r.worker->Exited(a2->ref(), 0);
  ASSERT_TRUE(WaitState(r.id, v1::JOB_STATE_SUCCEEDED));
  // Its worker no longer holds it: appended lines are refused and not stored.
  ExpectStale(*r.worker, Log(a2->ref(), "appended after the end"), "has ended");
  EXPECT_FALSE(HasLogLine(r.id, "appended after the end"));
  EXPECT_EQ(Rejected("job_not_running"), 1);
}

// The finding: a worker's exit message injected a forged line into the coordinator's text log
// and raw escape characters into Job.reason. Worker text is escaped before logs and reasons:
// no raw control character reaches the reason, the job's log lines or the coordinator's log.
TEST_F(FencingGrpcTest, WorkerTextCannotForgeLogLinesOrSendTerminalEscapes) {
  Running r = StartJob("honest", "forger");
  ASSERT_NE(r.worker, nullptr);
  const v1::WorkRef ref = r.assignment.ref();
  const std::string forged =
      "boom\n2026-12-04T00:00:00.000Z I 1 job_machine.cc:1] job-000001 "
      "RUNNING -> SUCCEEDED\x1b[2J\r\x07\xc2\x9b";
  r.worker->Log(ref, forged);
  r.worker->Exited(ref, 1, forged);
  ASSERT_TRUE(PollUntil([&] { return GetJob(r.id).failures() == 1; }));
  const std::string reason = GetJob(r.id).attempts(0).reason();
  EXPECT_TRUE(absl::StrContains(reason, "boom\\n2026-12-04T00:00:00.000Z")) << reason;
  EXPECT_TRUE(absl::StrContains(reason, "\\x1b[2J\\r\\x07\\u009b")) << reason;
  auto raw = [](const std::string& text) {
    return std::any_of(text.begin(), text.end(), [](char c) {
      const unsigned char u = static_cast<unsigned char>(c);
      return (u < 0x20 && u != '\t') || u == 0x7F;
    });
  };
  EXPECT_FALSE(raw(reason)) << reason;
  bool seen = false;
  for (const v1::LogLine& line : Logs(r.id)) {
    EXPECT_FALSE(raw(line.text())) << line.text();
    seen = seen || absl::StrContains(line.text(), "boom\\n2026");
  }
  EXPECT_TRUE(seen) << "the escaped line is kept";
}

// The finding: a worker could mark a job SUCCEEDED by claiming a checkpoint that does not
// exist, and the worker holding rank 1 of a two-rank job could set the job's final checkpoint.
// Now only rank 0 reports checkpoints, and the final one must be on disk with a manifest of
// that step and its shards before the job is SUCCEEDED.
TEST_F(FencingGrpcTest, AForgedFinalCheckpointLeavesTheJobNotSucceeded) {
  Running r = StartJob("honest", "forged");
  ASSERT_NE(r.worker, nullptr);
  const v1::WorkRef ref = r.assignment.ref();
  const std::string dir = r.assignment.checkpoint_dir();
  // Claimed, never written.
  auto ack = SendForAck(*r.worker, Checkpoint(ref, 60, dir + "/step-00000060"));
  ASSERT_TRUE(ack && ack->result() == v1::ACK_CODE_OK);
  r.worker->Exited(ref, 0);
  ASSERT_TRUE(PollUntil([&] { return GetJob(r.id).failures() == 1; }));
  v1::Job job = GetJob(r.id);
  EXPECT_NE(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(absl::StrContains(job.attempts(0).reason(), "has no manifest.json on disk"))
      << job.attempts(0).reason();
  // A manifest of another step at the claimed path is no result either.
  auto a2 = r.worker->WaitAssignment();
  ASSERT_TRUE(a2.has_value());
  r.worker->Started(a2->ref());
  testing::WriteCommittedCheckpoint(dir + "/step-00000060", 0, 30);
  r.worker->Exited(a2->ref(), 0);
  ASSERT_TRUE(PollUntil([&] { return GetJob(r.id).failures() == 2; }));
  job = GetJob(r.id);
  EXPECT_NE(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(absl::StrContains(job.attempts(1).reason(),
                                "is of stage 1 step 30, not the final stage 1 step 60"))
      << job.attempts(1).reason();
}

TEST_F(FencingGrpcTest, OnlyRankZeroSetsTheJobsCheckpoint) {
  FakeWorker& w0 = AddWorker("w0");
  FakeWorker& w1 = AddWorker("w1");
  auto id = Submit(JobYaml("pair", "    - {seq_len: 256, steps: 60, sp_degree: 2}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto a0 = w0.WaitAssignment();
  auto a1 = w1.WaitAssignment();
  ASSERT_TRUE(a0 && a1);
  const v1::Assignment& rank1 = a0->ref().rank() == 1 ? *a0 : *a1;
  FakeWorker& holder = a0->ref().rank() == 1 ? w0 : w1;
  w0.Started(a0->ref());
  w1.Started(a1->ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  const std::string path = rank1.checkpoint_dir() + "/step-00000060";
  testing::WriteCommittedCheckpoint(path, 0, 60);
  auto ack = SendForAck(holder, Checkpoint(rank1.ref(), 60, path));
  ASSERT_TRUE(ack.has_value());
  EXPECT_NE(ack->result(), v1::ACK_CODE_OK);
  EXPECT_TRUE(absl::StrContains(ack->message(), "only rank 0 does")) << ack->message();
  EXPECT_FALSE(GetJob(*id).has_last_checkpoint());
  EXPECT_EQ(Rejected("checkpoint_not_rank0"), 1);
}

TEST_F(FencingGrpcTest, StaleAndEndedGenerationsAreRejectedButLateLogsAreKept) {
  Running r = StartJob("honest", "restarts");
  ASSERT_NE(r.worker, nullptr);
  const v1::WorkRef gen1 = r.assignment.ref();
  // Generation 1 fails; its last stderr line arrives after the exit, as the agent sends it.
  r.worker->Exited(gen1, 1);
  auto a2 = r.worker->WaitAssignment();  // Backoff is 50 ms in the fixture.
  ASSERT_TRUE(a2.has_value());
  const v1::WorkRef gen2 = a2->ref();
  ASSERT_EQ(gen2.generation(), gen1.generation() + 1);
  r.worker->Send(Log(gen1, "Traceback of generation 1"));
  EXPECT_TRUE(PollUntil([&] { return HasLogLine(r.id, "Traceback of generation 1"); }));
  r.worker->Started(gen2);
  ASSERT_TRUE(WaitState(r.id, v1::JOB_STATE_RUNNING));

  ExpectStale(*r.worker, Progress(gen1, 50), "stale generation 1");
  ExpectStale(*r.worker, Exited(gen1, 0), "stale generation 1");
  ExpectStale(*r.worker, Checkpoint(gen1, 50, r.assignment.checkpoint_dir() + "/step-00000050"),
              "stale generation 1");
  EXPECT_EQ(Rejected("stale_generation"), 3);
  v1::Job job = GetJob(r.id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_FALSE(job.has_last_checkpoint());
  EXPECT_EQ(job.stages(0).progress().step(), 0);

  // Cancelled: generation 2 is current but has ended. Its exit is still acknowledged
  // (nothing changes); progress is refused.
  grpc::ClientContext ctx;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(r.id);
  v1::CancelJobResponse resp;
  ASSERT_TRUE(jobs_->CancelJob(&ctx, cancel, &resp).ok());
  ExpectStale(*r.worker, Progress(gen2, 50), "has ended");
  EXPECT_EQ(Rejected("job_not_running"), 1);
  auto exit_ack = SendForAck(*r.worker, Exited(gen2, 143));
  ASSERT_TRUE(exit_ack.has_value());
  EXPECT_EQ(exit_ack->result(), v1::ACK_CODE_OK);
  job = GetJob(r.id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.stages(0).progress().step(), 0);
}

}  // namespace
}  // namespace ulysses::coordinator
