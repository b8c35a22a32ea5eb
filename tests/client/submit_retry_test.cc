// `ulyssesctl submit` (in-process RunCli) against a JobService that answers UNAVAILABLE a
// given number of times: one fresh request_id per submission, the same id on every
// retry, a bounded number of calls, and no retry of a refusal.
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "client/cli.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::client {
namespace {

namespace v1 = ::ulysses::v1;
using ::testing::HasSubstr;

// Fails the first `failures` SubmitJob calls with `code`, then accepts; records each
// call's request_id.
class FlakySubmitService final : public v1::JobService::Service {
 public:
  FlakySubmitService(int failures, grpc::StatusCode code) : failures_(failures), code_(code) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    ids_.push_back(request->request_id());
    if (static_cast<int>(ids_.size()) <= failures_) return grpc::Status(code_, "store busy");
    response->set_job_id("job-000042");
    response->mutable_job()->set_id("job-000042");
    return grpc::Status::OK;
  }
  std::vector<std::string> ids() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_;
  }

 private:
  const int failures_;
  const grpc::StatusCode code_;
  std::mutex mu_;
  std::vector<std::string> ids_;
};

class SubmitRetryTest : public ::testing::Test {
 protected:
  void Start(int failures, grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE) {
    service_ = std::make_unique<FlakySubmitService>(failures, code);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  int Submit(std::string* out, std::string* err) {
    const char* source = std::getenv("ULYSSES_SOURCE_DIR");
    const std::string spec = std::string(source ? source : ".") + "/configs/jobs/tiny-demo.yaml";
    const std::string address = "127.0.0.1:" + std::to_string(port_);
    const char* argv[] = {"ulyssesctl", "--coordinator", address.c_str(), "submit",
                          "-f",         spec.c_str()};
    std::ostringstream o, e;
    const int code = RunCli(6, argv, o, e);
    *out = o.str();
    *err = e.str();
    return code;
  }

  std::unique_ptr<FlakySubmitService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(SubmitRetryTest, RetriesUnavailableWithTheSameRequestId) {
  Start(/*failures=*/2);
  std::string out, err;
  ASSERT_EQ(Submit(&out, &err), 0) << err;
  EXPECT_EQ(out, "job-000042\n");
  const std::vector<std::string> ids = service_->ids();
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_THAT(ids[0], ::testing::MatchesRegex("ulyssesctl-[0-9a-f]{32}"));
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
  // The next submission is a new request.
  ASSERT_EQ(Submit(&out, &err), 0) << err;
  ASSERT_EQ(service_->ids().size(), 4u);
  EXPECT_NE(service_->ids()[3], ids[0]);
}

TEST_F(SubmitRetryTest, GivesUpAfterFourCallsNamingTheRequestId) {
  Start(/*failures=*/1000);
  std::string out, err;
  EXPECT_EQ(Submit(&out, &err), 1);
  const std::vector<std::string> ids = service_->ids();
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_THAT(err, HasSubstr("cannot reach the coordinator"));
  EXPECT_THAT(err, HasSubstr("4 attempts with request_id " + ids[0]));
}

TEST_F(SubmitRetryTest, ARefusalIsNotRetried) {
  Start(/*failures=*/1000, grpc::StatusCode::INVALID_ARGUMENT);
  std::string out, err;
  EXPECT_EQ(Submit(&out, &err), 2);
  EXPECT_EQ(service_->ids().size(), 1u);
  EXPECT_THAT(err, HasSubstr("INVALID_ARGUMENT: store busy"));
}

}  // namespace
}  // namespace ulysses::client
