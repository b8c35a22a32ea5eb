// The metrics catalogue: every metric a Ulysses binary exports, in one list. The
// binaries register their families from it (RegisterCounter & co. below look the name
// up, so a name missing here cannot be registered), docs/METRICS.md documents exactly
// these rows (tests/deploy checks name, type, labels and binary), and the dashboard and
// alert rules may only use names listed here (tests/deploy, through the
// `ulysses-metrics-catalog` dump). A binary's scrape exports exactly its rows
// (coordinator_grpc_test, worker_agent_test).
//
// Thread-safe: the catalogue is immutable after its first use.
#ifndef ULYSSES_COMMON_METRICS_CATALOG_H_
#define ULYSSES_COMMON_METRICS_CATALOG_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics/metrics.h"

namespace ulysses {
namespace metrics {

// Binary names as in docs/METRICS.md's "Binary" column.
inline constexpr char kCoordinatorBinary[] = "ulysses-coordinator";
inline constexpr char kWorkerBinary[] = "ulysses-worker";

struct MetricDef {
  std::string name;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> labels;    // In the order WithLabels() takes their values.
  std::string help;                   // The # HELP text.
  std::vector<std::string> binaries;  // Who exports it (kCoordinatorBinary, kWorkerBinary).
  std::vector<double> buckets;        // Histograms only.
};

// Every metric, sorted by name.
const std::vector<MetricDef>& Catalog();
// The metric called `name`; NotFound naming the catalogue file when there is none.
absl::StatusOr<const MetricDef*> FindMetric(absl::string_view name);
// The catalogue as JSON: [{"name","type","labels","binaries","help"}...] (the
// `ulysses-metrics-catalog` tool prints it for tests/deploy).
std::string CatalogJson();

// Registration from the catalogue: name, help, labels and buckets come from its row.
// NotFound if `name` is not in the catalogue, FailedPrecondition if its row has another
// type, else whatever Registry::Add* returns (AlreadyExists when registered twice).
absl::StatusOr<CounterFamily*> RegisterCounter(Registry* registry, absl::string_view name);
absl::StatusOr<GaugeFamily*> RegisterGauge(Registry* registry, absl::string_view name);
absl::StatusOr<HistogramFamily*> RegisterHistogram(Registry* registry, absl::string_view name);
// A label-less gauge computed at scrape time (Registry::AddCallbackGauge).
absl::Status RegisterCallbackGauge(Registry* registry, absl::string_view name,
                                   std::function<double()> fn);
// A labelled gauge computed at scrape time (Registry::AddCallbackGaugeFamily).
absl::Status RegisterCallbackGaugeFamily(Registry* registry, absl::string_view name,
                                         std::function<std::vector<CallbackSample>()> fn);

}  // namespace metrics
}  // namespace ulysses

#endif  // ULYSSES_COMMON_METRICS_CATALOG_H_
