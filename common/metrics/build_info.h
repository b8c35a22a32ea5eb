// The `ulysses_build_info{version, git_sha}` gauge (always 1), the conventional way
// to export build metadata so dashboards can join on it.
//
// The version comes from the CMake project version; the git sha from the
// ULYSSES_GIT_SHA compile definition (set at configure time from `git rev-parse`
// or -DULYSSES_GIT_SHA=...), "unknown" when absent.
#ifndef ULYSSES_COMMON_METRICS_BUILD_INFO_H_
#define ULYSSES_COMMON_METRICS_BUILD_INFO_H_

#include <string>

#include "absl/status/status.h"
#include "common/metrics/metrics.h"

namespace ulysses {
namespace metrics {

inline constexpr char kBuildInfoMetric[] = "ulysses_build_info";

// e.g. "0.1.0".
std::string BuildVersion();
// Short git sha of the build, or "unknown".
std::string BuildGitSha();

// Registers ulysses_build_info in `registry` and sets it to 1. AlreadyExists if
// called twice on the same registry.
absl::Status RegisterBuildInfo(Registry* registry);

}  // namespace metrics
}  // namespace ulysses

#endif  // ULYSSES_COMMON_METRICS_BUILD_INFO_H_
