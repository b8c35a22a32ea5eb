// Security of the real ulysses-coordinator process (coordinator_process.h): a worker
// re-registers with its own certificate after kill -9 and keeps its job while another
// identity cannot take its name; SIGHUP adds and revokes tokens and a broken token
// file keeps the old ones; the first start without a token file makes a working admin
// token and ulyssesctl config; plaintext off loopback needs --insecure.
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/coordinator/auth_channel.h"
#include "tests/coordinator/coordinator_process.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/test_util.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::coordinator::testing {
namespace {

using ::ulysses::testing::ReadFileOrEmpty;

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
  const std::string out = dir.Sub("carol.token");
  const std::string cmd = absl::StrCat(CoordinatorBinary(),
                                       " token create --user carol --tenant research --role user "
                                       "--token-file ",
                                       tokens, " >", out, " 2>/dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string carol = ReadFileOrEmpty(out);
  ASSERT_FALSE(carol.empty());
  carol.pop_back();                                                 // Newline.
  EXPECT_FALSE(absl::StrContains(ReadFileOrEmpty(tokens), carol));  // Only its hash.
  EXPECT_EQ(ListJobsCode(coord.port(), carol), grpc::StatusCode::UNAUTHENTICATED);
  coord.Signal(SIGHUP);
  ASSERT_TRUE(PollUntil([&] { return ListJobsCode(coord.port(), carol) == grpc::StatusCode::OK; }));
  EXPECT_EQ(ListJobsCode(coord.port(), TestTokens::kAlice), grpc::StatusCode::OK);

  // Revoke alice: rewrite the file without her.
  std::string text = ReadFileOrEmpty(tokens);
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
  ASSERT_TRUE(
      PollUntil([&] { return absl::StrContains(ReadFileOrEmpty(log), "token reload failed"); }));
  EXPECT_TRUE(absl::StrContains(ReadFileOrEmpty(log), "tokens[0].role")) << ReadFileOrEmpty(log);
  EXPECT_EQ(ListJobsCode(coord.port(), carol), grpc::StatusCode::OK);
  EXPECT_EQ(ListJobsCode(coord.port(), TestTokens::kAlice), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(SecurityProcessTest, FirstStartWithoutATokenFileMakesAWorkingAdminTokenAndClientConfig) {
  TempDir dir;
  const std::string state = dir.Sub("state");
  CoordinatorProcess coord(PlainArgs(state));  // Plaintext on loopback, no token file.
  ASSERT_TRUE(coord.ReadPorts());
  struct stat st;
  ASSERT_EQ(stat((state + "/admin.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string token = ReadFileOrEmpty(state + "/admin.token");
  ASSERT_FALSE(token.empty());
  token.pop_back();
  const std::string config = ReadFileOrEmpty(state + "/ulyssesctl-config.yaml");
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
  const std::string err = dir.Sub("err.txt");
  const std::string cmd = absl::StrCat(CoordinatorBinary(), " --listen 0.0.0.0:0 --state-dir ",
                                       dir.Sub("state"), " --metrics-listen 127.0.0.1:0 2>", err);
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  EXPECT_TRUE(absl::StrContains(ReadFileOrEmpty(err), "is not a loopback address and TLS is off"))
      << ReadFileOrEmpty(err);
  EXPECT_FALSE(ReadFileOrEmpty(dir.Sub("state/admin.token")).size() > 0);  // Nothing started.

  const std::string log = dir.Sub("insecure.log");
  CoordinatorProcess coord({"--listen", "0.0.0.0:0", "--state-dir", dir.Sub("state"),
                            "--metrics-listen", "127.0.0.1:0", "--insecure"},
                           log);
  ASSERT_TRUE(coord.ReadPorts());
  EXPECT_TRUE(absl::StrContains(ReadFileOrEmpty(log), "--insecure: serving PLAINTEXT"))
      << ReadFileOrEmpty(log);
}

}  // namespace
}  // namespace ulysses::coordinator::testing
