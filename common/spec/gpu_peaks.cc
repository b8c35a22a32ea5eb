#include "common/spec/gpu_peaks.h"

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace ulysses::spec {
namespace {

struct Row {
  GpuPeak peak;
  // Every one of these (upper case) appears in the driver's name; the first row that
  // matches wins, so the more specific variants come first.
  std::vector<const char*> all_of;
};

const std::vector<Row>& Rows() {
  static const std::vector<Row>* rows = new std::vector<Row>{
      {{"H100 PCIe", 756e12}, {"H100", "PCIE"}},
      {{"H100 NVL", 835e12}, {"H100", "NVL"}},
      {{"H100 SXM", 989e12}, {"H100"}},  // "NVIDIA H100 80GB HBM3"
      {{"GH200", 989e12}, {"GH200"}},    // before H200, whose name it contains
      {{"H200", 989e12}, {"H200"}},      // "NVIDIA H200", "NVIDIA H200 NVL" (same dies)
      {{"GB200", 2500e12}, {"GB200"}},   // before B200
      {{"B200", 2250e12}, {"B200"}},
      {{"A100", 312e12}, {"A100"}},  // SXM4 and PCIe, 40 and 80 GB
      {{"L40S", 362e12}, {"L40S"}},
  };
  return *rows;
}

}  // namespace

const std::vector<GpuPeak>& GpuPeaks() {
  static const std::vector<GpuPeak>* peaks = [] {
    auto* out = new std::vector<GpuPeak>;
    for (const Row& r : Rows()) out->push_back(r.peak);
    return out;
  }();
  return *peaks;
}

std::optional<GpuPeak> GpuPeakOf(std::string_view driver_name) {
  const std::string name = absl::AsciiStrToUpper(std::string(driver_name));
  for (const Row& r : Rows()) {
    bool all = true;
    for (const char* part : r.all_of) all = all && absl::StrContains(name, part);
    if (all) return r.peak;
  }
  return std::nullopt;
}

const GpuPeak& GpuPeakNamed(std::string_view model) {
  for (const GpuPeak& p : GpuPeaks()) {
    if (model == p.model) return p;
  }
  std::abort();
}

}  // namespace ulysses::spec
