#include "worker/agent/devices.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/spec/gpu_peaks.h"

namespace ulysses::agent {
namespace {

constexpr int kMaxSlots = 1024;  // The coordinator's bound on a worker's capacity.
constexpr char kFix[] =
    "use auto, cpu (with --capacity N for N CPU ranks), cuda:0-7 or cuda:0,cuda:1";

absl::Status Invalid(const std::string& spec, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--devices: \"", spec, "\" ", why, " (", kFix, ")"));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseDevices(const std::string& spec, int capacity,
                                                      int visible_gpus) {
  if (capacity < 0 || capacity > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("--capacity: ", capacity, " is outside 0..",
                                                   kMaxSlots, " (0 = one slot per device)"));
  }
  std::vector<std::string> out;
  if (spec == "auto") {
    for (int i = 0; i < visible_gpus; ++i) out.push_back(absl::StrCat("cuda:", i));
    if (out.empty()) out.assign(std::max(1, capacity), "cpu");
  } else if (spec == "cpu") {
    out.assign(std::max(1, capacity), "cpu");
    return out;
  } else {
    std::set<int> seen;
    for (absl::string_view item : absl::StrSplit(spec, ',')) {
      item = absl::StripAsciiWhitespace(item);
      if (!absl::ConsumePrefix(&item, "cuda:")) {
        return Invalid(spec, absl::StrCat("has \"", item, "\", which is not cuda:N or cuda:A-B"));
      }
      std::vector<absl::string_view> range = absl::StrSplit(item, '-');
      int first = -1;
      int last = -1;
      if (range.size() > 2 || !absl::SimpleAtoi(range[0], &first) ||
          !absl::SimpleAtoi(range.back(), &last) || first < 0 || last < first ||
          last >= kMaxSlots) {
        return Invalid(spec, absl::StrCat("has \"cuda:", item, "\", which is not a GPU index or ",
                                          "an increasing range of them"));
      }
      for (int i = first; i <= last; ++i) {
        if (!seen.insert(i).second) {
          return Invalid(spec, absl::StrCat("names cuda:", i, " twice"));
        }
        out.push_back(absl::StrCat("cuda:", i));
      }
    }
  }
  if (out.empty()) return Invalid(spec, "names no device");
  if (capacity != 0 && out.front() != "cpu" && capacity != static_cast<int>(out.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--capacity: ", capacity, " differs from the ", out.size(), " GPUs of --devices \"", spec,
        "\" (a worker runs one rank per GPU: leave --capacity out)"));
  }
  return out;
}

std::vector<std::string> GpuModels(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    std::ifstream in(entry.path() / "information");
    std::string line;
    int lines = 0;
    while (++lines <= 64 && std::getline(in, line)) {  // a few lines; bounded all the same
      absl::string_view v = line;
      if (!absl::ConsumePrefix(&v, "Model:")) continue;
      v = absl::StripAsciiWhitespace(v);
      if (!v.empty() && v.size() <= 128) out.emplace_back(v);
      break;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

PeakFlops PeakFlopsOfModels(const std::vector<std::string>& models) {
  if (models.empty())
    return {0, "no GPU model reported by the driver: no MFU without --peak-flops"};
  if (models.front() != models.back()) {
    return {0, absl::StrCat("GPUs of different models (", models.front(), ", ", models.back(),
                            "): pass --peak-flops for MFU")};
  }
  const std::optional<spec::GpuPeak> peak = spec::GpuPeakOf(models.front());
  if (!peak.has_value()) {
    return {0, absl::StrCat("GPU model \"", models.front(),
                            "\" is not in the peak table (common/spec/gpu_peaks.h): pass "
                            "--peak-flops for MFU")};
  }
  return {peak->bf16_dense_flops,
          absl::StrCat("dense bf16 peak of the ", peak->model, " (driver: \"", models.front(),
                       "\"); --peak-flops overrides")};
}

int CountVisibleGpus() {
  if (const char* env = std::getenv("CUDA_VISIBLE_DEVICES"); env != nullptr) {
    int n = 0;
    for (absl::string_view item : absl::StrSplit(env, ',')) {
      item = absl::StripAsciiWhitespace(item);
      // CUDA stops at the first invalid entry ("-1" hides every GPU).
      if (item.empty() || item[0] == '-') break;
      ++n;
    }
    return n;
  }
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    std::string name = entry.path().filename().string();
    int index = 0;
    if (name.rfind("nvidia", 0) == 0 && absl::SimpleAtoi(name.substr(6), &index)) ++n;
  }
  return n;
}

}  // namespace ulysses::agent
