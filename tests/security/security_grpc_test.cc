// Security of the coordinator's gRPC API, attacked through the real API (in-process
// server with TLS, worker client certificates and a token file; grpc_fixture.h):
// authentication on every RPC (the health service open), the role table, tenant
// isolation, who cancelled/resumed, and worker identities (mutual TLS, worker tokens,
// no takeover of a live worker's name).
#include <grpcpp/grpcpp.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grpc_fixture.h"

namespace ulysses::coordinator::testing {
namespace {

class SecurityGrpcTest : public CoordinatorServerTest {
 protected:
  using Call = std::function<grpc::Status(grpc::ClientContext*)>;

  static grpc::Status Run(const Call& call) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    return call(&ctx);
  }

  // Every JobService RPC on `job_id` (and ListJobs/ListWorkers/SubmitJob) as `channel`'s
  // caller, with the RPC name: the streams are read to their end.
  std::vector<std::pair<std::string, Call>> JobRpcs(std::shared_ptr<grpc::Channel> channel,
                                                    const std::string& job_id) {
    std::shared_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(channel);
    std::vector<std::pair<std::string, Call>> rpcs;
    rpcs.push_back({"SubmitJob", [stub](grpc::ClientContext* ctx) {
                      v1::SubmitJobRequest req;
                      req.set_spec_yaml(JobYaml("sneaky", "    - {seq_len: 64, steps: 2}\n"));
                      v1::SubmitJobResponse resp;
                      return stub->SubmitJob(ctx, req, &resp);
                    }});
    rpcs.push_back({"GetJob", [stub, job_id](grpc::ClientContext* ctx) {
                      v1::GetJobRequest req;
                      req.set_job_id(job_id);
                      v1::GetJobResponse resp;
                      return stub->GetJob(ctx, req, &resp);
                    }});
    rpcs.push_back({"ListJobs", [stub](grpc::ClientContext* ctx) {
                      v1::ListJobsResponse resp;
                      return stub->ListJobs(ctx, v1::ListJobsRequest(), &resp);
                    }});
    rpcs.push_back({"CancelJob", [stub, job_id](grpc::ClientContext* ctx) {
                      v1::CancelJobRequest req;
                      req.set_job_id(job_id);
                      v1::CancelJobResponse resp;
                      return stub->CancelJob(ctx, req, &resp);
                    }});
    rpcs.push_back({"ResumeJob", [stub, job_id](grpc::ClientContext* ctx) {
                      v1::ResumeJobRequest req;
                      req.set_job_id(job_id);
                      v1::ResumeJobResponse resp;
                      return stub->ResumeJob(ctx, req, &resp);
                    }});
    rpcs.push_back({"WatchJob", [stub, job_id](grpc::ClientContext* ctx) {
                      v1::WatchJobRequest req;
                      req.set_job_id(job_id);
                      auto reader = stub->WatchJob(ctx, req);
                      v1::JobEvent e;
                      while (reader->Read(&e)) {
                      }
                      return reader->Finish();
                    }});
    rpcs.push_back({"GetJobLogs", [stub, job_id](grpc::ClientContext* ctx) {
                      v1::GetJobLogsRequest req;
                      req.set_job_id(job_id);
                      auto reader = stub->GetJobLogs(ctx, req);
                      v1::GetJobLogsResponse r;
                      while (reader->Read(&r)) {
                      }
                      return reader->Finish();
                    }});
    rpcs.push_back({"ListWorkers", [stub](grpc::ClientContext* ctx) {
                      v1::ListWorkersResponse resp;
                      return stub->ListWorkers(ctx, v1::ListWorkersRequest(), &resp);
                    }});
    rpcs.push_back({"BackupState", [stub](grpc::ClientContext* ctx) {
                      auto reader = stub->BackupState(ctx, v1::BackupStateRequest());
                      v1::BackupStateChunk chunk;
                      while (reader->Read(&chunk)) {
                      }
                      return reader->Finish();
                    }});
    return rpcs;
  }

  static grpc::Status Register(std::shared_ptr<grpc::Channel> channel, const std::string& name) {
    auto stub = v1::WorkerService::NewStub(channel);
    v1::RegisterRequest req;
    req.set_name(name);
    req.set_host("10.9.9.9");
    req.set_capacity(1);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    return stub->Register(&ctx, req, &resp);
  }

  // Opens a Session with hello{worker_id} and returns how the coordinator ended it
  // (the coordinator closes refused sessions at once).
  static grpc::Status OpenSession(std::shared_ptr<grpc::Channel> channel,
                                  const std::string& worker_id) {
    auto stub = v1::WorkerService::NewStub(channel);
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    auto stream = stub->Session(&ctx);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(worker_id);
    stream->Write(hello);
    v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
    }
    return stream->Finish();
  }

  absl::StatusOr<std::string> SubmitYamlAs(const std::string& token, const std::string& yaml,
                                           const std::string& request_id = "") {
    auto stub = v1::JobService::NewStub(Channel(WithToken(token)));
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    req.set_request_id(request_id);
    v1::SubmitJobResponse resp;
    grpc::Status s = Run([&](grpc::ClientContext* c) { return stub->SubmitJob(c, req, &resp); });
    if (!s.ok()) return FromGrpcStatus(s);
    return resp.job_id();
  }

  absl::StatusOr<std::string> SubmitAs(const std::string& token, const std::string& name) {
    auto stub = v1::JobService::NewStub(Channel(WithToken(token)));
    v1::SubmitJobRequest req;
    req.set_spec_yaml(JobYaml(name, "    - {seq_len: 64, steps: 4}\n"));
    v1::SubmitJobResponse resp;
    grpc::Status s = Run([&](grpc::ClientContext* c) { return stub->SubmitJob(c, req, &resp); });
    if (!s.ok()) return FromGrpcStatus(s);
    return resp.job_id();
  }
};

TEST_F(SecurityGrpcTest, EveryRpcWithoutATokenIsUnauthenticatedAndHealthStaysOpen) {
  absl::StatusOr<std::string> id = SubmitAs(TestTokens::kAlice, "mine");
  ASSERT_TRUE(id.ok()) << id.status();
  auto anonymous = Channel(TestChannelOptions());
  for (const auto& [name, call] : JobRpcs(anonymous, *id)) {
    grpc::Status s = Run(call);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
    EXPECT_TRUE(absl::StrContains(s.error_message(), "no token: set ULYSSES_TOKEN")) << name;
  }
  EXPECT_EQ(Register(anonymous, "w1").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(OpenSession(anonymous, "w-w1").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Nothing changed: still one job, PENDING, no workers.
  EXPECT_EQ(GetJob(*id).state(), v1::JOB_STATE_PENDING);
  grpc::ClientContext ctx;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(jobs_->ListJobs(&ctx, v1::ListJobsRequest(), &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 1);
  // The health service needs no token.
  channel_ = anonymous;
  EXPECT_TRUE(Serving());
}

TEST_F(SecurityGrpcTest, UnknownOrMalformedTokensAreUnauthenticated) {
  for (const std::string& token :
       {std::string("ul_not-a-token"), std::string(TestTokens::kAlice) + "x",
        auth::Sha256Hex(TestTokens::kAlice)}) {
    auto rpcs = JobRpcs(Channel(WithToken(token)), "job-000001");
    for (const auto& [name, call] : rpcs) {
      grpc::Status s = Run(call);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << name << " " << token;
      EXPECT_TRUE(absl::StrContains(s.error_message(), "unknown or revoked token")) << name;
    }
  }
  // Not "Bearer <token>" at all.
  auto stub = v1::JobService::NewStub(Channel(TestChannelOptions()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Basic ") + TestTokens::kAlice);
  v1::ListJobsResponse resp;
  EXPECT_EQ(stub->ListJobs(&ctx, v1::ListJobsRequest(), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityGrpcTest, ViewerReadsItsTenantButCannotSubmitCancelOrResume) {
  absl::StatusOr<std::string> id = SubmitAs(TestTokens::kAlice, "alices");
  ASSERT_TRUE(id.ok()) << id.status();
  for (const auto& [name, call] : JobRpcs(Channel(WithToken(TestTokens::kViewer)), *id)) {
    if (name == "WatchJob") continue;  // Of a live job: runs until its deadline.
    grpc::Status s = Run(call);
    if (name == "SubmitJob" || name == "CancelJob" || name == "ResumeJob" ||
        name == "BackupState") {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << name;
      EXPECT_TRUE(absl::StrContains(s.error_message(), "role viewer")) << s.error_message();
    } else {
      EXPECT_TRUE(s.ok()) << name << ": " << s.error_message();
    }
  }
  EXPECT_EQ(GetJob(*id).state(), v1::JOB_STATE_PENDING);
  // A viewer is no worker either.
  EXPECT_EQ(Register(Channel(WithToken(TestTokens::kViewer)), "vera").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(SecurityGrpcTest, AnotherTenantsJobIsNotFoundForEveryRpcAndUnchanged) {
  absl::StatusOr<std::string> id = SubmitAs(TestTokens::kAlice, "secret");
  ASSERT_TRUE(id.ok()) << id.status();
  v1::Job job = GetJob(*id);  // As admin.
  EXPECT_EQ(job.owner(), "alice");
  EXPECT_EQ(job.tenant(), "research");
  auto bob = Channel(WithToken(TestTokens::kBob));
  for (const auto& [name, call] : JobRpcs(bob, *id)) {
    if (name == "SubmitJob" || name == "ListWorkers") continue;
    grpc::Status s = Run(call);
    if (name == "BackupState") {  // Admins only.
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
      continue;
    }
    if (name == "ListJobs") {
      EXPECT_TRUE(s.ok()) << s.error_message();
      continue;
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << name << ": " << s.error_message();
  }
  auto bob_stub = v1::JobService::NewStub(bob);
  v1::ListJobsResponse listed;
  ASSERT_TRUE(Run([&](grpc::ClientContext* c) {
                return bob_stub->ListJobs(c, v1::ListJobsRequest(), &listed);
              }).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
  // Bob's own job is his; alice does not see it, the admin sees both.
  absl::StatusOr<std::string> bobs = SubmitAs(TestTokens::kBob, "bobs");
  ASSERT_TRUE(bobs.ok());
  ASSERT_TRUE(Run([&](grpc::ClientContext* c) {
                return bob_stub->ListJobs(c, v1::ListJobsRequest(), &listed);
              }).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), *bobs);
  auto alice_stub = v1::JobService::NewStub(Channel(WithToken(TestTokens::kAlice)));
  ASSERT_TRUE(Run([&](grpc::ClientContext* c) {
                return alice_stub->ListJobs(c, v1::ListJobsRequest(), &listed);
              }).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), *id);
  ASSERT_TRUE(Run([&](grpc::ClientContext* c) {
                return jobs_->ListJobs(c, v1::ListJobsRequest(), &listed);
              }).ok());
  EXPECT_EQ(listed.jobs_size(), 2);
  EXPECT_EQ(GetJob(*id).state(), v1::JOB_STATE_PENDING);  // Bob's cancel did nothing.
}

TEST_F(SecurityGrpcTest, EventsRecordWhoCancelledAndResumed) {
  absl::StatusOr<std::string> id = SubmitAs(TestTokens::kAlice, "tracked");
  ASSERT_TRUE(id.ok()) << id.status();
  auto alice = v1::JobService::NewStub(Channel(WithToken(TestTokens::kAlice)));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(*id);
  cancel.set_reason("wrong data");
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(
      Run([&](grpc::ClientContext* c) { return alice->CancelJob(c, cancel, &cancelled); }).ok());
  v1::ResumeJobRequest resume;
  resume.set_job_id(*id);
  v1::ResumeJobResponse resumed;
  ASSERT_TRUE(
      Run([&](grpc::ClientContext* c) { return jobs_->ResumeJob(c, resume, &resumed); }).ok());
  std::string cancelled_by, resumed_by;
  const v1::Job job = GetJob(*id);
  for (const v1::JobEvent& e : job.events()) {
    if (!e.has_state_change()) continue;
    if (e.state_change().to() == v1::JOB_STATE_CANCELLED) cancelled_by = e.state_change().actor();
    if (e.state_change().from() == v1::JOB_STATE_CANCELLED) resumed_by = e.state_change().actor();
  }
  EXPECT_EQ(cancelled_by, "alice");
  EXPECT_EQ(resumed_by, "root");  // The admin of the test token file.
}

TEST_F(SecurityGrpcTest, WithoutAClientCertificateAUserTokenCannotRegisterAWorker) {
  EXPECT_EQ(Register(Channel(WithToken(TestTokens::kAlice)), "w1").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Register(Channel(TestChannelOptions()), "w1").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext ctx;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
  EXPECT_EQ(workers.workers_size(), 0);
}

TEST_F(SecurityGrpcTest, ACertificateForW1CannotRegisterOrDriveW2) {
  auto w1_channel = Channel(WithWorkerCert("w1"));
  grpc::Status s = Register(w1_channel, "w2");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "\"w2\" is not the worker"))
      << s.error_message();
  EXPECT_TRUE(Register(w1_channel, "w1").ok());
  // w2 registers with its own certificate; w1's certificate cannot open w2's session.
  FakeWorker& w2 = AddWorker("w2");
  EXPECT_EQ(OpenSession(w1_channel, w2.worker_id()).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The worker token of w9 registers w9 only.
  auto w9_token = Channel(WithToken(TestTokens::kWorkerW9));
  EXPECT_EQ(Register(w9_token, "w1").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Register(w9_token, "w9").ok());
}

TEST_F(SecurityGrpcTest, ALiveWorkersNameCannotBeTakenOverAndItsJobRunsOn) {
  FakeWorker& w1 = AddWorker("w1");
  absl::StatusOr<std::string> id = Submit(JobYaml("victim", "    - {seq_len: 64, steps: 4}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  w1.Started(a->ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  // An admin token may register any name, but not one a live worker of another
  // identity holds; three tries, as in the attack.
  auto admin = Channel(WithToken(TestTokens::kAdmin));
  for (int i = 0; i < 3; ++i) {
    grpc::Status s = Register(admin, "w1");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_TRUE(absl::StrContains(s.error_message(), "held by another identity"))
        << s.error_message();
  }
  EXPECT_EQ(OpenSession(admin, w1.worker_id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(w1.closed());  // The real session was not superseded.
  v1::Job job = GetJob(*id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.failures(), 0);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).worker_ids(0), "w-w1");
  // The same identity may re-register (a worker process restart keeps its name).
  EXPECT_TRUE(w1.Register(a->ref()).ok());
}

TEST_F(SecurityGrpcTest, PriorityAboveTheUserCapNeedsAnAdmin) {
  const std::string stages = "    - {seq_len: 64, steps: 2}\n";
  auto huge =
      SubmitYamlAs(TestTokens::kAlice, JobYaml("huge", stages, "{priority: 9223372036854775807}"));
  EXPECT_TRUE(absl::IsInvalidArgument(huge.status())) << huge.status();
  EXPECT_TRUE(absl::StrContains(huge.status().message(), "spec.scheduling.priority"));
  auto high = SubmitYamlAs(TestTokens::kAlice, JobYaml("high", stages, "{priority: 500}"));
  EXPECT_TRUE(absl::IsPermissionDenied(high.status())) << high.status();
  EXPECT_TRUE(absl::StrContains(high.status().message(), "ask an admin"));
  EXPECT_TRUE(SubmitYamlAs(TestTokens::kAlice, JobYaml("ok", stages, "{priority: 100}")).ok());
  EXPECT_TRUE(SubmitYamlAs(TestTokens::kAdmin, JobYaml("urgent", stages, "{priority: 500}")).ok());
  v1::ListJobsResponse listed;
  ASSERT_TRUE(Run([&](grpc::ClientContext* c) {
                return jobs_->ListJobs(c, v1::ListJobsRequest(), &listed);
              }).ok());
  EXPECT_EQ(listed.jobs_size(), 2);  // The refused ones left no trace.
}

TEST_F(SecurityGrpcTest, OptingOutOfPreemptionNeedsAnAdmin) {
  const std::string stages = "    - {seq_len: 64, steps: 2}\n";
  auto pinned = SubmitYamlAs(TestTokens::kAlice, JobYaml("pinned", stages, "{preemptible: false}"));
  EXPECT_TRUE(absl::IsPermissionDenied(pinned.status())) << pinned.status();
  EXPECT_TRUE(absl::StrContains(pinned.status().message(),
                                "spec.scheduling.preemptible: false needs the admin role"))
      << pinned.status();
  EXPECT_TRUE(
      SubmitYamlAs(TestTokens::kAdmin, JobYaml("pinned", stages, "{preemptible: false}")).ok());
  EXPECT_TRUE(SubmitYamlAs(TestTokens::kAlice, JobYaml("default", stages)).ok());
}

TEST_F(SecurityGrpcTest, RequestIdsAreScopedByTenant) {
  const std::string yaml = JobYaml("same", "    - {seq_len: 64, steps: 2}\n");
  auto alices = SubmitYamlAs(TestTokens::kAlice, yaml, "r-1");
  ASSERT_TRUE(alices.ok()) << alices.status();
  auto again = SubmitYamlAs(TestTokens::kAlice, yaml, "r-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *alices);  // A retry gets the same job.
  auto bobs = SubmitYamlAs(TestTokens::kBob, yaml, "r-1");
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_NE(*bobs, *alices);  // Another tenant's id neither finds nor reveals alice's job.
}

class QuotaGrpcTest : public SecurityGrpcTest {
 protected:
  void SetUp() override {
    config_.quotas.tenants["research"].max_queued_jobs = 2;
    SecurityGrpcTest::SetUp();
  }
};

// Before: ListWorkers showed every tenant's running job ids and the worker hosts to users
// and viewers.
TEST_F(SecurityGrpcTest, WorkersShowOnlyTheCallersTenantsJobsAndHostsOnlyToAdmins) {
  FakeWorker& w1 = AddWorker("w1", "", "10.7.7.7");
  auto id = SubmitAs(TestTokens::kAlice, "alices");
  ASSERT_TRUE(id.ok()) << id.status();
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  w1.Started(a->ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  auto workers_as = [&](const std::string& token) {
    auto stub = v1::JobService::NewStub(Channel(WithToken(token)));
    v1::ListWorkersResponse resp;
    EXPECT_TRUE(Run([&](grpc::ClientContext* c) {
                  return stub->ListWorkers(c, v1::ListWorkersRequest(), &resp);
                }).ok());
    EXPECT_EQ(resp.workers_size(), 1);
    return resp.workers_size() == 1 ? resp.workers(0) : v1::Worker();
  };
  v1::Worker bob = workers_as(TestTokens::kBob);
  EXPECT_EQ(bob.running_ranks_size(), 0) << bob.DebugString();
  EXPECT_FALSE(bob.has_running());
  EXPECT_EQ(bob.host(), "");
  EXPECT_EQ(bob.state(), v1::WORKER_STATE_BUSY);  // Busy, but not with what.
  for (const char* token : {TestTokens::kAlice, TestTokens::kViewer}) {
    v1::Worker own = workers_as(token);
    ASSERT_EQ(own.running_ranks_size(), 1) << token;
    EXPECT_EQ(own.running_ranks(0).ref().job_id(), *id);
    EXPECT_EQ(own.host(), "");
  }
  EXPECT_EQ(workers_as(TestTokens::kAdmin).host(), "10.7.7.7");
}

// The finding: one tenant could fill state_max_bytes with 250 KB specs (submit + cancel) and
// every tenant got UNAVAILABLE until the week-long TTL. Now each tenant's stored bytes (specs,
// events, log files) are bounded by quotas.tenants.<t>.max_bytes: bob at his quota is refused
// with the quota's name, alice's submits go on, and nothing of bob's refused job is stored.
class ByteQuotaGrpcTest : public SecurityGrpcTest {
 protected:
  void SetUp() override {
    config_.quotas.tenants["other"].max_bytes = 1 << 20;  // 1 MiB: four 250 KB specs.
    SecurityGrpcTest::SetUp();
  }
  static std::string BigYaml(const std::string& name) {
    std::string yaml = JobYaml(name, "    - {seq_len: 64, steps: 4}\n");
    const std::string at = "  name: " + name + "\n";
    yaml.replace(yaml.find(at), at.size(),
                 absl::StrCat(at, "  labels: {big: ", std::string(250000, 'b'), "}\n"));
    return yaml;
  }
};

TEST_F(ByteQuotaGrpcTest, ATenantAtItsByteQuotaCannotMakeAnotherTenantsSubmitFail) {
  absl::Status refused;
  int accepted = 0;
  for (int i = 0; i < 8 && refused.ok(); ++i) {
    auto id = SubmitYamlAs(TestTokens::kBob, BigYaml(absl::StrCat("fill", i)));
    if (id.ok()) {
      ++accepted;
    } else {
      refused = id.status();
    }
  }
  EXPECT_EQ(accepted, 4);  // 4 x ~250 KB stored, the 5th passes 1 MiB.
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "quotas.tenants.other.max_bytes = 1048576"))
      << refused;
  // The other tenant is untouched: big and small submits go on, the store serves.
  auto alices = SubmitYamlAs(TestTokens::kAlice, BigYaml("alices"));
  EXPECT_TRUE(alices.ok()) << alices.status();
  EXPECT_TRUE(SubmitAs(TestTokens::kAlice, "small").ok());
  EXPECT_TRUE(Serving());
  // The refused job left no trace: bob still has exactly his 4.
  v1::ListJobsResponse list;
  auto bob = v1::JobService::NewStub(Channel(WithToken(TestTokens::kBob)));
  ASSERT_TRUE(Run([&](grpc::ClientContext* c) {
                return bob->ListJobs(c, v1::ListJobsRequest(), &list);
              }).ok());
  EXPECT_EQ(list.jobs_size(), 4);
}

class TenancyGrpcTest : public SecurityGrpcTest {
 protected:
  void SetUp() override {
    config_.quotas.tenants["research"].max_priority = 10;
    SecurityGrpcTest::SetUp();
  }
  absl::StatusOr<std::string> SubmitWith(const std::string& token, const std::string& name,
                                         const std::string& scheduling) {
    return SubmitYamlAs(token, JobYaml(name, "    - {seq_len: 64, steps: 4}\n", scheduling));
  }
};

// Before: max_user_priority (100) was the only cap, and any user could preempt another
// tenant's jobs with it; preemption reasons named the other tenant's job.
TEST_F(TenancyGrpcTest, PriorityCapsArePerTenantAndOnlyAnAdminGrantedPriorityPreemptsAcross) {
  auto capped = SubmitWith(TestTokens::kAlice, "capped", "{priority: 20}");
  EXPECT_TRUE(absl::IsPermissionDenied(capped.status())) << capped.status();
  EXPECT_TRUE(absl::StrContains(capped.status().message(), "is above 10")) << capped.status();

  FakeWorker& w1 = AddWorker("w1");
  auto bobs = SubmitWith(TestTokens::kBob, "bobs", "{priority: 0}");
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  auto a = w1.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  w1.Started(a->ref());
  ASSERT_TRUE(WaitState(*bobs, v1::JOB_STATE_RUNNING));
  // Alice's higher user priority waits instead of preempting another tenant (scheduling
  // runs within SubmitJob: the decision is made when it returns).
  auto alices = SubmitWith(TestTokens::kAlice, "alices", "{priority: 10}");
  ASSERT_TRUE(alices.ok()) << alices.status();
  EXPECT_EQ(GetJob(*bobs).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(GetJob(*alices).state(), v1::JOB_STATE_PENDING);
  // An admin-granted priority (above max_user_priority) preempts across tenants, unnamed.
  auto urgent = SubmitWith(TestTokens::kAdmin, "urgent", "{priority: 500}");
  ASSERT_TRUE(urgent.ok()) << urgent.status();
  auto abort = w1.WaitAbort();
  ASSERT_TRUE(abort.has_value());
  EXPECT_TRUE(abort->preempt());
  v1::Job bob = GetJob(*bobs);
  EXPECT_EQ(bob.state(), v1::JOB_STATE_CHECKPOINTING);
  EXPECT_TRUE(absl::StrContains(bob.reason(), "preempted for a job of another tenant"))
      << bob.reason();
  EXPECT_FALSE(absl::StrContains(bob.reason(), *urgent)) << bob.reason();
  EXPECT_FALSE(absl::StrContains(GetJob(*urgent).reason(), *bobs)) << GetJob(*urgent).reason();
  const std::string alice_reason = GetJob(*alices).reason();
  EXPECT_FALSE(absl::StrContains(alice_reason, *bobs)) << alice_reason;
  EXPECT_FALSE(absl::StrContains(alice_reason, *urgent)) << alice_reason;
}

class RetentionGrpcTest : public SecurityGrpcTest {
 protected:
  void SetUp() override {
    config_.ended_job_ttl_s = 5;  // Long enough to see them counted first.
    config_.quotas.tenants["research"].max_jobs = 2;
    SecurityGrpcTest::SetUp();
  }
  grpc::StatusCode GetCode(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse resp;
    return Run([&](grpc::ClientContext* c) { return jobs_->GetJob(c, req, &resp); }).error_code();
  }
  void CancelAs(const std::string& token, const std::string& id) {
    auto stub = v1::JobService::NewStub(Channel(WithToken(token)));
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::CancelJobResponse resp;
    ASSERT_TRUE(Run([&](grpc::ClientContext* c) { return stub->CancelJob(c, req, &resp); }).ok());
  }
  int64_t StoredRows(const std::string& id) {
    sqlite3* db = nullptr;
    int64_t n = -1;
    if (sqlite3_open_v2((dir_.path() + "/coordinator.db").c_str(), &db, SQLITE_OPEN_READONLY,
                        nullptr) == SQLITE_OK) {
      sqlite3_stmt* q = nullptr;
      const std::string sql = "SELECT (SELECT COUNT(*) FROM jobs WHERE id='" + id +
                              "') + (SELECT COUNT(*) FROM events WHERE job_id='" + id + "')";
      if (sqlite3_prepare_v2(db, sql.c_str(), -1, &q, nullptr) == SQLITE_OK &&
          sqlite3_step(q) == SQLITE_ROW) {
        n = sqlite3_column_int64(q, 0);
      }
      sqlite3_finalize(q);
    }
    sqlite3_close(db);
    return n;
  }
};

// Before: ended jobs were never deleted nor counted by any quota, so the store grew without
// limit. Now they count against quotas.max_jobs until ended_job_ttl_s deletes them (rows
// and all; their checkpoints stay on disk), and their numbers are never handed out again.
TEST_F(RetentionGrpcTest, EndedJobsCountUntilTheirTtlDeletesThemAndIdsAreNotReused) {
  auto one = SubmitAs(TestTokens::kAlice, "one");
  auto two = SubmitAs(TestTokens::kAlice, "two");
  ASSERT_TRUE(one.ok() && two.ok());
  const std::string kept = GetJob(*two).checkpoint_dir() + "/step-00000001";
  std::filesystem::create_directories(kept);
  CancelAs(TestTokens::kAlice, *one);
  CancelAs(TestTokens::kAlice, *two);
  auto three = SubmitAs(TestTokens::kAlice, "three");  // Two stored, ended or not.
  EXPECT_TRUE(absl::IsResourceExhausted(three.status())) << three.status();
  EXPECT_TRUE(absl::StrContains(three.status().message(), "max_jobs")) << three.status();
  EXPECT_GT(StoredRows(*two), 0);
  ASSERT_TRUE(PollUntil(
      [&] {
        server_->coordinator()->TickForTesting();
        return GetCode(*one) == grpc::StatusCode::NOT_FOUND &&
               GetCode(*two) == grpc::StatusCode::NOT_FOUND;
      },
      std::chrono::seconds(60)));
  EXPECT_EQ(StoredRows(*one), 0);
  EXPECT_EQ(StoredRows(*two), 0);
  EXPECT_TRUE(std::filesystem::exists(kept));  // Checkpoints are the user's: never deleted.
  RestartServer();
  EXPECT_EQ(GetCode(*two), grpc::StatusCode::NOT_FOUND);
  auto after = SubmitAs(TestTokens::kAlice, "after");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, "job-000003");  // Not job-000001 again (its directory is still there).
}

// A job's log files (<state_dir>/logs/<job>/, docs/OPERATIONS.md "Logs") go with its record
// when ended_job_ttl_s deletes it; at a restart, directories of jobs the store does not hold
// (a coordinator killed between the delete and the removal, a restored older backup) go too,
// and those of stored jobs stay.
TEST_F(RetentionGrpcTest, ALogDirectoryGoesWithItsExpiredJobAndStrayOnesAtARestart) {
  auto ended = SubmitAs(TestTokens::kAlice, "ended");
  auto live = SubmitAs(TestTokens::kAlice, "live");
  ASSERT_TRUE(ended.ok() && live.ok());
  const std::string logs = dir_.path() + "/logs/";
  CancelAs(TestTokens::kAlice, *ended);
  ASSERT_TRUE(std::filesystem::exists(logs + *ended + "/log.jsonl"));
  ASSERT_TRUE(std::filesystem::exists(logs + *live + "/log.jsonl"));
  ASSERT_TRUE(PollUntil(
      [&] {
        server_->coordinator()->TickForTesting();
        return GetCode(*ended) == grpc::StatusCode::NOT_FOUND;
      },
      std::chrono::seconds(60)));
  EXPECT_FALSE(std::filesystem::exists(logs + *ended));
  EXPECT_TRUE(std::filesystem::exists(logs + *live + "/log.jsonl"));
  std::filesystem::create_directories(logs + "job-000099");
  std::ofstream(logs + "job-000099/log.jsonl") << "{}\n";
  RestartServer();
  EXPECT_FALSE(std::filesystem::exists(logs + "job-000099"));
  EXPECT_TRUE(std::filesystem::exists(logs + *live + "/log.jsonl"));
}

absl::StatusOr<std::string> SubmitSpec(const std::shared_ptr<grpc::Channel>& channel,
                                       const std::string& yaml) {
  auto stub = v1::JobService::NewStub(channel);
  v1::SubmitJobRequest req;
  req.set_spec_yaml(yaml);
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.job_id();
}

std::string WithCheckpoint(const std::string& name, const std::string& checkpoint) {
  return JobYaml(name, "    - {seq_len: 64, steps: 4}\n") + "  checkpoint: " + checkpoint + "\n";
}

// Before (b145c41): once ended_job_ttl_s deleted alice's job, bob's submit naming her
// checkpoint.dir was accepted (the overlap check knew only stored jobs): his job resumed from her
// weights, or was marked SUCCEEDED at her step, and its retention deleted her checkpoints. Now
// the store keeps every directory a job was given (checkpoint_dirs, never deleted with the job):
// another tenant is refused, alice's own next job needs checkpoint.adopt: true, across a restart,
// and a non-empty directory no job was given is refused to everyone.
TEST_F(RetentionGrpcTest, ADeletedJobsCheckpointDirStaysItsTenants) {
  const std::string dir = config_.checkpoint_root + "/alice-real";
  const std::string spec_dir = "{dir: \"" + dir + "\"}";
  auto alice = SubmitSpec(Channel(WithToken(TestTokens::kAlice)), WithCheckpoint("a", spec_dir));
  ASSERT_TRUE(alice.ok()) << alice.status();
  std::filesystem::create_directories(dir + "/step-00000004");
  std::ofstream(dir + "/step-00000004/manifest.json") << "{}";
  CancelAs(TestTokens::kAlice, *alice);
  ASSERT_TRUE(PollUntil(
      [&] {
        server_->coordinator()->TickForTesting();
        return GetCode(*alice) == grpc::StatusCode::NOT_FOUND;
      },
      std::chrono::seconds(60)));
  for (int restarted = 0; restarted < 2; ++restarted) {
    for (const std::string& taken :
         {dir, dir + "/inner", config_.checkpoint_root + "/alice-real/"}) {
      auto bob = SubmitSpec(Channel(WithToken(TestTokens::kBob)),
                            WithCheckpoint("b", "{dir: \"" + taken + "\"}"));
      EXPECT_TRUE(absl::IsFailedPrecondition(bob.status())) << taken << ": " << bob.status();
      EXPECT_TRUE(absl::StrContains(bob.status().message(), "another tenant's job"))
          << bob.status();
      EXPECT_FALSE(absl::StrContains(bob.status().message(), *alice)) << bob.status();
      auto adopting = SubmitSpec(Channel(WithToken(TestTokens::kBob)),
                                 WithCheckpoint("b", "{dir: \"" + taken + "\", adopt: true}"));
      EXPECT_TRUE(absl::IsFailedPrecondition(adopting.status())) << adopting.status();
    }
    auto again = SubmitSpec(Channel(WithToken(TestTokens::kAlice)), WithCheckpoint("a2", spec_dir));
    EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
    EXPECT_TRUE(absl::StrContains(again.status().message(), "spec.checkpoint.adopt: true"))
        << again.status();
    EXPECT_TRUE(absl::StrContains(again.status().message(), *alice)) << again.status();
    if (restarted == 0) RestartServer();
  }
  // A directory with files in it that no job was given: nobody's to take.
  std::filesystem::create_directories(config_.checkpoint_root + "/stray/step-00000001");
  auto stray = SubmitSpec(Channel(WithToken(TestTokens::kAlice)),
                          WithCheckpoint("s", "{dir: \"" + config_.checkpoint_root + "/stray\"}"));
  EXPECT_TRUE(absl::IsFailedPrecondition(stray.status())) << stray.status();
  EXPECT_TRUE(absl::StrContains(stray.status().message(), "is not empty")) << stray.status();
  std::filesystem::create_directories(config_.checkpoint_root + "/fresh");
  EXPECT_TRUE(SubmitSpec(Channel(WithToken(TestTokens::kBob)),
                         WithCheckpoint("f", "{dir: \"" + config_.checkpoint_root + "/fresh\"}"))
                  .ok());
  auto adopted = SubmitSpec(Channel(WithToken(TestTokens::kAlice)),
                            WithCheckpoint("a3", "{dir: \"" + dir + "\", adopt: true}"));
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(GetJob(*adopted).checkpoint_dir(), dir);
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-00000004/manifest.json"));
}

// Before (b145c41): a store restored from an older backup handed out job-N again while
// <root>/job-N still held the previous job-N's checkpoints; the new job resumed from and pruned
// them. Now the next id is beyond every id the store or the checkpoint root has seen.
TEST_F(RetentionGrpcTest, ARestoreFromAnOlderBackupNeverReissuesAnIdWhoseDirectoryExists) {
  auto first = SubmitAs(TestTokens::kAlice, "first");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string db = dir_.path() + "/coordinator.db";
  server_->Shutdown();
  server_.reset();
  const std::string backup = dir_.path() + "/older.db";
  for (const char* suffix : {"", "-wal", "-shm"}) {
    if (std::filesystem::exists(db + suffix))
      std::filesystem::copy_file(db + suffix, backup + suffix);
  }
  RestartServer();
  auto second = SubmitAs(TestTokens::kBob, "second");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(*second, "job-000002");
  std::filesystem::create_directories(config_.checkpoint_root + "/job-000002/step-00000004");
  server_->Shutdown();
  server_.reset();
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::filesystem::remove(db + suffix);
    if (std::filesystem::exists(backup + suffix))
      std::filesystem::copy_file(backup + suffix, db + suffix);
  }
  RestartServer();
  auto third = SubmitAs(TestTokens::kAlice, "third");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*third, "job-000003");  // Not job-000002: bob's checkpoints are in its directory.
}

TEST_F(QuotaGrpcTest, ATenantsWaitingJobsAreCappedOthersAreNot) {
  EXPECT_TRUE(SubmitAs(TestTokens::kAlice, "one").ok());
  EXPECT_TRUE(SubmitAs(TestTokens::kAlice, "two").ok());
  auto third = SubmitAs(TestTokens::kAlice, "three");
  EXPECT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_TRUE(absl::StrContains(third.status().message(), "quotas.tenants.research"));
  EXPECT_TRUE(SubmitAs(TestTokens::kBob, "bobs").ok());  // Another tenant: default quota.
}

}  // namespace
}  // namespace ulysses::coordinator::testing
