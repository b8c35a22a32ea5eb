// The catalogue itself: every row is a valid registration, names are unique and sorted,
// every row names an exporting binary, and registration by name takes the row's help,
// labels and type (a name outside the catalogue, or the wrong type, is refused).
#include "common/metrics/catalog.h"

#include <set>

#include "gtest/gtest.h"

namespace ulysses::metrics {
namespace {

TEST(CatalogTest, EveryRowRegistersOnceInOneRegistry) {
  Registry registry;
  std::set<std::string> names;
  for (const MetricDef& def : Catalog()) {
    EXPECT_TRUE(names.insert(def.name).second) << def.name << " twice";
    EXPECT_FALSE(def.binaries.empty()) << def.name << " names no binary";
    for (const std::string& b : def.binaries) {
      EXPECT_TRUE(b == kCoordinatorBinary || b == kWorkerBinary) << def.name << ": " << b;
    }
    absl::Status s;
    switch (def.type) {
      case MetricType::kCounter:
        s = RegisterCounter(&registry, def.name).status();
        break;
      case MetricType::kGauge:
        s = RegisterGauge(&registry, def.name).status();
        break;
      case MetricType::kHistogram:
        EXPECT_FALSE(def.buckets.empty()) << def.name;
        s = RegisterHistogram(&registry, def.name).status();
        break;
    }
    EXPECT_TRUE(s.ok()) << def.name << ": " << s;
  }
  EXPECT_EQ(registry.Collect().size(), Catalog().size());
  EXPECT_TRUE(
      std::is_sorted(Catalog().begin(), Catalog().end(),
                     [](const MetricDef& a, const MetricDef& b) { return a.name < b.name; }));
}

TEST(CatalogTest, RegistrationTakesTheRowAndRefusesOthers) {
  Registry registry;
  auto loss = RegisterGauge(&registry, "ulysses_eval_accuracy");
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ((*loss)->label_names(), (std::vector<std::string>{"job_id", "stage"}));
  (*loss)->WithLabels({"j1", "0"})->Set(0.5);
  EXPECT_NE(registry.Serialize().find("# HELP ulysses_eval_accuracy Latest retrieval"),
            std::string::npos)
      << registry.Serialize();

  auto missing = RegisterGauge(&registry, "ulysses_not_in_the_catalogue");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("common/metrics/catalog.cc"), std::string::npos);
  auto wrong = RegisterCounter(&registry, "ulysses_train_loss");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find("is a gauge"), std::string::npos);
  EXPECT_EQ(RegisterCallbackGauge(&registry, "ulysses_jobs", [] { return 1.0; }).code(),
            absl::StatusCode::kFailedPrecondition);  // Labelled: needs the family variant.
}

TEST(CatalogTest, JsonListsEveryRow) {
  const std::string json = CatalogJson();
  for (const MetricDef& def : Catalog()) {
    EXPECT_NE(json.find("\"" + def.name + "\""), std::string::npos) << def.name;
  }
  EXPECT_NE(json.find("\"binaries\""), std::string::npos);
}

TEST(FamilyRemoveIfTest, RemovesOnlyMatchingSeries) {
  Registry registry;
  auto eval = RegisterGauge(&registry, "ulysses_eval_loss");
  ASSERT_TRUE(eval.ok());
  (*eval)->WithLabels({"j1", "0"})->Set(1);
  (*eval)->WithLabels({"j1", "1"})->Set(2);
  (*eval)->WithLabels({"j2", "0"})->Set(3);
  EXPECT_EQ((*eval)->RemoveIf([](const std::vector<std::string>& v) { return v[0] == "j1"; }), 2u);
  EXPECT_EQ((*eval)->size(), 1u);
  EXPECT_NE(registry.Serialize().find("job_id=\"j2\""), std::string::npos);
  EXPECT_EQ(registry.Serialize().find("job_id=\"j1\""), std::string::npos);
}

}  // namespace
}  // namespace ulysses::metrics
