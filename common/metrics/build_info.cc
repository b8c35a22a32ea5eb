#include "common/metrics/build_info.h"

#include "common/metrics/catalog.h"
#include "common/status.h"

#ifndef ULYSSES_VERSION
#define ULYSSES_VERSION "unknown"
#endif
#ifndef ULYSSES_GIT_SHA
#define ULYSSES_GIT_SHA ""
#endif

namespace ulysses {
namespace metrics {

std::string BuildVersion() { return ULYSSES_VERSION; }

std::string BuildGitSha() {
  std::string sha = ULYSSES_GIT_SHA;
  return sha.empty() ? "unknown" : sha;
}

absl::Status RegisterBuildInfo(Registry* registry) {
  ASSIGN_OR_RETURN(GaugeFamily * family, RegisterGauge(registry, kBuildInfoMetric));
  family->WithLabels({BuildVersion(), BuildGitSha()})->Set(1);
  return absl::OkStatus();
}

}  // namespace metrics
}  // namespace ulysses
