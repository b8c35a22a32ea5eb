// CoordinatorSettings (coordinator/config_fields.h): the one list the YAML reader, the flags,
// the per-field ranges and docs/COORDINATOR.md's defaults column derive from.
#include "coordinator/config_fields.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/settings_cli.h"
#include "coordinator/config.h"
#include "gtest/gtest.h"
#include "tests/testing/doc_table.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::coordinator {
namespace {

using ::ulysses::testing::TempDir;

// A YAML value of each member type, and what reading it must give.
template <class T>
std::pair<std::string, T> Sample() {
  if constexpr (std::is_same_v<T, std::string>) {
    return {"\"sample\"", "sample"};
  } else if constexpr (std::is_same_v<T, bool>) {
    return {"true", true};
  } else if constexpr (std::is_same_v<T, double>) {
    return {"7.5", 7.5};
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return {"[a, b]", {"a", "b"}};
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return {"[7, 8]", {7, 8}};
  } else {
    return {"7", T{7}};
  }
}

// Every setting's key reads from YAML into its own member, and has its flag.
struct ReadsItsMember {
  CLI::App* app;
  int fields = 0;
  template <class T>
  void Field(const config::Setting& s, T CoordinatorConfig::*member) {
    ++fields;
    CoordinatorConfig c;
    const auto [text, want] = Sample<T>();
    absl::Status st = ApplyConfigYaml(absl::StrCat(s.key, ": ", text, "\n"), &c);
    EXPECT_TRUE(st.ok()) << s.key << ": " << st;
    EXPECT_EQ(c.*member, want) << s.key;
    EXPECT_NE(app->get_option_no_throw(s.PrimaryFlag()), nullptr) << s.key << " has no flag";
  }
};

TEST(CoordinatorSettingsTest, EverySettingReadsFromYamlIntoItsMemberAndHasAFlag) {
  CLI::App app;
  config::FlagOverrides<CoordinatorConfig> flags;
  flags.AddTo(app, CoordinatorSettings{});
  ReadsItsMember visitor{&app};
  CoordinatorSettings{}(visitor);
  EXPECT_GE(visitor.fields, 40);
  CoordinatorConfig c;
  absl::Status st = ApplyConfigYaml("session_queues: [1]\n", &c);
  EXPECT_TRUE(absl::StrContains(st.message(), "config.session_queues: [1] has the wrong type"))
      << st;
}

// A flag sets its field only when given: 0 is a value (no -1 sentinel), and a field not
// given keeps the config file's value.
TEST(CoordinatorSettingsTest, AFlagOverridesTheFileOnlyWhenGivenAndZeroIsAValue) {
  CoordinatorConfig c;
  ASSERT_TRUE(ApplyConfigYaml("heartbeat_timeout_s: 20\nlost_after_s: 90\nsession_queues: 3\n"
                              "insecure: false\n",
                              &c)
                  .ok());
  CLI::App app;
  config::FlagOverrides<CoordinatorConfig> flags;
  flags.AddTo(app, CoordinatorSettings{});
  std::vector<std::string> args = {"--data-root", "/b",
                                   "--insecure",  "--lost-after-s",
                                   "0",           "--max-streams",
                                   "100",         "--non-preempting-priority",
                                   "5",           "--data-root",
                                   "/a"};
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector.
  app.parse(args);
  flags.ApplyTo(&c);
  EXPECT_EQ(c.heartbeat_timeout_s, 20);  // The file's.
  EXPECT_EQ(c.session_queues, 3);
  EXPECT_EQ(c.lost_after_s, 0);  // Given as 0: applied, then refused by validation.
  EXPECT_EQ(c.max_streams, 100);
  EXPECT_TRUE(c.insecure);
  EXPECT_EQ(c.data_roots, (std::vector<std::string>{"/b", "/a"}));
  EXPECT_EQ(c.non_preempting_priorities, (std::vector<int64_t>{5}));
  TempDir dir;
  c.state_dir = dir.path();
  absl::Status st = ValidateAndFinalize(&c);
  EXPECT_TRUE(absl::StrContains(st.message(), "lost_after_s: 0 is out of range")) << st;
}

// Each bounded setting refuses a value past its range with `<key>: <value> is out of range
// (use <fix>)`, and accepts its default.
struct RefusesOutOfRange {
  std::string state_dir;
  int bounded = 0;
  template <class T>
  void Field(const config::Setting& s, T CoordinatorConfig::*member) {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      if (!s.bounded) return;
      ++bounded;
      const double past = std::isfinite(s.hi) ? s.hi * 2 + 1 : s.lo - 1;
      CoordinatorConfig c;
      c.state_dir = state_dir;
      c.*member = static_cast<T>(past);
      absl::Status st = ValidateAndFinalize(&c);
      EXPECT_TRUE(absl::StrContains(
          st.message(), absl::StrCat(s.key, ": ", c.*member, " is out of range (use ", s.fix, ")")))
          << s.key << ": " << st;
    }
  }
};

TEST(CoordinatorSettingsTest, EachBoundedSettingRefusesAValuePastItsRangeWithItsFix) {
  TempDir dir;
  CoordinatorConfig defaults;
  defaults.state_dir = dir.path();
  ASSERT_TRUE(ValidateAndFinalize(&defaults).ok());
  RefusesOutOfRange visitor{dir.path()};
  CoordinatorSettings{}(visitor);
  EXPECT_GE(visitor.bounded, 20);
}

// docs/COORDINATOR.md's "Configuration" table: one row per setting, in the list's order, its
// default column what the list shows (the value, or the setting's Shown text). Rows of the
// sections (`metrics.*`, `quotas.*`) are the sections' own.
TEST(CoordinatorSettingsTest, TheDocsTableHasARowPerSettingInOrderWithItsDefault) {
  const std::string path = testing::SourcePath("docs/COORDINATOR.md");
  ASSERT_FALSE(path.empty()) << "$ULYSSES_SOURCE_DIR is unset (run through ctest)";
  std::vector<std::pair<std::string, std::string>> documented;
  for (auto& [key, shown] : testing::DocTableNameAndDefault(path, "## Configuration")) {
    if (!absl::StrContains(key, ".")) documented.emplace_back(key, shown);  // Not a section's.
  }
  EXPECT_EQ(documented, config::DefaultsTable<CoordinatorConfig>(CoordinatorSettings{}));
}

}  // namespace
}  // namespace ulysses::coordinator
