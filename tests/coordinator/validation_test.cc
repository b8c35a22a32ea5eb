// The bounds of coordinator/validation.h, message by message, and their agreement with
// the rank event contract (common/contract/rank_event.h) that the worker's reports carry.
#include "coordinator/validation.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/contract/rank_event.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ulysses::coordinator {
namespace {

using ::testing::StartsWith;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The message of a rejection ("" when OK), so failures print what was said.
std::string Message(const absl::Status& status) {
  if (status.ok()) return "";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

// Two stages: {seq_len 256, 60 steps}, {seq_len 512, 40 steps}.
std::vector<StageRecord> Stages() {
  StageRecord s0;
  s0.index = 0;
  s0.seq_len = 256;
  s0.steps = 60;
  StageRecord s1;
  s1.index = 1;
  s1.seq_len = 512;
  s1.steps = 40;
  return {s0, s1};
}

v1::WorkRef Ref(int stage = 0) {
  v1::WorkRef ref;
  ref.set_job_id("job-000001");
  ref.set_generation(1);
  ref.set_rank(0);
  ref.set_stage(stage);
  return ref;
}

v1::ProgressReport Progress(int64_t step, double loss, int stage = 0) {
  v1::ProgressReport r;
  *r.mutable_ref() = Ref(stage);
  r.mutable_progress()->set_stage(stage);
  r.mutable_progress()->set_step(step);
  r.mutable_progress()->set_loss(loss);
  r.mutable_progress()->set_tokens_per_s(1000);
  return r;
}

TEST(ValidationTest, ProgressBounds) {
  const std::vector<StageRecord> stages = Stages();
  EXPECT_EQ(Message(ValidateProgressReport(Progress(1, 2.5), stages)), "");
  EXPECT_EQ(Message(ValidateProgressReport(Progress(60, 0), stages)), "");
  EXPECT_EQ(Message(ValidateProgressReport(Progress(40, 2.5, 1), stages)), "");
  EXPECT_EQ(Message(ValidateProgressReport(Progress(4, kNan), stages)),
            "progress.progress.loss: nan is not a finite number >= 0 (report the step's mean "
            "token loss; a non-finite loss is never stored)");
  EXPECT_THAT(Message(ValidateProgressReport(Progress(4, kInf), stages)),
              StartsWith("progress.progress.loss: inf is not a finite number >= 0"));
  EXPECT_THAT(Message(ValidateProgressReport(Progress(4, -kInf), stages)),
              StartsWith("progress.progress.loss: -inf is not a finite number >= 0"));
  EXPECT_THAT(Message(ValidateProgressReport(Progress(4, -1e300), stages)),
              StartsWith("progress.progress.loss: -1e+300 is not a finite number >= 0"));
  EXPECT_EQ(Message(ValidateProgressReport(Progress(1000000000000000, 2), stages)),
            "progress.progress.step: 1000000000000000 is out of range [1, 60] (a step of the "
            "stage: 1 .. its steps)");
  EXPECT_THAT(Message(ValidateProgressReport(Progress(41, 2, 1), stages)),
              StartsWith("progress.progress.step: 41 is out of range [1, 40]"));
  EXPECT_THAT(Message(ValidateProgressReport(Progress(0, 2), stages)),
              StartsWith("progress.progress.step: 0 is out of range [1, 60]"));
  v1::ProgressReport r = Progress(4, 2);
  r.mutable_progress()->set_tokens_per_s(kNan);
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.progress.tokens_per_s: nan is not a finite number >= 0"));
  r = Progress(4, 2);
  r.mutable_progress()->set_steps(61);
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)),
            "progress.progress.steps: 61 is not stage 0's steps 60 (report the stage's steps, "
            "or 0)");
  r.mutable_progress()->set_steps(60);
  r.mutable_progress()->set_seq_len(1024);
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)),
            "progress.progress.seq_len: 1024 is not stage 0's seq_len 256 (report the stage's "
            "seq_len, or 0)");
  r.mutable_progress()->set_seq_len(256);
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)), "");
  r.mutable_progress()->set_stage(1);
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)),
            "progress.progress.stage: 1 is not the ref's stage 0 (report the stage of the "
            "assignment)");
  // The job is unknown (no stages): the step is bounded by the report's own steps.
  r = Progress(61, 2);
  EXPECT_EQ(Message(ValidateProgressReport(r, {})), "");
  r.mutable_progress()->set_steps(60);
  EXPECT_THAT(Message(ValidateProgressReport(r, {})),
              StartsWith("progress.progress.step: 61 is out of range [1, 60]"));
}

// The optional timing figures (StepProgress 7..11): finite, >= 0, the slowest rank within
// the stage's group and given together with its seconds.
TEST(ValidationTest, ProgressStepFigures) {
  std::vector<StageRecord> stages = Stages();
  stages[0].sp = 2;
  stages[0].dp = 2;  // world 4
  v1::ProgressReport r = Progress(4, 2);
  v1::StepProgress* p = r.mutable_progress();
  p->set_step_seconds(0.5);
  p->set_mfu(0.42);
  p->set_median_step_seconds(0.5);
  p->set_slowest_rank(3);
  p->set_slowest_step_seconds(0.75);
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)), "");
  p->set_slowest_rank(4);
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)),
            "progress.progress.slowest_rank: 4 is out of range [0, 3] (a rank of the stage's "
            "group: 0 .. world size - 1)");
  p->set_slowest_rank(-1);
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.progress.slowest_rank: -1 is out of range [0, 3]"));
  p->set_slowest_rank(1);
  p->clear_slowest_step_seconds();
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)),
            "progress.progress.slowest_rank: 1 but slowest_step_seconds is unset (set both, or "
            "neither)");
  p->clear_slowest_rank();
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)), "");
  p->set_mfu(kNan);
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.progress.mfu: nan is not a finite number >= 0"));
  p->set_mfu(0.42);
  p->set_step_seconds(-1);
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.progress.step_seconds: -1 is not a finite number >= 0"));
  p->set_step_seconds(0.5);
  p->set_median_step_seconds(kInf);
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.progress.median_step_seconds: inf is not a finite number"));
}

TEST(ValidationTest, WorkRefBounds) {
  const std::vector<StageRecord> stages = Stages();
  v1::ProgressReport r = Progress(1, 2);
  r.mutable_ref()->set_stage(7);
  r.mutable_progress()->set_stage(7);
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)),
            "progress.ref.stage: 7 is not a stage of job-000001 (it has 2: 0..1) (send the ref "
            "of the assignment unchanged)");
  EXPECT_EQ(Message(ValidateProgressReport(r, {})), "");  // Unknown job: left to fencing.
  r = Progress(1, 2);
  r.mutable_ref()->set_generation(0);
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)),
            "progress.ref.generation: 0 must be >= 1 (send the ref of the assignment unchanged)");
  r = Progress(1, 2);
  r.mutable_ref()->set_rank(-1);
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.ref.rank: -1 is out of range [0, 1048575]"));
  r = Progress(1, 2);
  r.mutable_ref()->set_stage(-1);
  r.mutable_progress()->set_stage(-1);
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.ref.stage: -1 must be >= 0"));
  r = Progress(1, 2);
  r.mutable_ref()->set_job_id("");
  EXPECT_EQ(Message(ValidateProgressReport(r, stages)),
            "progress.ref.job_id: '' is empty (use a job id from SubmitJob or ListJobs, e.g. "
            "job-000001)");
  r.mutable_ref()->set_job_id(std::string(65, 'j'));
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.ref.job_id: 65 bytes is longer than 64"));
  r.mutable_ref()->set_job_id("job/../1");
  EXPECT_THAT(Message(ValidateProgressReport(r, stages)),
              StartsWith("progress.ref.job_id: 'job/../1' has characters other than"));
}

TEST(ValidationTest, EvalCheckpointExitedAndStartedBounds) {
  const std::vector<StageRecord> stages = Stages();
  v1::EvalReport e;
  *e.mutable_ref() = Ref();
  e.mutable_result()->set_seq_len(256);
  e.mutable_result()->set_loss(1.5);
  e.mutable_result()->set_accuracy(1.0);
  EXPECT_EQ(Message(ValidateEvalReport(e, stages)), "");
  e.mutable_result()->set_accuracy(7.5);
  EXPECT_EQ(Message(ValidateEvalReport(e, stages)),
            "eval.result.accuracy: 7.5 is not a finite number in [0, 1] (a fraction of correct "
            "answers, or 0 when not measured)");
  e.mutable_result()->set_accuracy(kNan);
  EXPECT_THAT(Message(ValidateEvalReport(e, stages)), StartsWith("eval.result.accuracy: nan"));
  e.mutable_result()->set_accuracy(0);
  e.mutable_result()->set_seq_len(0);
  EXPECT_THAT(Message(ValidateEvalReport(e, stages)),
              StartsWith("eval.result.seq_len: 0 must be >= 1"));
  e.mutable_result()->set_seq_len(256);
  e.mutable_result()->set_loss(kNan);
  EXPECT_THAT(Message(ValidateEvalReport(e, stages)),
              StartsWith("eval.result.loss: nan is not a finite number >= 0"));
  e.mutable_result()->set_loss(1.5);
  e.mutable_result()->set_step(60);  // the stage end of stage 0 (60 steps)
  EXPECT_EQ(Message(ValidateEvalReport(e, stages)), "");
  e.mutable_result()->set_step(61);
  EXPECT_THAT(Message(ValidateEvalReport(e, stages)),
              StartsWith("eval.result.step: 61 is out of range [0, 60]"));
  e.mutable_result()->set_step(-1);
  EXPECT_THAT(Message(ValidateEvalReport(e, stages)),
              StartsWith("eval.result.step: -1 is out of range [0, 60]"));

  v1::CheckpointCommitted c;
  *c.mutable_ref() = Ref(1);
  c.mutable_checkpoint()->set_stage(1);
  c.mutable_checkpoint()->set_step(40);
  c.mutable_checkpoint()->set_path("/ckpt/job-000001/s1-40");
  c.mutable_checkpoint()->set_bytes(-1);  // Unknown size.
  c.mutable_checkpoint()->set_seconds(0.25);
  EXPECT_EQ(Message(ValidateCheckpointCommitted(c, stages)), "");
  c.mutable_checkpoint()->set_step(999999);
  EXPECT_EQ(Message(ValidateCheckpointCommitted(c, stages)),
            "checkpoint.checkpoint.step: 999999 is out of range [0, 40] (the optimizer step the "
            "checkpoint holds: 0 .. the stage's steps)");
  c.mutable_checkpoint()->set_step(40);
  c.mutable_checkpoint()->set_bytes(-2);
  EXPECT_THAT(Message(ValidateCheckpointCommitted(c, stages)),
              StartsWith("checkpoint.checkpoint.bytes: -2 must be >= -1"));
  c.mutable_checkpoint()->set_bytes(100);
  c.mutable_checkpoint()->set_seconds(-kInf);
  EXPECT_THAT(Message(ValidateCheckpointCommitted(c, stages)),
              StartsWith("checkpoint.checkpoint.seconds: -inf is not a finite number >= 0"));
  c.mutable_checkpoint()->set_seconds(1);
  c.mutable_checkpoint()->set_blocked_seconds(0.5);
  EXPECT_EQ(Message(ValidateCheckpointCommitted(c, stages)), "");
  c.mutable_checkpoint()->set_blocked_seconds(-1);
  EXPECT_THAT(Message(ValidateCheckpointCommitted(c, stages)),
              StartsWith("checkpoint.checkpoint.blocked_seconds: -1 is not a finite number >= 0"));
  c.mutable_checkpoint()->clear_blocked_seconds();
  c.mutable_checkpoint()->set_path(std::string(4097, 'p'));
  EXPECT_THAT(Message(ValidateCheckpointCommitted(c, stages)),
              StartsWith("checkpoint.checkpoint.path: 4097 bytes is longer than 4096"));
  c.mutable_checkpoint()->set_path("/ckpt/a\nb");
  EXPECT_THAT(Message(ValidateCheckpointCommitted(c, stages)),
              StartsWith("checkpoint.checkpoint.path: '/ckpt/a\\nb' contains control characters"));
  c.mutable_checkpoint()->set_path("");
  EXPECT_THAT(Message(ValidateCheckpointCommitted(c, stages)),
              StartsWith("checkpoint.checkpoint.path: '' is empty"));
  c.mutable_checkpoint()->set_path("/ckpt/x");
  c.mutable_checkpoint()->set_stage(0);
  EXPECT_THAT(Message(ValidateCheckpointCommitted(c, stages)),
              StartsWith("checkpoint.checkpoint.stage: 0 is not the ref's stage 1"));

  v1::AttemptExited x;
  *x.mutable_ref() = Ref();
  x.set_exit_code(137);
  x.set_signal(9);
  x.set_error_message(std::string(100000, 'e'));  // Truncated by the coordinator, not refused.
  EXPECT_EQ(Message(ValidateAttemptExited(x, stages)), "");
  x.set_exit_code(-1);
  EXPECT_EQ(Message(ValidateAttemptExited(x, stages)),
            "exited.exit_code: -1 is out of range [0, 255] (the child's exit status, or 128 + "
            "signal when it was killed)");
  x.set_exit_code(0);
  x.set_signal(65);
  EXPECT_THAT(Message(ValidateAttemptExited(x, stages)),
              StartsWith("exited.signal: 65 is out of range [0, 64]"));

  v1::AttemptStarted st;
  *st.mutable_ref() = Ref();
  st.set_pid(4242);
  EXPECT_EQ(Message(ValidateAttemptStarted(st, stages)), "");
  st.set_pid(-1);
  EXPECT_THAT(Message(ValidateAttemptStarted(st, stages)), StartsWith("started.pid: -1 must be"));
  v1::PreemptionNotice n;
  *n.mutable_ref() = Ref(2);
  EXPECT_THAT(Message(ValidatePreemptionNotice(n, stages)),
              StartsWith("preempting.ref.stage: 2 is not a stage of job-000001"));
}

TEST(ValidationTest, LogBatchAndHeartbeatBounds) {
  const std::vector<StageRecord> stages = Stages();
  v1::LogBatch b;  // Agent lines outside any job: no ref at all.
  b.add_lines()->set_text(std::string(1 << 20, 'x'));  // Long lines are truncated, not refused.
  b.add_lines()->set_stream(v1::LOG_STREAM_AGENT);
  EXPECT_EQ(Message(ValidateLogBatch(b, stages)), "");
  b.mutable_lines(1)->set_stream(v1::LOG_STREAM_COORDINATOR);
  EXPECT_EQ(Message(ValidateLogBatch(b, stages)),
            "logs.lines[1].stream: 4 is not a worker's log stream (use LOG_STREAM_STDOUT, "
            "LOG_STREAM_STDERR or LOG_STREAM_AGENT)");
  b.mutable_lines(1)->set_stream(static_cast<v1::LogStream>(99));
  EXPECT_THAT(Message(ValidateLogBatch(b, stages)), StartsWith("logs.lines[1].stream: 99"));
  b.mutable_lines(1)->set_stream(v1::LOG_STREAM_STDOUT);
  b.mutable_lines(1)->mutable_time()->set_seconds(300000000000);
  EXPECT_THAT(Message(ValidateLogBatch(b, stages)),
              StartsWith("logs.lines[1].time: {seconds: 300000000000, nanos: 0} is not a valid "
                         "timestamp"));
  b.mutable_lines(1)->clear_time();
  *b.mutable_ref() = Ref();
  b.mutable_ref()->set_generation(-3);
  EXPECT_THAT(Message(ValidateLogBatch(b, stages)),
              StartsWith("logs.ref.generation: -3 must be >= 1"));
  *b.mutable_ref() = Ref();
  while (b.lines_size() <= kMaxLogLinesPerBatch) b.add_lines()->set_text("line");
  EXPECT_EQ(Message(ValidateLogBatch(b, stages)),
            "logs.lines: 1001 lines are more than 1000 in one batch (send them in several "
            "batches)");

  v1::Heartbeat hb;
  EXPECT_EQ(Message(ValidateHeartbeat(hb)), "");
  hb.mutable_sent_at()->set_nanos(-1);
  EXPECT_THAT(Message(ValidateHeartbeat(hb)), StartsWith("heartbeat.sent_at: {seconds: 0, "));
  hb.clear_sent_at();
  *hb.mutable_running()->mutable_ref() = Ref();
  hb.mutable_running()->set_pid(-7);
  EXPECT_THAT(Message(ValidateHeartbeat(hb)), StartsWith("heartbeat.running.pid: -7 must be"));
  hb.mutable_running()->set_pid(7);
  hb.mutable_running()->mutable_ref()->set_generation(0);
  EXPECT_THAT(Message(ValidateHeartbeat(hb)),
              StartsWith("heartbeat.running.ref.generation: 0 must be >= 1"));
}

TEST(ValidationTest, WorkerMessageDispatchRefAndReason) {
  const std::vector<StageRecord> stages = Stages();
  v1::WorkerMessage m;
  EXPECT_EQ(WorkRefOf(m), nullptr);
  EXPECT_EQ(InvalidReason(m), "unexpected_kind");
  EXPECT_EQ(Message(ValidateWorkerMessage(m, stages)), "");  // The coordinator answers it.
  *m.mutable_progress() = Progress(4, kNan);
  ASSERT_NE(WorkRefOf(m), nullptr);
  EXPECT_EQ(WorkRefOf(m), &m.progress().ref());
  EXPECT_EQ(InvalidReason(m), "invalid_progress");
  EXPECT_THAT(Message(ValidateWorkerMessage(m, stages)), StartsWith("progress.progress.loss"));
  m.mutable_heartbeat();
  EXPECT_EQ(WorkRefOf(m), nullptr);
  EXPECT_EQ(InvalidReason(m), "invalid_heartbeat");
  m.mutable_exited()->set_exit_code(300);
  *m.mutable_exited()->mutable_ref() = Ref();
  EXPECT_EQ(WorkRefOf(m), &m.exited().ref());
  EXPECT_EQ(InvalidReason(m), "invalid_exited");
  EXPECT_THAT(Message(ValidateWorkerMessage(m, stages)), StartsWith("exited.exit_code: 300"));
  const std::vector<std::pair<std::function<void(v1::WorkerMessage*)>, std::string>> kinds = {
      {[](v1::WorkerMessage* w) { w->mutable_started(); }, "invalid_started"},
      {[](v1::WorkerMessage* w) { w->mutable_logs(); }, "invalid_logs"},
      {[](v1::WorkerMessage* w) { w->mutable_checkpoint(); }, "invalid_checkpoint"},
      {[](v1::WorkerMessage* w) { w->mutable_eval(); }, "invalid_eval"},
      {[](v1::WorkerMessage* w) { w->mutable_preempting(); }, "invalid_preempting"},
      {[](v1::WorkerMessage* w) { w->mutable_hello(); }, "unexpected_kind"},
  };
  for (const auto& [set, reason] : kinds) {
    v1::WorkerMessage k;
    set(&k);
    EXPECT_EQ(InvalidReason(k), reason);
    EXPECT_EQ(WorkRefOf(k) != nullptr, reason != "unexpected_kind") << reason;
  }
}

// A multi-slot worker: one device per slot, each GPU once, capacity matching, and the
// running ranks it reports within its slots, each slot once.
TEST(ValidationTest, RegisterDevicesAndRunningRanksFitTheSlots) {
  v1::RegisterRequest r;
  r.set_name("node3");
  r.set_host("10.0.0.7");
  for (const char* d : {"cuda:0", "cuda:1", "cuda:2", "cuda:3"}) r.add_devices(d);
  EXPECT_EQ(Message(ValidateRegisterRequest(r)), "");
  r.set_capacity(4);
  EXPECT_EQ(Message(ValidateRegisterRequest(r)), "");
  r.set_capacity(8);
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("capacity: 8 differs from the 4 devices (send capacity = the number"));
  r.set_capacity(0);
  r.set_devices(2, "cuda:1");
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("devices[2]: 'cuda:1' is listed twice (one entry per slot"));
  r.set_devices(2, "");
  EXPECT_THAT(Message(ValidateRegisterRequest(r)), StartsWith("devices[2]: '' is empty"));
  r.clear_devices();
  r.add_devices("cpu");
  r.add_devices("cpu");  // CPU slots repeat.
  EXPECT_EQ(Message(ValidateRegisterRequest(r)), "");
  for (int slot : {1, 0}) {
    v1::RunningWork* w = r.add_running_ranks();
    *w->mutable_ref() = Ref();
    w->mutable_ref()->set_rank(slot);
    w->set_slot(slot);
  }
  EXPECT_EQ(Message(ValidateRegisterRequest(r)), "");
  r.mutable_running_ranks(1)->set_slot(1);
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("running_ranks[1].slot: 1 is reported twice"));
  r.mutable_running_ranks(1)->set_slot(2);
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("running_ranks[1].slot: 2 is not one of the worker's 2 slots"));
  r.mutable_running_ranks(1)->set_slot(0);
  *r.add_running_ranks() = r.running_ranks(0);
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("running_ranks: 3 entries is more than the worker's 2 slots"));
}

TEST(ValidationTest, RegisterAndHelloBounds) {
  v1::RegisterRequest r;
  r.set_name("node3-gpu5");
  r.set_host("10.0.0.7");
  r.set_device("cuda:0");
  r.set_node_label("rack1_nvl-0");
  r.set_agent_version("0.1.0");
  EXPECT_EQ(Message(ValidateRegisterRequest(r)), "");
  for (const char* ok : {"w1", "a", "a.b-c", "pod-7.ns.svc", "0"}) {
    r.set_name(ok);
    EXPECT_EQ(Message(ValidateRegisterRequest(r)), "") << ok;
  }
  r.set_name(std::string(253, 'a'));
  EXPECT_EQ(Message(ValidateRegisterRequest(r)), "");
  for (const char* bad : {"Node3", "-a", "a-", "a..b", ".a", "a.", "a_b", "a,b", "a b", "a.-b"}) {
    r.set_name(bad);
    EXPECT_THAT(Message(ValidateRegisterRequest(r)),
                StartsWith(absl::StrCat("name: '", bad, "' is not a DNS-1123 name (")))
        << bad;
  }
  r.set_name("");
  EXPECT_EQ(Message(ValidateRegisterRequest(r)),
            "name: '' is empty (give every worker a unique, stable name)");
  r.set_name(std::string(254, 'a'));
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("name: 254 bytes is longer than 253 (use at most 253 lowercase"));
  r.set_name("w1");
  for (const char* ok : {"[fe80::1%eth0]", "node-3.cluster.local", "10.0.0.1"}) {
    r.set_host(ok);
    EXPECT_EQ(Message(ValidateRegisterRequest(r)), "") << ok;
  }
  r.set_host("");
  EXPECT_THAT(Message(ValidateRegisterRequest(r)), StartsWith("host: '' is empty"));
  r.set_host("h\tx");
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("host: 'h\\tx' has characters other than"));
  r.set_host("10.0.0.1");
  r.set_node_label("a,b");
  EXPECT_THAT(Message(ValidateRegisterRequest(r)), StartsWith("node_label: 'a,b' has characters"));
  r.set_node_label("");
  r.set_device("cuda 0");
  EXPECT_THAT(Message(ValidateRegisterRequest(r)), StartsWith("device: 'cuda 0' has characters"));
  r.set_device("");
  r.set_capacity(kMaxCapacity + 1);
  EXPECT_THAT(Message(ValidateRegisterRequest(r)), StartsWith("capacity: 1025 is out of range"));
  r.set_capacity(0);
  r.set_agent_version(std::string(129, 'v'));
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("agent_version: 129 bytes is longer than 128"));
  r.set_agent_version("1");
  *r.mutable_running()->mutable_ref() = Ref();
  r.mutable_running()->mutable_ref()->set_rank(1 << 20);
  EXPECT_THAT(Message(ValidateRegisterRequest(r)),
              StartsWith("running.ref.rank: 1048576 is out of range [0, 1048575]"));

  v1::SessionHello hello;
  EXPECT_THAT(Message(ValidateSessionHello(hello)), StartsWith("hello.worker_id: '' is empty"));
  hello.set_worker_id("w-" + std::string(253, 'a'));
  EXPECT_EQ(Message(ValidateSessionHello(hello)), "");
  hello.set_worker_id("w-" + std::string(254, 'a'));
  EXPECT_THAT(Message(ValidateSessionHello(hello)),
              StartsWith("hello.worker_id: 256 bytes is longer than 255"));
}

TEST(ValidationTest, JobServiceRequestBounds) {
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-000001");
  EXPECT_EQ(Message(ValidateCancelJobRequest(cancel)), "");
  cancel.set_reason(std::string(kMaxReasonBytes, 'r'));
  EXPECT_EQ(Message(ValidateCancelJobRequest(cancel)), "");
  cancel.set_reason(std::string(3500 * 1024, 'r'));
  EXPECT_EQ(Message(ValidateCancelJobRequest(cancel)),
            "reason: 3584000 bytes is longer than 1024 (give a one-line reason of at most 1 KiB, "
            "or none)");
  cancel.set_reason("a\x1b[31mred");
  EXPECT_EQ(Message(ValidateCancelJobRequest(cancel)),
            "reason: 'a\\x1b[31mred' contains control characters (give a one-line reason of at "
            "most 1 KiB, or none)");
  cancel.set_reason("");
  cancel.set_job_id("");
  EXPECT_THAT(Message(ValidateCancelJobRequest(cancel)), StartsWith("job_id: '' is empty"));

  v1::GetJobRequest get;
  get.set_job_id(std::string(1 << 20, 'j'));
  EXPECT_THAT(Message(ValidateGetJobRequest(get)),
              StartsWith("job_id: 1048576 bytes is longer than 64"));
  v1::ResumeJobRequest resume;
  resume.set_job_id("job 1");
  EXPECT_THAT(Message(ValidateResumeJobRequest(resume)),
              StartsWith("job_id: 'job 1' has characters other than [A-Za-z0-9._-]"));
  v1::WatchJobRequest watch;
  watch.set_job_id("job-000001");
  EXPECT_EQ(Message(ValidateWatchJobRequest(watch)), "");

  v1::GetJobLogsRequest logs;
  logs.set_job_id("job-000001");
  logs.set_tail_lines(-1);
  EXPECT_EQ(Message(ValidateGetJobLogsRequest(logs)), "");
  logs.set_tail_lines(-2);
  EXPECT_THAT(Message(ValidateGetJobLogsRequest(logs)), StartsWith("tail_lines: -2 must be >= -1"));

  v1::ListJobsRequest list;
  list.add_states(v1::JOB_STATE_RUNNING);
  list.set_page_token("12");
  EXPECT_EQ(Message(ValidateListJobsRequest(list)), "");
  list.add_states(v1::JOB_STATE_UNSPECIFIED);
  EXPECT_THAT(Message(ValidateListJobsRequest(list)),
              StartsWith("states[1]: 0 is not a job state"));
  list.clear_states();
  list.set_page_token(std::string(33, '1'));
  EXPECT_THAT(Message(ValidateListJobsRequest(list)),
              StartsWith("page_token: 33 bytes is longer than 32"));
  list.clear_page_token();
  for (int i = 0; i <= kMaxStateFilters; ++i) list.add_states(v1::JOB_STATE_PENDING);
  EXPECT_THAT(Message(ValidateListJobsRequest(list)), StartsWith("states: 17 entries are more"));

  v1::SubmitJobRequest submit;
  submit.add_overrides("spec.stages[0].steps=5");
  EXPECT_EQ(Message(ValidateSubmitJobRequest(submit)), "");
  submit.add_overrides(std::string(kMaxOverrideBytes + 1, 'o'));
  EXPECT_THAT(Message(ValidateSubmitJobRequest(submit)),
              StartsWith("overrides[1]: 4097 bytes is longer than 4096"));
  submit.mutable_overrides(1)->assign("spec.seed=1\nspec.seed=2");
  EXPECT_THAT(Message(ValidateSubmitJobRequest(submit)),
              StartsWith("overrides[1]: 'spec.seed=1\\nspec.seed=2' contains control"));
}

TEST(ValidationTest, TruncateTextKeepsWholeCharactersWithinTheBound) {
  EXPECT_EQ(TruncateText("short", 64), "short");
  const std::string exact(16384, 'x');
  EXPECT_EQ(TruncateText(exact, 16384), exact);
  const std::string mib(1 << 20, 'x');
  const std::string cut = TruncateText(mib, 16384);
  EXPECT_EQ(cut, std::string(16344, 'x') + " [truncated 1032232 bytes]");
  EXPECT_LE(cut.size(), 16384u);
  // A 3-byte character (U+20AC, "€") straddling the cut is dropped whole.
  std::string euro;
  for (int i = 0; i < 100; ++i) euro += "\xE2\x82\xAC";
  // Room for 25 bytes: the 9th character's first byte fits, so the cut backs up to 24.
  const std::string cut_euro = TruncateText(euro, 65);
  EXPECT_EQ(cut_euro, euro.substr(0, 24) + " [truncated 276 bytes]");
  EXPECT_LE(cut_euro.size(), 65u);
}

// The worker's reports carry the rank events of docs/CONTRACTS.md: for every value the
// proto cannot leave unset, the coordinator accepts exactly what the contract's parser
// accepts (the job unknown, so only the report's own numbers bound it).
TEST(ValidationTest, ReportsAgreeWithTheRankEventContract) {
  const std::vector<double> losses = {kNan, kInf, -kInf, -1e300, -1, 0, 2.5, 1e300};
  int checked = 0;
  for (int64_t steps : {-1, 1, 60}) {
    for (int64_t step : std::vector<int64_t>{-5, 0, 1, 60, 61, 1000000000000000}) {
      for (double loss : losses) {
        for (double tps : {kNan, -1.0, 0.0, 1e9}) {
          for (int64_t seq_len : {-1, 1, 256}) {
            contract::StepEvent e{0, step, steps, loss, tps, seq_len};
            const bool contract_ok =
                contract::ParseRankEventLine(contract::SerializeRankEvent(e)).ok();
            v1::ProgressReport r = Progress(step, loss);
            r.mutable_progress()->set_steps(steps);
            r.mutable_progress()->set_tokens_per_s(tps);
            r.mutable_progress()->set_seq_len(seq_len);
            const absl::Status ours = ValidateProgressReport(r, {});
            EXPECT_EQ(ours.ok(), contract_ok)
                << "step " << step << "/" << steps << " loss " << loss << " tps " << tps
                << " seq_len " << seq_len << ": " << ours;
            ++checked;
          }
        }
      }
    }
  }
  for (int64_t step : std::vector<int64_t>{-1, 0, 5, 1000000000000000}) {
    for (int64_t bytes : std::vector<int64_t>{-2, -1, 0, 1000000000000}) {
      for (double seconds : {kNan, -1.0, 0.0, 0.25, kInf}) {
        for (const std::string& path : {std::string(), std::string("/ckpt/a"),
                                        std::string(4097, 'p'), std::string("/a\nb")}) {
          contract::CheckpointEvent e{0, step, path, bytes, seconds};
          const bool contract_ok =
              contract::ParseRankEventLine(contract::SerializeRankEvent(e)).ok();
          v1::CheckpointCommitted c;
          *c.mutable_ref() = Ref();
          c.mutable_checkpoint()->set_step(step);
          c.mutable_checkpoint()->set_path(path);
          c.mutable_checkpoint()->set_bytes(bytes);
          c.mutable_checkpoint()->set_seconds(seconds);
          const absl::Status ours = ValidateCheckpointCommitted(c, {});
          EXPECT_EQ(ours.ok(), contract_ok) << "checkpoint step " << step << " bytes " << bytes
                                            << " seconds " << seconds << ": " << ours;
          ++checked;
        }
      }
    }
  }
  for (int64_t seq_len : {-1, 0, 1, 256}) {
    for (double loss : losses) {
      for (double accuracy : {kNan, -0.1, 0.0, 0.5, 1.0, 7.5}) {
        contract::EvalEvent e{0, seq_len, loss, accuracy};
        const bool contract_ok = contract::ParseRankEventLine(contract::SerializeRankEvent(e)).ok();
        v1::EvalReport r;
        *r.mutable_ref() = Ref();
        r.mutable_result()->set_seq_len(seq_len);
        r.mutable_result()->set_loss(loss);
        r.mutable_result()->set_accuracy(accuracy);
        const absl::Status ours = ValidateEvalReport(r, {});
        EXPECT_EQ(ours.ok(), contract_ok) << "eval seq_len " << seq_len << " loss " << loss
                                          << " accuracy " << accuracy << ": " << ours;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 1728 + 320 + 192);
}

}  // namespace
}  // namespace ulysses::coordinator
