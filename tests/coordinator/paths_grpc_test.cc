// Path confinement through the real gRPC API (path_policy.h): a spec that names a file
// outside the data roots, a checkpoint dir outside the checkpoint root, or another
// job's checkpoint dir is refused with the field named, and leaves no job behind.
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/spec/job_spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::JobYaml;
using ::testing::Not;

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
  absl::StatusOr<std::string> SubmitAs(const std::string& token, const std::string& yaml) {
    auto stub = v1::JobService::NewStub(Channel(testing::WithToken(token)));
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    absl::Status st = FromGrpcStatus(stub->SubmitJob(&ctx, req, &resp));
    if (!st.ok()) return st;
    return resp.job_id();
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

// Before: bob (tenant "other") named alice's directory with " #x", a trailing newline or
// space; the coordinator's overlap check saw a different string, while the engine, which
// got `--set spec.checkpoint.dir=<dir>` and parsed it as YAML again, used alice's
// directory: bob resumed from her weights and his retention replaced her checkpoint. The
// overlap error also named alice's job.
TEST_F(PathsGrpcTest, AnotherTenantsCheckpointDirCannotBeReachedByTextTricks) {
  using testing::TestTokens;
  const std::string dir = config_.checkpoint_root + "/alice-run";
  auto alice = SubmitAs(TestTokens::kAlice, WithCheckpointDir("alice", dir));
  ASSERT_TRUE(alice.ok()) << alice.status();
  // YAML escapes inside the double-quoted scalar: the spec's string holds the raw bytes.
  for (const std::string& trick : {dir + " #x", dir + "\\n", dir + " ", " " + dir, dir + "\\t",
                                   dir + "\\r", dir + "\\x1b[2J", dir + "\\0"}) {
    auto bob = SubmitAs(TestTokens::kBob, WithCheckpointDir("bob", trick));
    EXPECT_TRUE(absl::IsInvalidArgument(bob.status())) << trick << ": " << bob.status();
    EXPECT_THAT(std::string(bob.status().message()), HasSubstr("spec.checkpoint.dir:")) << trick;
  }
  // The plain name is taken; the error does not say by whom or where.
  auto bob = SubmitAs(TestTokens::kBob, WithCheckpointDir("bob", dir + "/inside"));
  EXPECT_TRUE(absl::IsFailedPrecondition(bob.status())) << bob.status();
  EXPECT_THAT(std::string(bob.status().message()), HasSubstr("another job"));
  EXPECT_THAT(std::string(bob.status().message()), Not(HasSubstr(*alice)));
  EXPECT_THAT(std::string(bob.status().message()), Not(HasSubstr("\"" + dir + "\"")));
  // Alice herself is told which of her jobs holds it.
  auto again = SubmitAs(TestTokens::kAlice, WithCheckpointDir("again", dir + "/inside"));
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_THAT(std::string(again.status().message()), HasSubstr(*alice));
  EXPECT_EQ(JobCount(), 1);
}

// A checkpoint dir the YAML of an override would misread (": " makes a mapping) reaches
// the rank as the same string: the spec document carries it, no override re-parses it.
TEST_F(PathsGrpcTest, TheRankReadsExactlyTheCheckedCheckpointDir) {
  const std::string dir =
      config_.checkpoint_root + "/odd: name, [x] {y} 'q' \\\"z\\\" &a *b !c %d @e";
  auto& w = AddWorker("w1");
  auto id = Submit(WithCheckpointDir("odd", dir));
  ASSERT_TRUE(id.ok()) << id.status();
  auto a = w.WaitAssignment();
  ASSERT_TRUE(a.has_value());
  const std::string want = GetJob(*id).checkpoint_dir();
  EXPECT_EQ(a->checkpoint_dir(), want);
  spec::ParseOptions as_the_engine_reads_it;  // The document plus its --set overrides.
  as_the_engine_reads_it.overrides.assign(a->overrides().begin(), a->overrides().end());
  absl::StatusOr<spec::JobSpec> rank_spec =
      spec::ParseJobSpec(a->spec_yaml(), as_the_engine_reads_it);
  ASSERT_TRUE(rank_spec.ok()) << rank_spec.status();
  EXPECT_EQ(rank_spec->checkpoint.dir, want);
}

// Before: a link whose target did not exist on the coordinator was judged by its own name
// (inside the root); on a worker it may point anywhere.
TEST_F(PathsGrpcTest, DanglingLinksAreRefused) {
  std::filesystem::create_directories(config_.checkpoint_root);
  std::filesystem::create_symlink("/nonexistent-target/for/this/test",
                                  config_.checkpoint_root + "/dangling");
  auto ckpt = Submit(WithCheckpointDir("dangling", config_.checkpoint_root + "/dangling/run"));
  EXPECT_TRUE(absl::IsInvalidArgument(ckpt.status())) << ckpt.status();
  EXPECT_THAT(std::string(ckpt.status().message()), HasSubstr("cannot be resolved"));
  std::filesystem::create_symlink("/nonexistent-target/train.bin", data_root_ + "/train-link.bin");
  auto data = Submit(WithTrain("dangling-data", data_root_ + "/train-link.bin"));
  EXPECT_TRUE(absl::IsInvalidArgument(data.status())) << data.status();
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr("spec.data.train: \"" + data_root_ + "/train-link.bin\""));
  std::filesystem::create_symlink("loop", data_root_ + "/loop");
  auto loop = Submit(WithTrain("loop", data_root_ + "/loop/x.bin"));
  EXPECT_TRUE(absl::IsInvalidArgument(loop.status())) << loop.status();
  EXPECT_EQ(JobCount(), 0);
}

}  // namespace
}  // namespace ulysses::coordinator
