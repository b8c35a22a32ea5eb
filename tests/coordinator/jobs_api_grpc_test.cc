// JobService behaviour added for issue 9 through the real gRPC API (grpc_fixture.h):
// idempotent SubmitJob (request_id, durable across a coordinator restart) and paged
// ListWorkers.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

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
  // Another id is another job.
  auto other = SubmitWithId(yaml, "req-other");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->job_id(), first->job_id());
  // Without an id every submission is a new job (unchanged behaviour).
  ASSERT_TRUE(Submit(yaml).ok());
  ASSERT_TRUE(Submit(yaml).ok());
  EXPECT_EQ(CountJobs(), 4);

  RestartServer();
  auto after = SubmitWithId(yaml, "req-7f3a");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->job_id(), first->job_id());
  EXPECT_EQ(CountJobs(), 4);
}

// The coordinator does not send checkpoint intervals yet: `every_steps: auto` would fail at the
// job's first rank, so it is refused at submission, naming the field and the fix.
TEST_F(JobsApiGrpcTest, AnAutoCheckpointIntervalIsRefusedAtSubmitAndLeavesNoTrace) {
  const std::string yaml =
      JobYaml("auto", "    - {seq_len: 256, steps: 4}\n") + "  checkpoint: {every_steps: auto}\n";
  auto refused = SubmitWithId(yaml, "req-auto");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  const std::string m(refused.status().message());
  EXPECT_NE(m.find("spec.checkpoint.every_steps: \"auto\""), std::string::npos) << m;
  EXPECT_NE(m.find("use every_steps: N or every_seconds: N"), std::string::npos) << m;
  EXPECT_EQ(CountJobs(), 0);
  // A fixed interval by time is served.
  auto timed = SubmitWithId(
      JobYaml("timed", "    - {seq_len: 256, steps: 4}\n") + "  checkpoint: {every_seconds: 600}\n",
      "req-timed");
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ(CountJobs(), 1);
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
