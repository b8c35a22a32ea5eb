// WorkerSettings (worker/agent/worker_config_fields.h): the one list ulysses-worker's flags,
// their ranges and docs/OPERATIONS.md's "Workers" table derive from.
#include "worker/agent/worker_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/settings_cli.h"
#include "gtest/gtest.h"
#include "tests/testing/doc_table.h"
#include "tests/testing/temp_dir.h"
#include "worker/agent/worker_config_fields.h"

namespace ulysses::agent {
namespace {

using ::ulysses::testing::TempDir;

// A config that passes Validate on this machine (CPU slot, this test as the "engine").
WorkerConfig Valid(const TempDir& dir) {
  WorkerConfig c;
  c.coordinator = "127.0.0.1:1";
  c.name = "w";
  c.work_dir = dir.Sub("work");
  c.engine_bin = "/bin/true";
  c.fabric_flag = "sockets";
  return c;
}

// A flag sets its field only when given; the rest keep the struct's defaults, and 0 is a value.
TEST(WorkerSettingsTest, AFlagSetsItsFieldOnlyWhenGiven) {
  CLI::App app;
  config::FlagOverrides<WorkerConfig> flags;
  flags.AddTo(app, WorkerSettings{});
  std::vector<std::string> args = {
      "--grace-period-s", "0",  "--device", "cpu",   "--capacity", "3", "--data-root", "/a",
      "--data-root",      "/b", "--node",   "rack1", "--insecure"};
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector.
  app.parse(args);
  WorkerConfig c;
  flags.ApplyTo(&c);
  EXPECT_EQ(c.grace_period_s, 0);
  EXPECT_EQ(c.capacity, 3);
  EXPECT_EQ(c.node_label, "rack1");
  EXPECT_EQ(c.data_roots, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_TRUE(c.insecure);
  EXPECT_EQ(c.advertise_host, "127.0.0.1");  // Not given: the default.
  EXPECT_EQ(c.fabric_flag, "auto");
  TempDir dir;
  WorkerConfig valid = Valid(dir);
  valid.grace_period_s = 2.5;
  ASSERT_TRUE(valid.Validate().ok());
  EXPECT_EQ(valid.grace_period.count(), 2500);  // Derived by Validate.
}

// Each bounded setting refuses a value past its range, naming the flag, the value and the fix.
struct RefusesOutOfRange {
  const TempDir* dir;
  int bounded = 0;
  template <class T>
  void Field(const config::Setting& s, T WorkerConfig::*member) {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      if (!s.bounded) return;
      ++bounded;
      const double past = std::isfinite(s.hi) ? s.hi * 2 + 1 : s.lo - 1;
      WorkerConfig c = Valid(*dir);
      c.*member = static_cast<T>(past);
      absl::Status st = c.Validate();
      EXPECT_TRUE(absl::StrContains(
          st.message(),
          absl::StrCat(s.PrimaryFlag(), ": ", c.*member, " is out of range (use ", s.fix, ")")))
          << s.key << ": " << st;
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!s.required) return;
      WorkerConfig c = Valid(*dir);
      c.*member = "";
      absl::Status st = c.Validate();
      EXPECT_TRUE(absl::StrContains(st.message(), absl::StrCat(s.PrimaryFlag(), ": empty (")))
          << s.key << ": " << st;
    }
  }
};

TEST(WorkerSettingsTest, EachBoundedOrRequiredSettingIsRefusedWithItsFlagAndFix) {
  TempDir dir;
  WorkerConfig valid = Valid(dir);
  ASSERT_TRUE(valid.Validate().ok()) << valid.Validate();
  RefusesOutOfRange visitor{&dir};
  WorkerSettings{}(visitor);
  EXPECT_GE(visitor.bounded, 4);
}

// docs/OPERATIONS.md "### Workers": a row per flag, in the list's order, with its default.
TEST(WorkerSettingsTest, TheDocsTableHasARowPerFlagInOrderWithItsDefault) {
  const std::string path = testing::SourcePath("docs/OPERATIONS.md");
  ASSERT_FALSE(path.empty()) << "$ULYSSES_SOURCE_DIR is unset (run through ctest)";
  const std::vector<std::pair<std::string, std::string>> documented =
      testing::DocTableNameAndDefault(path, "### Workers");
  EXPECT_EQ(documented, config::DefaultsTable<WorkerConfig>(WorkerSettings{}, /*by_flag=*/true));
}

}  // namespace
}  // namespace ulysses::agent
