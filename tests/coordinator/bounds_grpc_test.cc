// The attacks of issue 9 that bounds stop, done through the real gRPC API against an
// in-process coordinator (grpc_fixture.h): each gets a clear error naming the field (or
// the documented truncation), changes nothing (job state, stored progress), and leaves
// the coordinator healthy (SERVING, still writing).
#include <sqlite3.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using testing::FakeWorker;
using testing::JobYaml;
using testing::PollUntil;
using ::testing::StartsWith;

constexpr auto kAckTimeout = std::chrono::seconds(5);

class BoundsGrpcTest : public testing::CoordinatorServerTest {
 protected:
  void SetUp() override {
    // LogLineFlood reads ~7 MiB of 16 KiB lines back in one tail (a tail sends at most half
    // of stream_queue_max_bytes): room for all of it.
    config_.stream_queue_max_bytes = 64 << 20;
    testing::CoordinatorServerTest::SetUp();
  }
  // One worker running rank 0 of a one-stage job of 60 steps (seq_len 256).
  struct Running {
    FakeWorker* worker = nullptr;
    std::string id;
    v1::WorkRef ref;
    std::string checkpoint_dir;  // From the assignment.
  };
  Running StartJob() {
    Running r;
    r.worker = &AddWorker("w1");
    auto id = Submit(JobYaml("bounds", "    - {seq_len: 256, steps: 60}\n"));
    EXPECT_TRUE(id.ok()) << id.status();
    r.id = id.value_or("");
    auto a = r.worker->WaitAssignment();
    EXPECT_TRUE(a.has_value());
    if (!a) return r;
    r.ref = a->ref();
    r.checkpoint_dir = a->checkpoint_dir();
    r.worker->Started(r.ref);
    EXPECT_TRUE(WaitState(r.id, v1::JOB_STATE_RUNNING));
    return r;
  }

  // Expects `m` to be rejected with ACK_CODE_INVALID and a message starting `prefix`.
  void ExpectInvalid(FakeWorker& w, v1::WorkerMessage m, const std::string& prefix) {
    SCOPED_TRACE(prefix);
    std::optional<v1::Ack> ack = SendForAck(w, std::move(m));
    ASSERT_TRUE(ack.has_value()) << "no Ack: the message was accepted";
    EXPECT_EQ(ack->result(), v1::ACK_CODE_INVALID);
    EXPECT_THAT(ack->message(), StartsWith(prefix));
  }

  static v1::WorkerMessage Progress(const v1::WorkRef& ref, int64_t step, double loss,
                                    double tokens_per_s = 1000) {
    v1::WorkerMessage m;
    *m.mutable_progress()->mutable_ref() = ref;
    v1::StepProgress* p = m.mutable_progress()->mutable_progress();
    p->set_stage(ref.stage());
    p->set_step(step);
    p->set_loss(loss);
    p->set_tokens_per_s(tokens_per_s);
    return m;
  }

  // The stages row of `job_id` as written to SQLite: {step, loss}; nullopt without a row.
  std::optional<std::pair<int64_t, double>> StoredStage(const std::string& job_id) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open((dir_.path() + "/coordinator.db").c_str(), &db), SQLITE_OK);
    sqlite3_stmt* q = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT step, loss FROM stages WHERE job_id=? AND idx=0", -1,
                                 &q, nullptr),
              SQLITE_OK);
    sqlite3_bind_text(q, 1, job_id.c_str(), -1, SQLITE_TRANSIENT);
    std::optional<std::pair<int64_t, double>> row;
    if (sqlite3_step(q) == SQLITE_ROW)
      row = {sqlite3_column_int64(q, 0), sqlite3_column_double(q, 1)};
    sqlite3_finalize(q);
    sqlite3_close(db);
    return row;
  }

  absl::Status Cancel(const std::string& id, const std::string& reason) {
    v1::CancelJobRequest req;
    req.set_job_id(id);
    req.set_reason(reason);
    v1::CancelJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    return FromGrpcStatus(jobs_->CancelJob(&ctx, req, &resp));
  }

  int64_t StateDirBytes() {
    int64_t total = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
      if (entry.is_regular_file()) total += static_cast<int64_t>(entry.file_size());
    }
    return total;
  }
};

// Before: one ProgressReport with loss = NaN made the NOT NULL write fail and the
// coordinator NOT_SERVING until a restart.
TEST_F(BoundsGrpcTest, NonFiniteLossIsRejectedNeverStoredAndTheStoreKeepsWriting) {
  Running r = StartJob();
  ASSERT_NE(r.worker, nullptr);
  r.worker->Progress(r.ref, 3, 2.5);
  ASSERT_TRUE(PollUntil([&] { return GetJob(r.id).stages(0).progress().step() == 3; }));

  ExpectInvalid(*r.worker, Progress(r.ref, 4, std::nan("")),
                "progress.progress.loss: nan is not a finite number >= 0");
  ExpectInvalid(*r.worker, Progress(r.ref, 4, std::numeric_limits<double>::infinity()),
                "progress.progress.loss: inf is not a finite number >= 0");
  v1::WorkerMessage eval;
  *eval.mutable_eval()->mutable_ref() = r.ref;
  eval.mutable_eval()->mutable_result()->set_seq_len(256);
  eval.mutable_eval()->mutable_result()->set_loss(std::nan(""));
  ExpectInvalid(*r.worker, eval, "eval.result.loss: nan is not a finite number >= 0");

  v1::Job job = GetJob(r.id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.stages(0).progress().step(), 3);
  EXPECT_DOUBLE_EQ(job.stages(0).progress().loss(), 2.5);
  EXPECT_DOUBLE_EQ(job.loss(), 2.5);
  EXPECT_FALSE(job.stages(0).has_eval());
  // The store keeps writing: the next honest step reaches SQLite (flushed within ~1 s).
  r.worker->Progress(r.ref, 5, 2.0);
  EXPECT_TRUE(PollUntil(
      [&] {
        auto row = StoredStage(r.id);
        return row && row->first == 5 && row->second == 2.0;
      },
      std::chrono::seconds(10)));
  EXPECT_TRUE(Serving());
  const std::string metrics = Metrics();
  EXPECT_NE(metrics.find("ulysses_rejected_reports_total{reason=\"invalid_progress\"} 2"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("ulysses_rejected_reports_total{reason=\"invalid_eval\"} 1"),
            std::string::npos)
      << metrics;
}

// Before: step 1e15 of 60, loss -1e300 and accuracy 7.5 were accepted and shown.
TEST_F(BoundsGrpcTest, AbsurdReportsAreRejectedWithTheFieldNamedAndChangeNothing) {
  Running r = StartJob();
  ASSERT_NE(r.worker, nullptr);
  r.worker->Progress(r.ref, 3, 2.5);
  ASSERT_TRUE(PollUntil([&] { return GetJob(r.id).stages(0).progress().step() == 3; }));

  ExpectInvalid(*r.worker, Progress(r.ref, 1000000000000000, 2.0),
                "progress.progress.step: 1000000000000000 is out of range [1, 60]");
  ExpectInvalid(*r.worker, Progress(r.ref, 4, -1e300),
                "progress.progress.loss: -1e+300 is not a finite number >= 0");
  ExpectInvalid(*r.worker, Progress(r.ref, 4, 2.0, -5),
                "progress.progress.tokens_per_s: -5 is not a finite number >= 0");
  v1::WorkRef stage7 = r.ref;
  stage7.set_stage(7);
  ExpectInvalid(*r.worker, Progress(stage7, 4, 2.0),
                "progress.ref.stage: 7 is not a stage of " + r.id + " (it has 1: 0..0)");
  v1::WorkerMessage eval;
  *eval.mutable_eval()->mutable_ref() = r.ref;
  eval.mutable_eval()->mutable_result()->set_seq_len(256);
  eval.mutable_eval()->mutable_result()->set_loss(1.5);
  eval.mutable_eval()->mutable_result()->set_accuracy(7.5);
  ExpectInvalid(*r.worker, eval, "eval.result.accuracy: 7.5 is not a finite number in [0, 1]");
  v1::WorkerMessage ckpt;
  *ckpt.mutable_checkpoint()->mutable_ref() = r.ref;
  v1::Checkpoint* c = ckpt.mutable_checkpoint()->mutable_checkpoint();
  c->set_path("/ckpt/s0-999999");
  c->set_step(999999);
  c->set_bytes(1 << 20);
  c->set_seconds(0.5);
  ExpectInvalid(*r.worker, ckpt, "checkpoint.checkpoint.step: 999999 is out of range [0, 60]");
  c->set_step(10);
  c->set_seconds(std::nan(""));
  ExpectInvalid(*r.worker, ckpt, "checkpoint.checkpoint.seconds: nan is not a finite number >= 0");
  c->set_seconds(0.5);
  c->set_bytes(-5);
  ExpectInvalid(*r.worker, ckpt, "checkpoint.checkpoint.bytes: -5 must be >= -1");
  v1::WorkerMessage exited;
  *exited.mutable_exited()->mutable_ref() = r.ref;
  exited.mutable_exited()->set_exit_code(1000000);
  ExpectInvalid(*r.worker, exited, "exited.exit_code: 1000000 is out of range [0, 255]");

  v1::Job job = GetJob(r.id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.stages(0).progress().step(), 3);
  EXPECT_DOUBLE_EQ(job.stages(0).progress().loss(), 2.5);
  EXPECT_DOUBLE_EQ(job.stages(0).progress().tokens_per_s(), 1000);
  EXPECT_FALSE(job.stages(0).has_eval());
  EXPECT_FALSE(job.has_last_checkpoint());
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_RUNNING);
  EXPECT_TRUE(Serving());
  // The honest path still works after the rejections.
  testing::WriteCommittedCheckpoint(r.checkpoint_dir + "/step-00000060", 0, 60);
  uint64_t seq = r.worker->Checkpoint(r.ref, 60, r.checkpoint_dir + "/step-00000060");
  auto ack = r.worker->WaitAck(seq, kAckTimeout);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->result(), v1::ACK_CODE_OK);
  r.worker->Exited(r.ref, 0);
  EXPECT_TRUE(WaitState(r.id, v1::JOB_STATE_SUCCEEDED));
}

// Before: 30 x CancelJob with a 3.5 MB reason grew SQLite 46 -> 155 MB.
TEST_F(BoundsGrpcTest, HugeCancelReasonIsRefusedAndNothingGrows) {
  Running r = StartJob();
  ASSERT_NE(r.worker, nullptr);
  const v1::Job before = GetJob(r.id);
  const int64_t bytes_before = StateDirBytes();
  const std::string huge(3500 * 1024, 'x');
  for (int i = 0; i < 10; ++i) {
    absl::Status s = Cancel(r.id, huge);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(),
              "reason: 3584000 bytes is longer than 1024 (give a one-line reason of at most 1 "
              "KiB, or none)");
  }
  absl::Status s = Cancel(r.id, "two\nlines");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), StartsWith("reason: 'two\\nlines' contains control"));
  v1::Job after = GetJob(r.id);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.reason(), before.reason());
  EXPECT_EQ(after.events_size(), before.events_size());
  EXPECT_LT(StateDirBytes() - bytes_before, 256 * 1024);
  // A reason within the bound is taken as given.
  const std::string kib(1024, 'r');
  ASSERT_TRUE(Cancel(r.id, kib).ok());
  EXPECT_EQ(GetJob(r.id).reason(), kib);
  EXPECT_TRUE(Serving());
}

// Before: the log buffer was bounded in lines, not bytes (450 x 1 MB lines -> +490 MB RSS).
TEST_F(BoundsGrpcTest, LogLineFloodIsTruncatedToSixteenKiB) {
  Running r = StartJob();
  ASSERT_NE(r.worker, nullptr);
  const std::string mib(1 << 20, 'x');
  for (int batch = 0; batch < 10; ++batch) {
    v1::WorkerMessage m;
    *m.mutable_logs()->mutable_ref() = r.ref;
    for (int i = 0; i < 3; ++i) m.mutable_logs()->add_lines()->set_text(mib);
    ASSERT_TRUE(r.worker->Send(std::move(m)));
  }
  // Rejected batches: too many lines; a worker posing as the coordinator.
  v1::WorkerMessage many;
  *many.mutable_logs()->mutable_ref() = r.ref;
  for (int i = 0; i < 1001; ++i) many.mutable_logs()->add_lines()->set_text("spam");
  ExpectInvalid(*r.worker, many, "logs.lines: 1001 lines are more than 1000 in one batch");
  v1::WorkerMessage spoof;
  *spoof.mutable_logs()->mutable_ref() = r.ref;
  v1::LogLine* line = spoof.mutable_logs()->add_lines();
  line->set_stream(v1::LOG_STREAM_COORDINATOR);
  line->set_text("job RUNNING -> CANCELLED: cancelled by admin");
  ExpectInvalid(*r.worker, spoof, "logs.lines[0].stream: 4 is not a worker's log stream");

  // 400 lines just over the bound: ~7 MB of 16 KiB lines in the buffer (within the default
  // log_buffer_bytes_per_job of 8 MiB), which GetJobLogs must still stream (in messages
  // under the 4 MB gRPC limit).
  const std::string over(20 * 1024, 'y');
  for (int batch = 0; batch < 4; ++batch) {
    v1::WorkerMessage m;
    *m.mutable_logs()->mutable_ref() = r.ref;
    for (int i = 0; i < 100; ++i) m.mutable_logs()->add_lines()->set_text(over);
    ASSERT_TRUE(r.worker->Send(std::move(m)));
  }

  const std::string truncated = std::string(16384 - 40, 'x') + " [truncated 1032232 bytes]";
  const std::string truncated_over = std::string(16384 - 40, 'y') + " [truncated 4136 bytes]";
  ASSERT_LE(truncated.size(), 16384u);
  std::vector<v1::LogLine> lines;
  ASSERT_TRUE(PollUntil([&] {
    lines = Logs(r.id);
    int flood = 0, flood_over = 0;
    for (const v1::LogLine& l : lines) {
      flood += l.text() == truncated;
      flood_over += l.text() == truncated_over;
    }
    return flood == 30 && flood_over == 400;
  })) << lines.size()
      << " lines";
  for (const v1::LogLine& l : lines) {
    EXPECT_LE(l.text().size(), 16384u);
    EXPECT_NE(l.text(), "spam");
    EXPECT_EQ(l.text().find("cancelled by admin"), std::string::npos);
  }
  EXPECT_EQ(GetJob(r.id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(Serving());
}

// Before: a spec with 111,005 stages was accepted (and its 10.5 MB SubmitJob response
// failed, yet the job existed); max_failures = 2^31 silently became negative.
TEST_F(BoundsGrpcTest, OversizedSpecsAreRefusedAndLeaveNoTrace) {
  std::string stages;
  for (int i = 0; i < 111005; ++i) stages += "    - {seq_len: 1, steps: 1}\n";
  auto id = Submit(JobYaml("huge", stages));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(id.status().message()).find(" bytes is more than 262144 "),
            std::string::npos)
      << id.status().message().substr(0, 200);

  stages.clear();
  for (int i = 1; i <= 65; ++i)
    stages += absl::StrCat("    - {seq_len: ", 256 * i, ", steps: 1}\n");
  id = Submit(JobYaml("many", stages));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(id.status().message(),
            "spec.stages: 65 stages is more than 64 (split the run into jobs of at most 64 "
            "stages, each resuming from the last one's checkpoint)");

  id = Submit(JobYaml("budget", "    - {seq_len: 256, steps: 2}\n", "{max_failures: 2147483648}"));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(id.status().message(),
            "spec.scheduling.max_failures: 2147483648 is more than 2147483647 (use e.g. 3)");

  v1::SubmitJobRequest req;
  req.set_spec_yaml(JobYaml("overrides", "    - {seq_len: 256, steps: 2}\n"));
  for (int i = 0; i < 65; ++i) req.add_overrides("spec.stages[0].steps=3");
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(10));
  absl::Status s = FromGrpcStatus(jobs_->SubmitJob(&ctx, req, &resp));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "overrides: 65 entries are more than 64 (put the values in the spec "
            "document instead)");

  v1::ListJobsResponse list;
  grpc::ClientContext list_ctx;
  SetDeadlineAfter(&list_ctx, absl::Seconds(5));
  ASSERT_TRUE(jobs_->ListJobs(&list_ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  auto ok =
      Submit(JobYaml("good", "    - {seq_len: 256, steps: 2}\n", "{max_failures: 2147483647}"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "job-000001");
  EXPECT_EQ(GetJob(*ok).max_failures(), 2147483647);
  EXPECT_TRUE(Serving());
}

// Before: specs that can never run were accepted (steps 2^63-1, seq_len 2^62), labels kept
// NUL and ESC, ListJobs took a negative page token, overrides grew a stored spec past the
// document bound, and coordinator.db was created 0644.
TEST_F(BoundsGrpcTest, UnrunnableSpecsHostileLabelsAndTokensAreRefusedAndTheStoreIsPrivate) {
  auto steps = Submit(JobYaml("steps", "    - {seq_len: 256, steps: 9223372036854775807}\n"));
  EXPECT_EQ(steps.status().code(), absl::StatusCode::kInvalidArgument) << steps.status();
  EXPECT_THAT(std::string(steps.status().message()),
              ::testing::HasSubstr("spec.stages[0].steps: 9223372036854775807 is more than"));
  auto seq = Submit(JobYaml("seq", "    - {seq_len: 4611686018427387904, steps: 2}\n"));
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument) << seq.status();
  EXPECT_THAT(std::string(seq.status().message()),
              ::testing::HasSubstr("spec.stages[0].seq_len: 4611686018427387904 is more than"));
  for (const char* label : {"\"a\\0b\"", "\"\\e[2Jx\"", "\"a\\nb\""}) {
    std::string yaml = JobYaml("labels", "    - {seq_len: 256, steps: 2}\n");
    yaml.replace(yaml.find("  name: labels\n"), 15,
                 absl::StrCat("  name: labels\n  labels: {team: ", label, "}\n"));
    auto id = Submit(yaml);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << label << id.status();
    EXPECT_THAT(std::string(id.status().message()), ::testing::HasSubstr("metadata.labels.team: "));
  }
  // A document just under the bound (one large label) grown past it by overrides.
  v1::SubmitJobRequest grow;
  std::string big = JobYaml("grow", "    - {seq_len: 256, steps: 2}\n");
  big.replace(big.find("  name: grow\n"), 13,
              absl::StrCat("  name: grow\n  labels: {big: ", std::string(250000, 'b'), "}\n"));
  grow.set_spec_yaml(big);
  for (int i = 0; i < 16; ++i) {
    grow.add_overrides(absl::StrCat("metadata.labels.k", i, "=", std::string(4000, 'v')));
  }
  v1::SubmitJobResponse grown;
  grpc::ClientContext grow_ctx;
  SetDeadlineAfter(&grow_ctx, absl::Seconds(10));
  absl::Status g = FromGrpcStatus(jobs_->SubmitJob(&grow_ctx, grow, &grown));
  EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument) << g;
  EXPECT_THAT(std::string(g.message()), ::testing::HasSubstr("with the overrides applied is"));
  for (const char* token : {"-5", "0"}) {
    v1::ListJobsRequest req;
    req.set_page_token(token);
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    EXPECT_EQ(jobs_->ListJobs(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << token;
  }
  v1::ListJobsResponse list;
  grpc::ClientContext list_ctx;
  SetDeadlineAfter(&list_ctx, absl::Seconds(5));
  ASSERT_TRUE(jobs_->ListJobs(&list_ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  for (const char* file : {"/coordinator.db", "/coordinator.db-wal"}) {
    struct stat st;
    ASSERT_EQ(stat((dir_.path() + file).c_str(), &st), 0) << file;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << file;
  }
  EXPECT_TRUE(Serving());
}

// A write the store refuses (injected: a SQLite trigger that aborts on one reason) fails
// only that request: the job stays as it was, nothing is sent, and the coordinator stays
// SERVING and keeps writing.
TEST_F(BoundsGrpcTest, StoreConstraintFailureFailsOnlyThatRequest) {
  Running r = StartJob();
  ASSERT_NE(r.worker, nullptr);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_.path() + "/coordinator.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TRIGGER inject BEFORE INSERT ON jobs WHEN NEW.reason = "
                           "'refuse-me' BEGIN SELECT RAISE(ABORT, 'injected constraint failure'); "
                           "END",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  const v1::Job before = GetJob(r.id);
  absl::Status s = Cancel(r.id, "refuse-me");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(s.message()).find("injected constraint failure"), std::string::npos) << s;
  EXPECT_TRUE(Serving());
  v1::Job after = GetJob(r.id);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.reason(), before.reason());
  EXPECT_EQ(after.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_RUNNING);
  EXPECT_EQ(after.events_size(), before.events_size());
  // The undone cancel sent no abort: the first abort the worker gets is the next
  // cancel's, which is written.
  ASSERT_TRUE(Cancel(r.id, "cancelled for real").ok());
  auto abort = r.worker->WaitAbort();
  ASSERT_TRUE(abort.has_value());
  EXPECT_EQ(abort->reason(), "cancelled for real");
  EXPECT_EQ(GetJob(r.id).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(Serving());
}

TEST_F(BoundsGrpcTest, OutOfBoundsRegistrationsAndRequestsAreRefused) {
  auto stub = v1::WorkerService::NewStub(channel_);
  auto reg = [&](const std::string& name, const std::string& host, int capacity) {
    v1::RegisterRequest req;
    req.set_name(name);
    req.set_host(host);
    req.set_capacity(capacity);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    return FromGrpcStatus(stub->Register(&ctx, req, &resp));
  };
  absl::Status s = reg("Node_3", "10.0.0.1", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("name: 'Node_3' is not a DNS-1123 name ("));
  s = reg(std::string(254, 'a'), "10.0.0.1", 1);
  EXPECT_THAT(std::string(s.message()), StartsWith("name: 254 bytes is longer than 253 ("));
  s = reg("w1", "10.0.0.1; rm -rf /", 1);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("host: '10.0.0.1; rm -rf /' has characters other than"));
  s = reg("w1", "10.0.0.1", -1);
  EXPECT_EQ(s.message(),
            "capacity: -1 is out of range [0, 1024] (ranks it can run at once; 0 "
            "means 1)");
  ASSERT_TRUE(reg("node3-gpu5.rack1", "10.0.0.1", 1).ok());

  // A 1 MB job id is refused by size, never echoed back.
  v1::GetJobRequest get;
  get.set_job_id(std::string(1 << 20, 'j'));
  v1::GetJobResponse got;
  grpc::ClientContext get_ctx;
  SetDeadlineAfter(&get_ctx, absl::Seconds(5));
  s = FromGrpcStatus(jobs_->GetJob(&get_ctx, get, &got));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "job_id: 1048576 bytes is longer than 64 (use a job id from SubmitJob or "
            "ListJobs, e.g. job-000001)");
  v1::ListJobsRequest list;
  list.add_states(static_cast<v1::JobState>(99));
  v1::ListJobsResponse listed;
  grpc::ClientContext list_ctx;
  SetDeadlineAfter(&list_ctx, absl::Seconds(5));
  s = FromGrpcStatus(jobs_->ListJobs(&list_ctx, list, &listed));
  EXPECT_EQ(s.message(),
            "states[0]: 99 is not a job state (use JOB_STATE_PENDING .. JOB_STATE_CANCELLED)");

  // A session whose hello names a 1 MB worker id ends at once.
  grpc::ClientContext session_ctx;
  SetDeadlineAfter(&session_ctx, absl::Seconds(5));
  auto session = stub->Session(&session_ctx);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(std::string(1 << 20, 'w'));
  session->Write(hello);
  session->WritesDone();
  v1::CoordinatorMessage ignored;
  while (session->Read(&ignored)) {
  }
  grpc::Status end = session->Finish();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(end.error_message(),
            "hello.worker_id: 1048576 bytes is longer than 255 (send the worker_id from "
            "RegisterResponse)");
  EXPECT_TRUE(Serving());
}

// ListJobs pages of the largest jobs a spec allows (64 stages) stay under 3 MiB, far
// from the 4 MB a gRPC client accepts, and next_page_token reaches every job exactly once.
// (Measured: 1.4 KB per such job, so even a full page of 1000 is ~1.4 MB; the server's
// own cut at kMaxPageBytes is a second line of defence that validated jobs cannot reach.)
class ListPagingTest : public BoundsGrpcTest {
 protected:
  void SetUp() override {
    config_.quotas.default_quota.max_queued_jobs = 1000;  // Room for the jobs below.
    BoundsGrpcTest::SetUp();
  }
};

TEST_F(ListPagingTest, PagesOfLargestJobsStayUnderThreeMiBAndPagingReachesEveryJob) {
  std::string stages;
  for (int i = 0; i < 64; ++i)
    stages += absl::StrCat("    - {seq_len: ", 256 * (i + 1), ", steps: 1}\n");
  constexpr int kJobs = 700;
  std::set<std::string> submitted;
  for (int i = 0; i < kJobs; ++i) {
    auto id = Submit(JobYaml(absl::StrCat("big-", i), stages));
    ASSERT_TRUE(id.ok()) << id.status();
    submitted.insert(*id);
  }
  std::set<std::string> listed;
  std::string token;
  int pages = 0;
  do {
    v1::ListJobsRequest req;
    req.set_page_size(300);
    req.set_page_token(token);
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(30));
    grpc::Status s = jobs_->ListJobs(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LE(resp.ByteSizeLong(), size_t{3} << 20) << "page " << pages;
    EXPECT_LE(resp.jobs_size(), 300);
    for (const v1::Job& j : resp.jobs()) {
      EXPECT_TRUE(listed.insert(j.id()).second) << j.id() << " listed twice";
      EXPECT_EQ(j.stages_size(), 64);
    }
    token = resp.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 100);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(listed, submitted);
}

}  // namespace
}  // namespace ulysses::coordinator
