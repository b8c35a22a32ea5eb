// Long-lived JobService streams and log buffers stay bounded (issues 9, 23): WatchJob and
// every GetJobLogs stream are capped per caller identity and in total (StreamLimits),
// freed when the client goes away; a reader slower than stream_queue_max_bytes is cut
// with RESOURCE_EXHAUSTED; revoking a token ends its streams at the reload; a job's log buffer
// keeps at most log_buffer_bytes_per_job, dropping its oldest lines. Real gRPC over TLS against an
// in-process coordinator (grpc_fixture.h).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "coordinator/stream_limits.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using testing::FakeWorker;
using testing::JobYaml;
using testing::PollUntil;
using testing::TestTokens;
using testing::WithToken;

TEST(StreamLimitsTest, CapsPerIdentityAndInTotalAndReleasesSlots) {
  StreamLimits limits(/*per_identity=*/2, /*total=*/3);
  EXPECT_TRUE(limits.Acquire("a").ok());
  EXPECT_TRUE(limits.Acquire("a").ok());
  absl::Status third = limits.Acquire("a");
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(third.message(), "2 of max_streams_per_identity 2")) << third;
  EXPECT_TRUE(limits.Acquire("b").ok());
  absl::Status total = limits.Acquire("c");
  EXPECT_EQ(total.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(total.message(), "its max_streams 3")) << total;
  EXPECT_EQ(limits.open(), 3);
  limits.Release("a");
  EXPECT_TRUE(limits.Acquire("c").ok());
  limits.Release("unknown");  // Ignored: never acquired.
  EXPECT_EQ(limits.open(), 3);
}

// One tenant's users together hold at most max_streams_per_tenant slots: the other tenants
// keep theirs even when that tenant has many users (the finding: one tenant's users could
// take every global slot).
TEST(StreamLimitsTest, OneTenantsUsersCannotTakeEverySlot) {
  StreamLimits limits(/*per_identity=*/2, /*total=*/6, /*queue_bytes=*/1 << 20,
                      /*per_tenant=*/3);
  EXPECT_TRUE(limits.Acquire("token:other/bob", "other").ok());
  EXPECT_TRUE(limits.Acquire("token:other/bob", "other").ok());
  EXPECT_TRUE(limits.Acquire("token:other/bob2", "other").ok());
  absl::Status fourth = limits.Acquire("token:other/bob3", "other");
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(fourth.message(),
                                "tenant other holds 3 open watch/follow streams, its "
                                "max_streams_per_tenant 3"))
      << fourth;
  EXPECT_TRUE(limits.Acquire("token:research/alice", "research").ok());
  EXPECT_TRUE(limits.Acquire("token:research/alice", "research").ok());
  limits.Release("token:other/bob", "other");
  EXPECT_TRUE(limits.Acquire("token:other/bob3", "other").ok());
  EXPECT_EQ(limits.open(), 5);
}

// A client's open WatchJob stream.
struct OpenStream {
  std::unique_ptr<grpc::ClientContext> ctx = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> watch;
};

class StreamsGrpcTest : public testing::CoordinatorServerTest {
 protected:
  void SetUp() override {
    config_.max_streams_per_identity = 2;
    config_.max_streams = 3;
    config_.log_buffer_bytes_per_job = 64 * 1024;
    config_.stream_queue_max_bytes = 1 << 20;
    CoordinatorServerTest::SetUp();
  }

  std::unique_ptr<v1::JobService::Stub> StubFor(const std::string& token) {
    return v1::JobService::NewStub(Channel(WithToken(token)));
  }

  std::string SubmitAs(v1::JobService::Stub* stub, const std::string& name) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(JobYaml(name, "    - {seq_len: 256, steps: 10}\n"));
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job_id();
  }

  // Opens a watch of `job_id` and returns it with OK once the snapshot arrived (the
  // stream holds its slot), or the stream's final status when the server refused it.
  std::pair<OpenStream, grpc::Status> Watch(v1::JobService::Stub* stub, const std::string& job_id) {
    OpenStream s;
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    s.watch = stub->WatchJob(s.ctx.get(), req);
    v1::JobEvent first;
    if (s.watch->Read(&first)) return {std::move(s), grpc::Status::OK};
    grpc::Status end = s.watch->Finish();
    return {std::move(s), end};
  }

  static void Close(OpenStream* s) {
    s->ctx->TryCancel();
    if (s->watch) {
      v1::JobEvent e;
      while (s->watch->Read(&e)) {
      }
      (void)s->watch->Finish();
    }
  }
};

TEST_F(StreamsGrpcTest, WatchAndFollowStreamsAreCappedPerIdentityAndInTotal) {
  auto alice = StubFor(TestTokens::kAlice);
  auto bob = StubFor(TestTokens::kBob);
  // PENDING jobs (no workers): their watches stay open.
  const std::string alice_job = SubmitAs(alice.get(), "alice-job");
  const std::string bob_job = SubmitAs(bob.get(), "bob-job");

  auto [w1, s1] = Watch(alice.get(), alice_job);
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  auto [w2, s2] = Watch(alice.get(), alice_job);
  ASSERT_TRUE(s2.ok()) << s2.error_message();
  auto [w3, s3] = Watch(alice.get(), alice_job);
  EXPECT_EQ(s3.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(s3.error_message(),
                                "token:research/alice: 2 of max_streams_per_identity 2"))
      << s3.error_message();

  // A follow counts as a stream too, and so does a plain tail (before: it did not, and 40
  // unread tails held 240 MB).
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    v1::GetJobLogsRequest req;
    req.set_job_id(alice_job);
    req.set_follow(true);
    auto reader = alice->GetJobLogs(&ctx, req);
    v1::GetJobLogsResponse r;
    while (reader->Read(&r)) {
    }
    grpc::Status end = reader->Finish();
    EXPECT_EQ(end.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << end.error_message();
    grpc::ClientContext tail_ctx;
    SetDeadlineAfter(&tail_ctx, absl::Seconds(10));
    req.set_follow(false);
    auto tail = alice->GetJobLogs(&tail_ctx, req);
    while (tail->Read(&r)) {
    }
    grpc::Status tail_end = tail->Finish();
    EXPECT_EQ(tail_end.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << tail_end.error_message();
  }

  // Another identity has its own allowance, until the coordinator's total is reached.
  auto [b1, sb1] = Watch(bob.get(), bob_job);
  ASSERT_TRUE(sb1.ok()) << sb1.error_message();
  auto [b2, sb2] = Watch(bob.get(), bob_job);
  EXPECT_EQ(sb2.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(sb2.error_message(), "its max_streams 3")) << sb2.error_message();

  // A client that goes away frees its slot (once the server saw the cancel).
  Close(&w1);
  OpenStream again;
  ASSERT_TRUE(PollUntil([&] {
    auto [s, status] = Watch(alice.get(), alice_job);
    if (!status.ok()) return false;
    again = std::move(s);
    return true;
  }));
  Close(&again);
  Close(&w2);
  Close(&b1);
  EXPECT_TRUE(Serving());
}

// Before: a stream's send queue had no byte bound: 10 followers that never read held
// +102 MB. Now the queue holds at most stream_queue_max_bytes (1 MiB here) behind the
// message being written, and the reader is told why it was cut.
TEST_F(StreamsGrpcTest, AReaderThatDoesNotKeepUpIsCutWithResourceExhaustedNamingTheBound) {
  testing::FakeWorker& w = AddWorker("w1");
  auto id = Submit(JobYaml("chatty", "    - {seq_len: 256, steps: 60}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto a = w.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  w.Started(a->ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  auto admin = StubFor(TestTokens::kAdmin);
  grpc::ClientContext ctx;
  v1::GetJobLogsRequest req;
  req.set_job_id(*id);
  req.set_follow(true);
  auto follower = admin->GetJobLogs(&ctx, req);
  follower->WaitForInitialMetadata();  // The follow is registered (its tail came).
  // 16 MiB of log lines while the follower reads nothing.
  for (int batch = 0; batch < 32; ++batch) {
    v1::WorkerMessage m;
    *m.mutable_logs()->mutable_ref() = a->ref();
    for (int i = 0; i < 32; ++i) {
      m.mutable_logs()->add_lines()->set_text(std::string(16000, 'a' + batch % 26));
    }
    ASSERT_TRUE(w.Send(std::move(m)));
  }
  // Everything the worker sent was taken (a heartbeat ack follows the batches).
  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_request_ack(true);
  ASSERT_TRUE(SendForAck(w, std::move(hb)).has_value());
  // Reading now gets what was in flight, then the cut.
  v1::GetJobLogsResponse r;
  int64_t received = 0;
  while (follower->Read(&r)) {
    for (const v1::LogLine& l : r.lines()) received += static_cast<int64_t>(l.text().size());
  }
  grpc::Status end = follower->Finish();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << end.error_message();
  EXPECT_TRUE(absl::StrContains(end.error_message(), "more than 1048576 bytes"))
      << end.error_message();
  EXPECT_TRUE(absl::StrContains(end.error_message(), "stream_queue_max_bytes"));
  EXPECT_LT(received, int64_t{16} << 20);
  EXPECT_EQ(GetJob(*id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(Serving());
}

TEST_F(StreamsGrpcTest, LogBufferKeepsAtMostItsBytesNewestFirst) {
  testing::FakeWorker& w = AddWorker("w1");
  auto id = Submit(JobYaml("logs", "    - {seq_len: 256, steps: 60}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto a = w.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  w.Started(a->ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  // 200 KiB of 2 KiB lines into a 64 KiB buffer.
  constexpr int kLines = 100;
  for (int batch = 0; batch < 10; ++batch) {
    v1::WorkerMessage m;
    *m.mutable_logs()->mutable_ref() = a->ref();
    for (int i = 0; i < kLines / 10; ++i) {
      const int n = batch * (kLines / 10) + i;
      m.mutable_logs()->add_lines()->set_text(
          absl::StrCat("line ", n, " ", std::string(2048, 'z')));
    }
    ASSERT_TRUE(w.Send(std::move(m)));
  }
  const std::string last_prefix = absl::StrCat("line ", kLines - 1, " ");
  std::vector<v1::LogLine> lines;
  ASSERT_TRUE(PollUntil([&] {
    lines = Logs(*id);
    return !lines.empty() && absl::StartsWith(lines.back().text(), last_prefix);
  })) << lines.size()
      << " lines";
  size_t bytes = 0;
  int worker_lines = 0;
  for (const v1::LogLine& l : lines) {
    bytes += l.text().size();
    worker_lines += absl::StartsWith(l.text(), "line ");
  }
  EXPECT_LE(bytes, 64u * 1024) << "the buffer holds more than log_buffer_bytes_per_job";
  EXPECT_GT(worker_lines, 10) << "the bound dropped far more than needed";
  EXPECT_LT(worker_lines, kLines);
  // The oldest went first: what is left is the newest run of lines, in order.
  EXPECT_FALSE(absl::StartsWith(lines.front().text(), "line 0 "));
  EXPECT_EQ(GetJob(*id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(Serving());
}

// The finding: a reader that never grants HTTP/2 flow credit was never cut (its memory stays
// bounded, but it held its slot forever). A write that waits longer than stream_stall_s cuts
// the stream at the next message and cancels the call, which frees the slot.
class StallGrpcTest : public testing::CoordinatorServerTest {
 protected:
  void SetUp() override {
    config_.max_streams_per_identity = 1;
    config_.stream_queue_max_bytes = 256 << 20;  // The queue bound must not cut it first.
    config_.stream_stall_s = 0.5;
    CoordinatorServerTest::SetUp();
  }
};

TEST_F(StallGrpcTest, AReaderThatGrantsNoFlowCreditIsCutAndFreesItsSlot) {
  FakeWorker& w1 = AddWorker("w1");
  auto alice = v1::JobService::NewStub(Channel(WithToken(TestTokens::kAlice)));
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(JobYaml("chatty", "    - {seq_len: 256, steps: 10}\n"));
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    ASSERT_TRUE(alice->SubmitJob(&ctx, submit, &submitted).ok());
  }
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  w1.Started(a->ref());
  ASSERT_TRUE(WaitState(submitted.job_id(), v1::JOB_STATE_RUNNING));

  // The stalled reader: a 1 KiB window it never reopens, and no Read().
  testing::TestChannelOptions stingy = WithToken(TestTokens::kAlice);
  stingy.stream_window_bytes = 1024;
  auto stalled_stub = v1::JobService::NewStub(Channel(stingy));
  grpc::ClientContext stalled_ctx;
  v1::GetJobLogsRequest follow;
  follow.set_job_id(submitted.job_id());
  follow.set_follow(true);
  auto stalled = stalled_stub->GetJobLogs(&stalled_ctx, follow);

  // A tail by the same identity waits for the one slot until the stalled stream is cut.
  auto tail_ok = [&] {
    v1::GetJobLogsRequest tail;
    tail.set_job_id(submitted.job_id());
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    auto reader = alice->GetJobLogs(&ctx, tail);
    v1::GetJobLogsResponse r;
    while (reader->Read(&r)) {
    }
    return reader->Finish().ok();
  };
  // The follow's call starts asynchronously (a tail started first would take the one slot
  // and the follow would be refused): its first message, the job's lines so far, shows it
  // holds the slot. From then on nothing is read.
  v1::GetJobLogsResponse first;
  ASSERT_TRUE(stalled->Read(&first)) << "the follow stream did not start";
  EXPECT_FALSE(tail_ok()) << "the follow stream should hold alice's only slot";
  const std::string line(16000, 'x');
  int sent = 0;
  const bool freed = PollUntil(
      [&] {
        for (int i = 0; i < 8; ++i, ++sent) w1.Log(a->ref(), line);  // Keeps a write pending.
        return tail_ok();
      },
      std::chrono::seconds(30), std::chrono::milliseconds(100));
  EXPECT_TRUE(freed) << "the stalled stream still holds its slot after " << sent << " lines";
  stalled_ctx.TryCancel();
  v1::GetJobLogsResponse r;
  while (stalled->Read(&r)) {
  }
  (void)stalled->Finish();
}

}  // namespace
}  // namespace ulysses::coordinator
