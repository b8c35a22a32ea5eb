#include "coordinator/path_policy.h"

#include "absl/strings/escaping.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/path_confine.h"
#include "coordinator/config.h"
#include "tests/common/spec/spec_test_util.h"
#include "yaml-cpp/yaml.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace ulysses::coordinator {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A real directory tree: <tmp>/data (a data root), <tmp>/ckpt (the checkpoint root),
// <tmp>/secret (outside both), with symlinks from inside the roots to outside.
class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The temp dir itself may sit behind a link (/tmp on some systems): resolve it.
    base_ = fs::canonical(tmp_.path()).string();
    fs::create_directories(base_ + "/data/corpus");
    fs::create_directories(base_ + "/ckpt/team-a");
    fs::create_directories(base_ + "/secret");
    fs::create_directories(base_ + "/data2");
    fs::create_symlink(base_ + "/secret", base_ + "/data/escape");
    fs::create_symlink(base_ + "/data/corpus", base_ + "/data/alias");
    fs::create_symlink(base_ + "/secret", base_ + "/ckpt/escape");
    roots_.data_roots = {base_ + "/data"};
    roots_.checkpoint_root = base_ + "/ckpt";
  }

  spec::JobSpec SpecWithTrain(const std::string& path) {
    spec::JobSpec s;
    s.data.train = path;
    return s;
  }

  testing::TempDir tmp_{"path-policy"};
  std::string base_;
  PathRoots roots_;
};

TEST_F(PathPolicyTest, ResolvePathRejectsRelativeDotDotAndEmptyComponents) {
  for (const char* bad : {"", "data/x", "/a/../b", "/a/./b", "/a//b", "..", "/.."}) {
    absl::StatusOr<std::string> r = ResolvePath("f", bad);
    EXPECT_FALSE(r.ok()) << "accepted \"" << bad << "\"";
    if (!r.ok()) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr("f:"));
    }
  }
}

TEST_F(PathPolicyTest, ResolvePathFollowsLinksInTheExistingPrefixOnly) {
  EXPECT_EQ(*ResolvePath("f", base_ + "/data/alias/x.bin"), base_ + "/data/corpus/x.bin");
  EXPECT_EQ(*ResolvePath("f", base_ + "/data/escape/shadow"), base_ + "/secret/shadow");
  EXPECT_EQ(*ResolvePath("f", base_ + "/data/new/a/b"), base_ + "/data/new/a/b");
  EXPECT_EQ(*ResolvePath("f", base_ + "/data/"), base_ + "/data");
}

TEST_F(PathPolicyTest, PathsAYamlOrShellReaderCouldReadDifferentlyAreRefused) {
  const std::string dir = base_ + "/ckpt/run";
  for (const std::string& bad :
       {dir + " #x", dir + "\n", dir + " ", " " + dir, dir + "\t", dir + std::string(1, '\0'),
        dir + "\x1b[2J", dir + "\r", dir + "\x7f", "\t" + dir}) {
    absl::Status st = spec::CheckPathText("spec.checkpoint.dir", bad);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << absl::CEscape(bad);
    EXPECT_THAT(std::string(st.message()), HasSubstr("spec.checkpoint.dir: \"")) << st;
    EXPECT_FALSE(ResolvePath("f", bad).ok()) << absl::CEscape(bad);
  }
  // What is data, not syntax, stays allowed.
  for (const std::string& fine : {dir + "#x", dir + "/a: b", dir + "/[x] {y}", dir + "/\xc3\xa9"}) {
    EXPECT_TRUE(spec::CheckPathText("f", fine).ok()) << fine;
  }
}

TEST_F(PathPolicyTest, ALinkThatCannotBeResolvedIsRefusedNotJudgedByItsName) {
  fs::create_symlink("/nonexistent-target-of-a-test/x", base_ + "/ckpt/dangling");
  fs::create_symlink(base_ + "/ckpt/loop-b", base_ + "/ckpt/loop-a");
  fs::create_symlink(base_ + "/ckpt/loop-a", base_ + "/ckpt/loop-b");
  for (const std::string& bad :
       {base_ + "/ckpt/dangling", base_ + "/ckpt/dangling/run", base_ + "/ckpt/loop-a/run"}) {
    absl::StatusOr<std::string> r = ResolvePath("spec.checkpoint.dir", bad);
    ASSERT_FALSE(r.ok()) << bad << " -> " << *r;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("cannot be resolved")) << bad;
  }
  // A path that does not exist yet (no link in it) is still fine.
  EXPECT_EQ(*ResolvePath("f", base_ + "/ckpt/new/run"), base_ + "/ckpt/new/run");
}

TEST_F(PathPolicyTest, IsWithinComparesWholeComponents) {
  EXPECT_TRUE(IsWithin("/data", "/data"));
  EXPECT_TRUE(IsWithin("/data/x", "/data"));
  EXPECT_FALSE(IsWithin("/data2/x", "/data"));
  EXPECT_FALSE(IsWithin("/dat", "/data"));
  EXPECT_TRUE(IsWithin("/anything", "/"));
  EXPECT_TRUE(Overlaps("/a/b", "/a"));
  EXPECT_TRUE(Overlaps("/a", "/a/b"));
  EXPECT_FALSE(Overlaps("/a/b", "/a/c"));
}

TEST_F(PathPolicyTest, DataPathsMustLieUnderADataRoot) {
  EXPECT_TRUE(CheckSpecPaths(SpecWithTrain(base_ + "/data/corpus/train.bin"), roots_).ok());
  EXPECT_TRUE(CheckSpecPaths(SpecWithTrain(base_ + "/data/alias/train.bin"), roots_).ok());

  absl::Status shadow = CheckSpecPaths(SpecWithTrain("/etc/shadow"), roots_);
  EXPECT_TRUE(absl::IsInvalidArgument(shadow));
  EXPECT_THAT(std::string(shadow.message()), HasSubstr("spec.data.train: \"/etc/shadow\""));
  EXPECT_THAT(std::string(shadow.message()), HasSubstr("outside the coordinator's data roots"));

  // A link under the root that points outside it is outside.
  absl::Status link = CheckSpecPaths(SpecWithTrain(base_ + "/data/escape/shadow"), roots_);
  EXPECT_TRUE(absl::IsInvalidArgument(link));
  EXPECT_THAT(std::string(link.message()), HasSubstr("resolves to"));

  // A sibling whose name starts like the root is not under it.
  EXPECT_FALSE(CheckSpecPaths(SpecWithTrain(base_ + "/data2/x.bin"), roots_).ok());
  EXPECT_FALSE(CheckSpecPaths(SpecWithTrain(base_ + "/data/../secret/x"), roots_).ok());

  spec::JobSpec validation;
  validation.data.validation = base_ + "/secret/v.bin";
  EXPECT_THAT(std::string(CheckSpecPaths(validation, roots_).message()),
              HasSubstr("spec.data.validation:"));
  spec::JobSpec init;
  init.model.init_from = base_ + "/secret/hf";
  EXPECT_THAT(std::string(CheckSpecPaths(init, roots_).message()),
              HasSubstr("spec.model.init_from:"));
}

TEST_F(PathPolicyTest, NoDataRootsMeansNoFilePaths) {
  PathRoots none;
  none.checkpoint_root = roots_.checkpoint_root;
  absl::Status s = CheckSpecPaths(SpecWithTrain(base_ + "/data/corpus/train.bin"), none);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--data-root"));
  EXPECT_TRUE(CheckSpecPaths(spec::JobSpec(), none).ok());  // Synthetic data: no paths.
}

TEST_F(PathPolicyTest, CheckpointDirMustLieBelowTheRootWithoutReservedNames) {
  spec::JobSpec s;
  s.checkpoint.dir = base_ + "/ckpt/team-a/run1";
  EXPECT_TRUE(CheckSpecPaths(s, roots_).ok());
  for (const std::string& bad :
       {std::string("../../../../root/.ssh"), base_ + "/ckpt/../../root/.ssh", base_ + "/secret",
        base_ + "/ckpt/escape/x", base_ + "/ckpt", base_ + "/ckpt/job-000001",
        base_ + "/ckpt/job-000001/sub"}) {
    s.checkpoint.dir = bad;
    absl::Status st = CheckSpecPaths(s, roots_);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("spec.checkpoint.dir:")) << bad;
  }
}

TEST_F(PathPolicyTest, OneCheckpointDirPerJob) {
  spec::JobSpec unset;
  EXPECT_EQ(*JobCheckpointDir(unset, "job-000007", roots_, {}, {}), base_ + "/ckpt/job-000007");

  spec::JobSpec mine;
  mine.checkpoint.dir = base_ + "/ckpt/team-a/run1";
  std::vector<std::string> taken = {base_ + "/ckpt/job-000001", base_ + "/ckpt/team-a/run1"};
  std::vector<std::string> by = {"job-000001", "job-000002"};
  absl::StatusOr<std::string> same = JobCheckpointDir(mine, "job-000003", roots_, taken, by);
  EXPECT_TRUE(absl::IsFailedPrecondition(same.status()));
  EXPECT_THAT(std::string(same.status().message()), HasSubstr("job-000002"));

  // Containing or lying inside another job's directory overlaps too.
  mine.checkpoint.dir = base_ + "/ckpt/team-a";
  EXPECT_FALSE(JobCheckpointDir(mine, "job-000003", roots_, taken, by).ok());
  mine.checkpoint.dir = base_ + "/ckpt/team-a/run1/inner";
  EXPECT_FALSE(JobCheckpointDir(mine, "job-000003", roots_, taken, by).ok());
  mine.checkpoint.dir = base_ + "/ckpt/team-a/run2";
  EXPECT_EQ(*JobCheckpointDir(mine, "job-000003", roots_, taken, by), base_ + "/ckpt/team-a/run2");
}

TEST_F(PathPolicyTest, CommittedCheckpointsStayInsideTheJobsDirectory) {
  const std::string dir = base_ + "/ckpt/job-000001";
  EXPECT_TRUE(CheckCommittedCheckpointPath("c", dir + "/step-00000010", dir).ok());
  EXPECT_TRUE(CheckCommittedCheckpointPath("c", dir + "/step-00000010/", dir).ok());
  for (const std::string& bad :
       {std::string("/root/.ssh/id_rsa"), dir, dir + "/../job-000002/step-1", dir + "2/step-1",
        std::string("step-1"), std::string("")}) {
    absl::Status st = CheckCommittedCheckpointPath("checkpoint.checkpoint.path", bad, dir);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("checkpoint.checkpoint.path:")) << bad;
  }
}

TEST_F(PathPolicyTest, ConfigResolvesRootsAndRejectsBadOnes) {
  CoordinatorConfig c;
  c.state_dir = base_ + "/state";
  fs::create_symlink(base_ + "/data", base_ + "/data-link");
  c.data_roots = {base_ + "/data-link/", base_ + "/not-mounted-here"};
  c.checkpoint_root = base_ + "/ckpt/./";
  ASSERT_TRUE(ValidateAndFinalize(&c).ok());
  EXPECT_EQ(c.data_roots, (std::vector<std::string>{base_ + "/data", base_ + "/not-mounted-here"}));
  EXPECT_EQ(c.checkpoint_root, base_ + "/ckpt");

  CoordinatorConfig bad;
  bad.state_dir = base_ + "/state";
  bad.data_roots = {base_ + "/data", ""};
  absl::Status s = ValidateAndFinalize(&bad);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("data_roots[1]:"));

  CoordinatorConfig yaml;
  ASSERT_TRUE(ApplyConfigYaml("data_roots: [/a, /b]\n", &yaml).ok());
  EXPECT_EQ(yaml.data_roots, (std::vector<std::string>{"/a", "/b"}));
}

// The shipped jobs (configs/jobs) are accepted by the shipped Kubernetes coordinator
// config (deploy/k8s/base/config/coordinator.yaml, the ConfigMap's file): their paths lie
// under its roots. Its /shared volume does not exist here, so this checks the lexical rules.
TEST(ShippedPathsTest, ShippedJobsFitTheDeployedCoordinatorsRoots) {
  const std::string source = spec::testing::SourceDir();
  CoordinatorConfig c;
  ASSERT_TRUE(ApplyConfigYaml(
                  spec::testing::ReadFile(source + "/deploy/k8s/base/config/coordinator.yaml"), &c)
                  .ok());
  c.state_dir = "/var/lib/ulysses";
  // The Deployment gives TLS by flags (--tls-cert ...), which this config alone lacks; its
  // 0.0.0.0 listen would be refused as plaintext here. Paths are what this test checks.
  c.listen = "127.0.0.1:50051";
  absl::Status valid = ValidateAndFinalize(&c);
  ASSERT_TRUE(valid.ok()) << valid;
  ASSERT_FALSE(c.data_roots.empty());
  const PathRoots roots{c.data_roots, c.checkpoint_root};
  int with_paths = 0;
  for (const std::string& path : spec::testing::ShippedSpecs()) {
    absl::StatusOr<spec::JobSpec> s = spec::ParseJobSpec(spec::testing::ReadFile(path), {});
    ASSERT_TRUE(s.ok()) << path << ": " << s.status();
    if (!s->data.train.empty() || !s->checkpoint.dir.empty()) ++with_paths;
    EXPECT_TRUE(CheckSpecPaths(*s, roots).ok()) << path << ": " << CheckSpecPaths(*s, roots);
  }
  EXPECT_GT(with_paths, 0);  // The check must see at least one job that names files.
}

}  // namespace
}  // namespace ulysses::coordinator
