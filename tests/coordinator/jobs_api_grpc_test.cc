// JobService behaviour added for issue 9 through the real gRPC API (grpc_fixture.h):
// idempotent SubmitJob (request_id, durable across a coordinator restart) and paged
// ListWorkers.
#include <optional>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using testing::FakeWorker;
using testing::JobYaml;

class JobsApiGrpcTest : public testing::CoordinatorServerTest {
 protected:
  absl::StatusOr<v1::SubmitJobResponse> SubmitWithId(const std::string& yaml,
                                                     const std::string& request_id) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    req.set_request_id(request_id);
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    absl::Status s = FromGrpcStatus(jobs_->SubmitJob(&ctx, req, &resp));
    if (!s.ok()) return s;
    return resp;
  }

  int CountJobs() {
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    EXPECT_TRUE(jobs_->ListJobs(&ctx, req, &resp).ok());
    return resp.jobs_size();
  }

  // Stops the in-process coordinator and starts a new one on the same state dir.
};

TEST_F(JobsApiGrpcTest, SubmitWithARequestIdIsIdempotentAcrossRestarts) {
  const std::string yaml = JobYaml("once", "    - {seq_len: 256, steps: 4}\n");
  auto first = SubmitWithId(yaml, "req-7f3a");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->job_id().empty());
  // A retry after a lost response: the same job, no second one.
  auto retry = SubmitWithId(yaml, "req-7f3a");
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->job_id(), first->job_id());
  EXPECT_EQ(retry->job().id(), first->job_id());
  EXPECT_EQ(retry->canonical_spec_yaml(), first->canonical_spec_yaml());
  EXPECT_EQ(CountJobs(), 1);
  // Another id is another job (of another name: a tenant's live jobs have distinct names).
  const std::string yaml2 = JobYaml("twice", "    - {seq_len: 256, steps: 4}\n");
  auto other = SubmitWithId(yaml2, "req-other");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->job_id(), first->job_id());
  // Without an id every submission is a new job (unchanged behaviour).
  ASSERT_TRUE(Submit(JobYaml("third", "    - {seq_len: 256, steps: 4}\n")).ok());
  ASSERT_TRUE(Submit(JobYaml("fourth", "    - {seq_len: 256, steps: 4}\n")).ok());
  EXPECT_EQ(CountJobs(), 4);

  RestartServer();
  auto after = SubmitWithId(yaml, "req-7f3a");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->job_id(), first->job_id());
  EXPECT_EQ(CountJobs(), 4);
}

// The finding (issue 44): the same file submitted twice made two jobs of one name, silently,
// and a name found no job. A tenant's jobs that have not ended have distinct names.
TEST_F(JobsApiGrpcTest, ASecondLiveJobOfTheSameNameIsRefusedUnlessAllowed) {
  const std::string yaml = JobYaml("dup", "    - {seq_len: 256, steps: 4}\n");
  auto first = Submit(yaml);
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = Submit(yaml);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(),
                                absl::StrCat("\"dup\" is already the name of ", *first)))
      << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), "--allow-duplicate"));
  EXPECT_EQ(CountJobs(), 1);  // The refused one left no trace.
  v1::SubmitJobRequest allowed;
  allowed.set_spec_yaml(yaml);
  allowed.set_allow_duplicate_name(true);
  v1::SubmitJobResponse resp;
  {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    ASSERT_TRUE(jobs_->SubmitJob(&ctx, allowed, &resp).ok());
  }
  // Another tenant's name space is its own.
  auto bob = v1::JobService::NewStub(Channel(testing::WithToken(testing::TestTokens::kBob)));
  {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    v1::SubmitJobResponse r;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    EXPECT_TRUE(bob->SubmitJob(&ctx, req, &r).ok());
  }
  // Ended jobs do not hold their name.
  for (const std::string& id : {*first, resp.job_id()}) {
    v1::CancelJobRequest cancel;
    cancel.set_job_id(id);
    v1::CancelJobResponse r;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    ASSERT_TRUE(jobs_->CancelJob(&ctx, cancel, &r).ok());
  }
  EXPECT_TRUE(Submit(yaml).ok());
}

// `get jobs` filters: by name, by labels (all must match), by tenant (others' only for admins).
TEST_F(JobsApiGrpcTest, ListJobsFiltersByNameLabelsAndTenant) {
  auto labelled = [](const std::string& name, const std::string& labels) {
    std::string y = JobYaml(name, "    - {seq_len: 256, steps: 4}\n");
    const std::string at = "  name: " + name + "\n";
    y.replace(y.find(at), at.size(), at + "  labels: " + labels + "\n");
    return y;
  };
  auto alice = v1::JobService::NewStub(Channel(testing::WithToken(testing::TestTokens::kAlice)));
  auto bob = v1::JobService::NewStub(Channel(testing::WithToken(testing::TestTokens::kBob)));
  auto submit = [&](v1::JobService::Stub* stub, const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    v1::SubmitJobResponse r;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    EXPECT_TRUE(stub->SubmitJob(&ctx, req, &r).ok());
    return r.job_id();
  };
  const std::string a1 = submit(alice.get(), labelled("a1", "{team: research, size: small}"));
  submit(alice.get(), labelled("a2", "{team: infra}"));
  const std::string b1 = submit(bob.get(), labelled("b1", "{team: research}"));
  auto list = [&](v1::JobService::Stub* stub, const v1::ListJobsRequest& req,
                  grpc::StatusCode want = grpc::StatusCode::OK) {
    v1::ListJobsResponse r;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    EXPECT_EQ(stub->ListJobs(&ctx, req, &r).error_code(), want);
    std::set<std::string> ids;
    for (const v1::Job& j : r.jobs()) ids.insert(j.id());
    return ids;
  };
  v1::ListJobsRequest by_name;
  by_name.set_name("a1");
  EXPECT_EQ(list(jobs_.get(), by_name), (std::set<std::string>{a1}));
  v1::ListJobsRequest by_labels;
  by_labels.add_labels("team=research");
  EXPECT_EQ(list(jobs_.get(), by_labels), (std::set<std::string>{a1, b1}));
  by_labels.add_labels("size=small");
  EXPECT_EQ(list(jobs_.get(), by_labels), (std::set<std::string>{a1}));
  v1::ListJobsRequest by_tenant;
  by_tenant.set_tenant("other");
  EXPECT_EQ(list(jobs_.get(), by_tenant), (std::set<std::string>{b1}));
  EXPECT_TRUE(list(alice.get(), by_tenant, grpc::StatusCode::PERMISSION_DENIED).empty());
  v1::ListJobsRequest bad;
  bad.add_labels("team");
  list(jobs_.get(), bad, grpc::StatusCode::INVALID_ARGUMENT);
}

// `every_steps: auto` is accepted and stored (the canonical spec keeps it, across a restart);
// its assignment carries the coordinator's interval, a measured checkpoint cost sends a new one
// over the worker's session, and GetJob shows it with its inputs.
TEST_F(JobsApiGrpcTest, AnAutoCheckpointIntervalIsAcceptedStoredAndSentWithTheAssignment) {
  const std::string yaml =
      JobYaml("auto", "    - {seq_len: 256, steps: 4}\n") + "  checkpoint: {every_steps: auto}\n";
  auto accepted = SubmitWithId(yaml, "req-auto");
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_NE(accepted->canonical_spec_yaml().find("every_steps: auto"), std::string::npos)
      << accepted->canonical_spec_yaml();
  EXPECT_EQ(CountJobs(), 1);
  FakeWorker& w = AddWorker("w0");
  std::optional<v1::Assignment> a = w.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(a->has_checkpoint_interval()) << a->DebugString();
  EXPECT_EQ(a->checkpoint_interval().version(), 1);
  EXPECT_EQ(a->checkpoint_interval().every_steps(), 1);  // C not measured yet
  EXPECT_EQ(a->checkpoint_interval().mtbf_source(), "prior");
  // Rank 0's first periodic checkpoint blocked 0.25 s: a new interval comes down the session.
  v1::WorkerMessage m;
  *m.mutable_checkpoint()->mutable_ref() = a->ref();
  v1::Checkpoint* c = m.mutable_checkpoint()->mutable_checkpoint();
  c->set_path(a->checkpoint_dir() + "/step-00000001");
  c->set_stage(0);
  c->set_step(1);
  c->set_seconds(1.0);
  c->set_blocked_seconds(0.25);
  std::optional<v1::Ack> ack = SendForAck(w, m);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->result(), v1::ACK_CODE_OK) << ack->message();
  std::optional<v1::CoordinatorMessage> update =
      w.WaitFor([](const v1::CoordinatorMessage& x) { return x.has_checkpoint_interval(); });
  ASSERT_TRUE(update.has_value());
  const v1::CheckpointInterval& i = update->checkpoint_interval().interval();
  EXPECT_EQ(update->checkpoint_interval().ref().job_id(), accepted->job_id());
  EXPECT_EQ(i.version(), 2);
  EXPECT_EQ(i.cost_source(), "measured");
  EXPECT_DOUBLE_EQ(i.cost_seconds(), 0.25);
  EXPECT_GT(i.every_seconds(), 0);
  const v1::Job job = GetJob(accepted->job_id());
  ASSERT_TRUE(job.has_checkpoint_interval());
  EXPECT_EQ(job.checkpoint_interval().version(), 2);
  EXPECT_EQ(job.checkpoint_interval().reason(), i.reason());
  // Stored: after a restart the same request finds the job and its spec.
  RestartServer();
  auto again = SubmitWithId(yaml, "req-auto");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->job_id(), accepted->job_id());
  EXPECT_NE(again->canonical_spec_yaml().find("every_steps: auto"), std::string::npos);
}

TEST_F(JobsApiGrpcTest, TheSameRequestIdWithAnotherSpecIsRefusedNamingTheJob) {
  auto first = SubmitWithId(JobYaml("a", "    - {seq_len: 256, steps: 4}\n"), "req-1");
  ASSERT_TRUE(first.ok());
  auto clash = SubmitWithId(JobYaml("a", "    - {seq_len: 256, steps: 5}\n"), "req-1");
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(std::string(clash.status().message()).find(first->job_id()), std::string::npos)
      << clash.status();
  EXPECT_EQ(CountJobs(), 1);
  // A malformed id is refused, naming the field.
  auto bad = SubmitWithId(JobYaml("a", "    - {seq_len: 256, steps: 4}\n"), "req 1/../x");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(bad.status().message()).rfind("request_id: ", 0), 0u) << bad.status();
  EXPECT_EQ(CountJobs(), 1);
}

TEST_F(JobsApiGrpcTest, ListWorkersPagesThroughEveryWorkerOnce) {
  for (int i = 0; i < 5; ++i) AddWorker(absl::StrCat("w", i));
  std::set<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    v1::ListWorkersRequest req;
    req.set_page_size(2);
    req.set_page_token(token);
    v1::ListWorkersResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    ASSERT_TRUE(jobs_->ListWorkers(&ctx, req, &resp).ok());
    EXPECT_LE(resp.workers_size(), 2);
    for (const v1::Worker& w : resp.workers()) EXPECT_TRUE(seen.insert(w.id()).second) << w.id();
    token = resp.next_page_token();
    ASSERT_LT(++pages, 10);
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen.size(), 5u);
  // The default page holds them all.
  v1::ListWorkersResponse all;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(10));
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &all).ok());
  EXPECT_EQ(all.workers_size(), 5);
  EXPECT_TRUE(all.next_page_token().empty());
}

}  // namespace
}  // namespace ulysses::coordinator
