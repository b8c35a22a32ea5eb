#include "coordinator/quota.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "coordinator/config.h"

namespace ulysses::coordinator {
namespace {

using ::testing::HasSubstr;

QuotaPolicy FromYaml(const std::string& yaml) {
  CoordinatorConfig c;
  absl::Status s = ApplyConfigYaml(yaml, &c);
  EXPECT_TRUE(s.ok()) << s;
  return c.quotas;
}

TEST(QuotaTest, ConfigSectionFillsTenantsFromTheDefault) {
  QuotaPolicy p = FromYaml(
      "quotas:\n"
      "  max_user_priority: 50\n"
      "  default: {max_queued_jobs: 7, max_workers: 4}\n"
      "  tenants:\n"
      "    research: {max_workers: 16}\n");
  EXPECT_EQ(p.max_user_priority, 50);
  EXPECT_EQ(p.For("unknown").max_queued_jobs, 7);
  EXPECT_EQ(p.For("unknown").max_workers, 4);
  EXPECT_EQ(p.For("research").max_queued_jobs, 7);  // Inherited from default.
  EXPECT_EQ(p.For("research").max_workers, 16);
}

TEST(QuotaTest, BadSectionsNameTheField) {
  CoordinatorConfig c;
  absl::Status unknown = ApplyConfigYaml("quotas: {tenants: {a: {max_gpus: 3}}}\n", &c);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("config.quotas.tenants.a.max_gpus"));
  c = CoordinatorConfig();
  c.state_dir = "/tmp/x";
  ASSERT_TRUE(ApplyConfigYaml("quotas: {default: {max_queued_jobs: 0}}\n", &c).ok());
  absl::Status range = ValidateAndFinalize(&c);
  EXPECT_THAT(std::string(range.message()), HasSubstr("quotas.default.max_queued_jobs: 0"));
}

TEST(QuotaTest, StoredBytesPerTenant) {
  QuotaPolicy p =
      FromYaml("quotas: {tenants: {small: {max_bytes: 2097152}, open: {max_bytes: 0}}}\n");
  EXPECT_EQ(p.For("unknown").max_bytes, 256 << 20);                       // The default.
  EXPECT_TRUE(CheckStoredBytesQuota("small", 1 << 20, 1 << 20, p).ok());  // Exactly at it.
  absl::Status over = CheckStoredBytesQuota("small", 1 << 20, (1 << 20) + 1, p);
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(std::string(over.message()), HasSubstr("quotas.tenants.small.max_bytes = 2097152"));
  EXPECT_TRUE(CheckStoredBytesQuota("open", int64_t{1} << 50, 1, p).ok());  // 0: no limit.
  CoordinatorConfig c;
  c.state_dir = "/tmp/x";
  ASSERT_TRUE(ApplyConfigYaml("quotas: {default: {max_bytes: 1000}}\n", &c).ok());
  EXPECT_THAT(std::string(ValidateAndFinalize(&c).message()),
              HasSubstr("quotas.default.max_bytes: 1000 is out of range"));
}

TEST(QuotaTest, PriorityAboveTheCapNeedsAdmin) {
  QuotaPolicy p;
  p.max_user_priority = 100;
  EXPECT_TRUE(CheckPriority(100, /*is_admin=*/false, p).ok());
  absl::Status s = CheckPriority(101, /*is_admin=*/false, p);
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("spec.scheduling.priority: 101"));
  EXPECT_TRUE(CheckPriority(1000000, /*is_admin=*/true, p).ok());
}

TEST(QuotaTest, OnlyAdminsOptOutOfPreemption) {
  EXPECT_TRUE(CheckPreemptible(true, /*is_admin=*/false).ok());
  EXPECT_TRUE(CheckPreemptible(false, /*is_admin=*/true).ok());
  absl::Status s = CheckPreemptible(false, /*is_admin=*/false);
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("spec.scheduling.preemptible: false needs the admin role"));
}

TEST(QuotaTest, QueuedJobsPerTenant) {
  QuotaPolicy p;
  p.tenants["small"].max_queued_jobs = 2;
  EXPECT_TRUE(CheckQueuedQuota("small", 1, p).ok());
  absl::Status s = CheckQueuedQuota("small", 2, p);
  EXPECT_TRUE(absl::IsResourceExhausted(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("quotas.tenants.small.max_queued_jobs"));
  EXPECT_TRUE(CheckQueuedQuota("other", 50, p).ok());  // Default 100.
}

TEST(QuotaTest, WorkersPerTenant) {
  QuotaPolicy p;
  p.tenants["t"].max_workers = 8;
  std::string reason;
  EXPECT_TRUE(FitsWorkerQuota("t", 4, 4, p, &reason));
  EXPECT_FALSE(FitsWorkerQuota("t", 6, 4, p, &reason));
  EXPECT_THAT(reason, HasSubstr("holds 6 of its 8 workers"));
  EXPECT_TRUE(FitsWorkerQuota("unlimited", 1000, 1000, p, nullptr));
}

}  // namespace
}  // namespace ulysses::coordinator
