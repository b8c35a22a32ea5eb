// Security of the real ulysses-coordinator process (coordinator_process.h): a worker
// re-registers with its own certificate after kill -9 and keeps its job while another
// identity cannot take its name; SIGHUP adds and revokes tokens and a broken token
// file keeps the old ones; the first start without a token file makes a working admin
// token and ulyssesctl config; plaintext off loopback needs --insecure.
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/coordinator/auth_channel.h"
#include "tests/coordinator/coordinator_process.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/test_util.h"
#include "tests/testing/subprocess.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::coordinator::testing {
namespace {

using ::ulysses::testing::ReadFile;

grpc::StatusCode ListJobsCode(int port, const std::string& token) {
  auto stub = v1::JobService::NewStub(MakeTestChannel(port, WithToken(token)));
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(5));
  v1::ListJobsResponse resp;
  return stub->ListJobs(&ctx, v1::ListJobsRequest(), &resp).error_code();
}

v1::Job GetJob(int port, const std::string& id) {
  auto stub = v1::JobService::NewStub(MakeTestChannel(port, WithToken(TestTokens::kAdmin)));
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::GetJobResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(5));
  EXPECT_TRUE(stub->GetJob(&ctx, req, &resp).ok());
  return resp.job();
}

TEST(SecurityProcessTest, SameIdentityReRegistersAfterKill9AndKeepsItsJob) {
  TempDir dir;
  const std::string tokens = dir.Sub("tokens.yaml");
  WriteTestTokenFile(tokens);
  std::string id;
  v1::WorkRef ref;
  {
    CoordinatorProcess coord(SecureArgs(dir.Sub("state"), tokens));
    ASSERT_TRUE(coord.ReadPorts());
    FakeWorker w1(MakeTestChannel(coord.port(), WithWorkerCert("w1")), "w1", "", "10.0.0.1");
    ASSERT_TRUE(w1.Register().ok());
    w1.Connect();
    w1.StartHeartbeats(std::chrono::milliseconds(200));
    auto alice =
        v1::JobService::NewStub(MakeTestChannel(coord.port(), WithToken(TestTokens::kAlice)));
    v1::SubmitJobRequest req;
    req.set_spec_yaml(JobYaml("survivor", "    - {seq_len: 64, steps: 8}\n"));
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    ASSERT_TRUE(alice->SubmitJob(&ctx, req, &resp).ok());
    id = resp.job_id();
    auto a = w1.WaitAssignment();
    ASSERT_TRUE(a.has_value());
    ref = a->ref();
    w1.Started(ref);
    ASSERT_TRUE(
        PollUntil([&] { return GetJob(coord.port(), id).state() == v1::JOB_STATE_RUNNING; }));
    coord.Signal(SIGKILL);
    coord.Wait();
    w1.Disconnect();
  }
  CoordinatorProcess coord(SecureArgs(dir.Sub("state"), tokens));
  ASSERT_TRUE(coord.ReadPorts());
  EXPECT_EQ(GetJob(coord.port(), id).state(), v1::JOB_STATE_RECOVERING);
  // While w1 may still come back, another identity (an admin token) cannot take the name.
  FakeWorker impostor(MakeTestChannel(coord.port(), WithToken(TestTokens::kAdmin)), "w1", "",
                      "10.6.6.6");
  absl::Status stolen = impostor.Register(ref);
  EXPECT_TRUE(absl::IsPermissionDenied(stolen)) << stolen;
  // The real w1 (same certificate) re-registers with what it runs and keeps it.
  FakeWorker w1(MakeTestChannel(coord.port(), WithWorkerCert("w1")), "w1", "", "10.0.0.1");
  bool keep = false;
  ASSERT_TRUE(w1.Register(ref, &keep).ok());
  EXPECT_TRUE(keep);
  w1.SetRunning(ref);
  w1.Connect();
  w1.StartHeartbeats(std::chrono::milliseconds(200));
  ASSERT_TRUE(PollUntil([&] { return GetJob(coord.port(), id).state() == v1::JOB_STATE_RUNNING; }));
  v1::Job job = GetJob(coord.port(), id);
  EXPECT_EQ(job.generation(), ref.generation());
  EXPECT_EQ(job.owner(), "alice");  // Owner and tenant survived the restart.
  EXPECT_EQ(job.tenant(), "research");
  EXPECT_EQ(job.attempts_size(), 1);
}

TEST(SecurityProcessTest, SighupReloadAddsAndRevokesTokensAndABadFileKeepsTheOldOnes) {
  TempDir dir;
  const std::string tokens = dir.Sub("tokens.yaml");
  const std::string log = dir.Sub("coordinator.log");
  WriteTestTokenFile(tokens);
  CoordinatorProcess coord(SecureArgs(dir.Sub("state"), tokens), log);
  ASSERT_TRUE(coord.ReadPorts());
  EXPECT_EQ(ListJobsCode(coord.port(), TestTokens::kAlice), grpc::StatusCode::OK);

  // Add carol with the real `token create` subcommand; she is unknown until SIGHUP.
  const ::ulysses::testing::Result created =
      ::ulysses::testing::Run({CoordinatorBinary(), "token", "create", "--user", "carol",
                               "--tenant", "research", "--role", "user", "--token-file", tokens});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  std::string carol = created.out;
  ASSERT_FALSE(carol.empty());
  carol.pop_back();                                          // Newline.
  EXPECT_FALSE(absl::StrContains(ReadFile(tokens), carol));  // Only its hash.
  EXPECT_EQ(ListJobsCode(coord.port(), carol), grpc::StatusCode::UNAUTHENTICATED);
  coord.Signal(SIGHUP);
  ASSERT_TRUE(PollUntil([&] { return ListJobsCode(coord.port(), carol) == grpc::StatusCode::OK; }));
  EXPECT_EQ(ListJobsCode(coord.port(), TestTokens::kAlice), grpc::StatusCode::OK);

  // Revoke alice: rewrite the file without her.
  std::string text = ReadFile(tokens);
  const std::string alice_hash = auth::Sha256Hex(TestTokens::kAlice);
  ASSERT_TRUE(absl::StrContains(text, alice_hash));
  absl::StatusOr<std::vector<auth::TokenEntry>> entries = auth::ParseTokenFile(text, tokens);
  ASSERT_TRUE(entries.ok()) << entries.status();
  std::vector<auth::TokenEntry> kept;
  for (const auth::TokenEntry& e : *entries) {
    if (e.sha256_hex != alice_hash) kept.push_back(e);
  }
  std::ofstream(tokens, std::ios::trunc) << auth::FormatTokenFile(kept);
  coord.Signal(SIGHUP);
  ASSERT_TRUE(PollUntil([&] {
    return ListJobsCode(coord.port(), TestTokens::kAlice) == grpc::StatusCode::UNAUTHENTICATED;
  }));
  EXPECT_EQ(ListJobsCode(coord.port(), carol), grpc::StatusCode::OK);

  // A broken file: the reload fails (logged with the reason), carol stays valid.
  std::ofstream(tokens, std::ios::trunc) << "tokens:\n  - {user: x, role: god}\n";
  coord.Signal(SIGHUP);
  ASSERT_TRUE(PollUntil([&] { return absl::StrContains(ReadFile(log), "token reload failed"); }));
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "tokens[0].role")) << ReadFile(log);
  EXPECT_EQ(ListJobsCode(coord.port(), carol), grpc::StatusCode::OK);
  EXPECT_EQ(ListJobsCode(coord.port(), TestTokens::kAlice), grpc::StatusCode::UNAUTHENTICATED);
}

// Before: a reload dropped a revoked token for new calls only; its open streams and a
// revoked worker's session went on (the worker kept getting assignments, its reports
// were stored).
TEST(SecurityProcessTest, RevokingATokenEndsItsStreamsAndWorkerSessionAtTheReload) {
  TempDir dir;
  const std::string tokens = dir.Sub("tokens.yaml");
  WriteTestTokenFile(tokens);
  CoordinatorProcess coord(SecureArgs(dir.Sub("state"), tokens));
  ASSERT_TRUE(coord.ReadPorts());
  // w9 authenticates with its worker token (no certificate).
  FakeWorker w9(MakeTestChannel(coord.port(), WithToken(TestTokens::kWorkerW9)), "w9", "",
                "10.0.0.9");
  ASSERT_TRUE(w9.Register().ok());
  w9.Connect();
  w9.StartHeartbeats(std::chrono::milliseconds(200));
  auto alice =
      v1::JobService::NewStub(MakeTestChannel(coord.port(), WithToken(TestTokens::kAlice)));
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(JobYaml("watched", "    - {seq_len: 64, steps: 8, sp_degree: 2}\n"));
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    ASSERT_TRUE(alice->SubmitJob(&ctx, submit, &submitted).ok());  // PENDING: needs 2.
  }
  grpc::ClientContext watch_ctx, logs_ctx;
  SetDeadlineAfter(&watch_ctx, absl::Seconds(30));  // Bounds the test if nothing ends them.
  SetDeadlineAfter(&logs_ctx, absl::Seconds(30));
  v1::WatchJobRequest watch_req;
  watch_req.set_job_id(submitted.job_id());
  auto watch = alice->WatchJob(&watch_ctx, watch_req);
  v1::JobEvent snapshot;
  ASSERT_TRUE(watch->Read(&snapshot));
  v1::GetJobLogsRequest logs_req;
  logs_req.set_job_id(submitted.job_id());
  logs_req.set_follow(true);
  auto follow = alice->GetJobLogs(&logs_ctx, logs_req);
  follow->WaitForInitialMetadata();  // Registered: its tail came.

  // Revoke alice and w9; bob stays.
  absl::StatusOr<std::vector<auth::TokenEntry>> entries =
      auth::ParseTokenFile(ReadFile(tokens), tokens);
  ASSERT_TRUE(entries.ok()) << entries.status();
  std::vector<auth::TokenEntry> kept;
  for (const auth::TokenEntry& e : *entries) {
    if (e.user != "alice" && e.user != "w9") kept.push_back(e);
  }
  std::ofstream(tokens, std::ios::trunc) << auth::FormatTokenFile(kept);
  coord.Signal(SIGHUP);

  v1::JobEvent e;
  while (watch->Read(&e)) {
  }
  grpc::Status watch_end = watch->Finish();
  EXPECT_EQ(watch_end.error_code(), grpc::StatusCode::UNAUTHENTICATED) << watch_end.error_message();
  EXPECT_TRUE(absl::StrContains(watch_end.error_message(), "revoked")) << watch_end.error_message();
  v1::GetJobLogsResponse r;
  while (follow->Read(&r)) {
  }
  grpc::Status follow_end = follow->Finish();
  EXPECT_EQ(follow_end.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << follow_end.error_message();
  // The worker's session is closed; it cannot come back with the revoked token.
  EXPECT_TRUE(PollUntil([&] { return w9.closed(); }, std::chrono::seconds(20)));
  EXPECT_TRUE(absl::IsUnauthenticated(w9.Register()));
  EXPECT_EQ(ListJobsCode(coord.port(), TestTokens::kBob), grpc::StatusCode::OK);
}

// Resident memory of process `pid` in bytes (VmRSS), -1 when unreadable.
int64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int64_t kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %" SCNd64 " kB", &kb) == 1) return kb * 1024;
  }
  return -1;
}

// The stated bound of the memory 40 unread streams may take: each stream holds at most
// stream_queue_max_bytes (default 4 MiB; a tail sends the newest half of it), so the growth
// stays below 40 x 4 MiB = 160 MiB. (The issue measured 109 -> 347 MB before the bound; on a
// loopback test box much of an unread reply sits in the client's HTTP/2 window instead, so
// here the code before this bound grew +53 MiB and with it +21 MiB: printed below.)
TEST(SecurityProcessTest, FortyUnreadLogStreamsStayWithinTheirMemoryBound) {
  TempDir dir;
  const std::string tokens = dir.Sub("tokens.yaml");
  WriteTestTokenFile(tokens);
  CoordinatorProcess coord(SecureArgs(dir.Sub("state"), tokens));
  ASSERT_TRUE(coord.ReadPorts());
  FakeWorker w1(MakeTestChannel(coord.port(), WithWorkerCert("w1")), "w1", "", "10.0.0.1");
  ASSERT_TRUE(w1.Register().ok());
  w1.Connect();
  w1.StartHeartbeats(std::chrono::milliseconds(200));
  auto alice =
      v1::JobService::NewStub(MakeTestChannel(coord.port(), WithToken(TestTokens::kAlice)));
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(JobYaml("chatty", "    - {seq_len: 64, steps: 8}\n"));
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    ASSERT_TRUE(alice->SubmitJob(&ctx, submit, &submitted).ok());
  }
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  w1.Started(a->ref());
  // Fill the job's log buffer (log_buffer_bytes_per_job, 8 MiB): 16 x 32 lines of 16000 bytes.
  for (int batch = 0; batch < 17; ++batch) {
    v1::WorkerMessage m;
    *m.mutable_logs()->mutable_ref() = a->ref();
    for (int i = 0; i < 32; ++i) m.mutable_logs()->add_lines()->set_text(std::string(16000, 'x'));
    ASSERT_TRUE(w1.Send(std::move(m)));
  }
  ASSERT_TRUE(w1.WaitAck(w1.Heartbeat(/*request_ack=*/true)).has_value());
  const int64_t before = RssBytes(coord.pid());
  ASSERT_GT(before, 0);

  auto viewer =
      v1::JobService::NewStub(MakeTestChannel(coord.port(), WithToken(TestTokens::kViewer)));
  constexpr int kStreams = 40;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GetJobLogsResponse>>> readers;
  v1::GetJobLogsRequest req;
  req.set_job_id(submitted.job_id());
  req.set_tail_lines(-1);
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    SetDeadlineAfter(contexts.back().get(), absl::Seconds(60));
    readers.push_back(viewer->GetJobLogs(contexts.back().get(), req));
    readers.back()->WaitForInitialMetadata();  // The tail is queued.
  }
  const int64_t grown = RssBytes(coord.pid()) - before;
  std::cout << "coordinator RSS " << before / (1 << 20) << " MiB, +" << grown / (1 << 20)
            << " MiB with " << kStreams << " unread GetJobLogs tails of an 8 MiB buffer\n";
  EXPECT_LT(grown, int64_t{kStreams} * (4 << 20))
      << "40 unread streams grew the coordinator by more than 40 x stream_queue_max_bytes";
  for (auto& c : contexts) c->TryCancel();
  for (auto& r : readers) {
    v1::GetJobLogsResponse resp;
    while (r->Read(&resp)) {
    }
    (void)r->Finish();
  }
}

TEST(SecurityProcessTest, FirstStartWithoutATokenFileMakesAWorkingAdminTokenAndClientConfig) {
  TempDir dir;
  const std::string state = dir.Sub("state");
  CoordinatorProcess coord(PlainArgs(state));  // Plaintext on loopback, no token file.
  ASSERT_TRUE(coord.ReadPorts());
  struct stat st;
  ASSERT_EQ(stat((state + "/admin.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string token = ReadFile(state + "/admin.token");
  ASSERT_FALSE(token.empty());
  token.pop_back();
  const std::string config = ReadFile(state + "/ulyssesctl-config.yaml");
  EXPECT_TRUE(absl::StrContains(config, absl::StrCat("server: 127.0.0.1:", coord.port())))
      << config;
  EXPECT_TRUE(absl::StrContains(config, "token_file: " + state + "/admin.token")) << config;
  EXPECT_FALSE(absl::StrContains(config, "ca:")) << config;  // Plaintext: no CA.

  auto stub = v1::JobService::NewStub(MakeTestChannel(coord.port(), TestChannelOptions{false}));
  auto list = [&](const std::string& authorization) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    v1::ListJobsResponse resp;
    return stub->ListJobs(&ctx, v1::ListJobsRequest(), &resp).error_code();
  };
  EXPECT_EQ(list("Bearer " + token), grpc::StatusCode::OK);
  EXPECT_EQ(list(""), grpc::StatusCode::UNAUTHENTICATED);  // Tokens even on loopback.
  EXPECT_EQ(list("Bearer ul_guess"), grpc::StatusCode::UNAUTHENTICATED);
}

// Both start from the same flags except --insecure.
TEST(SecurityProcessTest, PlaintextOnANonLoopbackAddressNeedsInsecureAndWarns) {
  TempDir dir;
  const ::ulysses::testing::Result refused =
      ::ulysses::testing::Run({CoordinatorBinary(), "--listen", "0.0.0.0:0", "--state-dir",
                               dir.Sub("state"), "--metrics-listen", "127.0.0.1:0"});
  EXPECT_EQ(refused.exit_code, 2) << refused.description;
  EXPECT_TRUE(absl::StrContains(refused.err, "is not a loopback address and TLS is off"))
      << refused.err;
  EXPECT_FALSE(ReadFile(dir.Sub("state/admin.token")).size() > 0);  // Nothing started.

  const std::string log = dir.Sub("insecure.log");
  CoordinatorProcess coord({"--listen", "0.0.0.0:0", "--state-dir", dir.Sub("state"),
                            "--metrics-listen", "127.0.0.1:0", "--insecure"},
                           log);
  ASSERT_TRUE(coord.ReadPorts());
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "--insecure: serving PLAINTEXT")) << ReadFile(log);
}

}  // namespace
}  // namespace ulysses::coordinator::testing
