// Path confinement through the real gRPC API (path_policy.h): a spec that names a file
// outside the data roots, a checkpoint dir outside the checkpoint root, or another
// job's checkpoint dir is refused with the field named, and leaves no job behind.
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::JobYaml;

class PathsGrpcTest : public testing::CoordinatorServerTest {
 protected:
  void SetUp() override {
    data_root_ = std::filesystem::canonical(dir_.path()).string() + "/data";
    std::filesystem::create_directories(data_root_);
    std::ofstream(data_root_ + "/train.bin") << std::string(4096, '\0');
    config_.data_roots = {data_root_};
    testing::CoordinatorServerTest::SetUp();
  }

  std::string WithTrain(const std::string& name, const std::string& path) {
    return absl::StrReplaceAll(
        JobYaml(name, "    - {seq_len: 64, steps: 2}\n"),
        {{"    synthetic: {generator: random}\n", absl::StrCat("    train: \"", path, "\"\n")}});
  }
  std::string WithCheckpointDir(const std::string& name, const std::string& dir) {
    return JobYaml(name, "    - {seq_len: 64, steps: 2}\n") +
           absl::StrCat("  checkpoint: {dir: \"", dir, "\"}\n");
  }
  int JobCount() {
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(jobs_->ListJobs(&ctx, req, &resp).ok());
    return resp.jobs_size();
  }

  std::string data_root_;
};

TEST_F(PathsGrpcTest, DataOutsideTheDataRootsIsRefusedAndLeavesNoTrace) {
  auto inside = Submit(WithTrain("inside", data_root_ + "/train.bin"));
  EXPECT_TRUE(inside.ok()) << inside.status();

  auto shadow = Submit(WithTrain("shadow", "/etc/shadow"));
  EXPECT_TRUE(absl::IsInvalidArgument(shadow.status())) << shadow.status();
  EXPECT_THAT(std::string(shadow.status().message()),
              HasSubstr("spec.data.train: \"/etc/shadow\""));

  std::filesystem::create_symlink("/etc", data_root_ + "/etc-link");
  auto linked = Submit(WithTrain("linked", data_root_ + "/etc-link/shadow"));
  EXPECT_TRUE(absl::IsInvalidArgument(linked.status())) << linked.status();
  EXPECT_THAT(std::string(linked.status().message()), HasSubstr("resolves to \"/etc/shadow\""));
  EXPECT_EQ(JobCount(), 1);
}

TEST_F(PathsGrpcTest, CheckpointDirOutsideTheRootIsRefused) {
  for (const std::string& dir : {std::string("../../../../root/.ssh"), std::string("/root/.ssh"),
                                 config_.checkpoint_root + "/../../escape"}) {
    auto id = Submit(WithCheckpointDir("escape", dir));
    EXPECT_TRUE(absl::IsInvalidArgument(id.status())) << dir << ": " << id.status();
    EXPECT_THAT(std::string(id.status().message()), HasSubstr("spec.checkpoint.dir:")) << dir;
  }
  EXPECT_EQ(JobCount(), 0);
}

TEST_F(PathsGrpcTest, TwoJobsCannotShareACheckpointDir) {
  const std::string dir = config_.checkpoint_root + "/team-a/run1";
  auto first = Submit(WithCheckpointDir("first", dir));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Submit(WithCheckpointDir("second", dir));
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(*first));
  // Nesting inside the first job's directory (or its coordinator-made one) is sharing too.
  auto nested = Submit(WithCheckpointDir("nested", dir + "/inner"));
  EXPECT_TRUE(absl::IsFailedPrecondition(nested.status())) << nested.status();
  EXPECT_EQ(JobCount(), 1);
  EXPECT_EQ(GetJob(*first).checkpoint_dir(), dir);
}

}  // namespace
}  // namespace ulysses::coordinator
