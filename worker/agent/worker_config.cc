#include "worker/agent/worker_config.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/net/host_port.h"
#include "common/process/cpu_share.h"
#include "common/spec/path_confine.h"
#include "worker/agent/devices.h"
#include "worker/agent/fabric.h"
#include "worker/agent/worker_config_fields.h"

namespace ulysses::agent {
namespace {

namespace fs = std::filesystem;

std::string DefaultEngineBin() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "ulysses-train";
  return (self.parent_path() / "ulysses-train").string();
}

std::vector<std::string> RootFlags(const WorkerConfig& c) {
  std::vector<std::string> out = c.data_roots;
  if (!c.checkpoint_root.empty()) out.push_back(c.checkpoint_root);
  return out;
}

}  // namespace

absl::Status WorkerConfig::Validate() {
  std::vector<std::string> errors;
  config::CheckSettings(*this, WorkerSettings{}, &errors, /*by_flag=*/true);  // Own ranges.
  if (coordinator.empty() || coordinator.find(':') == std::string::npos) {
    errors.push_back(absl::StrCat("--coordinator: \"", coordinator,
                                  "\" is not HOST:PORT (e.g. --coordinator 127.0.0.1:50051)"));
  }
  if (absl::StatusOr<std::vector<std::string>> parsed =
          ParseDevices(device, capacity, CountVisibleGpus());
      parsed.ok()) {
    devices = *std::move(parsed);
  } else {
    errors.emplace_back(parsed.status().message());
  }
  if (!work_dir.empty()) {
    std::error_code ec;
    fs::create_directories(work_dir, ec);
    if (ec) {
      errors.push_back(
          absl::StrCat("--work-dir: \"", work_dir, "\" cannot be created: ", ec.message()));
    } else {
      work_dir = fs::absolute(work_dir).string();
    }
  }
  for (const std::string& root : RootFlags(*this)) {
    if (absl::Status st = spec::CheckPathText("--checkpoint-root/--data-root", root); !st.ok()) {
      errors.emplace_back(st.message());
    }
  }
  if (engine_bin.empty()) engine_bin = DefaultEngineBin();
  if (access(engine_bin.c_str(), X_OK) != 0) {
    errors.push_back(
        absl::StrCat("--engine-bin: \"", engine_bin,
                     "\" is not an executable (build ulysses-train or pass its path)"));
  }
  if (!metrics_listen.empty()) {
    if (absl::StatusOr<net::HostPort> at =
            net::ParseHostPort("--metrics-listen", metrics_listen, "0.0.0.0:9091");
        !at.ok()) {
      errors.push_back(std::string(at.status().message()));
    }
  }
  if (!(peak_flops >= 0) || !std::isfinite(peak_flops)) {
    peak_flops_why = "invalid";  // The settings' range check names it.
  } else if (peak_flops > 0) {
    peak_flops_why = "set by --peak-flops";
  } else if (!devices.empty() && devices.front().rfind("cuda", 0) == 0) {
    const PeakFlops detected = PeakFlopsOfModels(GpuModels());
    peak_flops = detected.flops;
    peak_flops_why = detected.why;
  } else {
    peak_flops_why = "CPU slots: no MFU without --peak-flops";
  }
  {
    bool detect = false;
    absl::StatusOr<v1::Fabric> f = ParseFabricFlag(fabric_flag, &detect);
    if (!f.ok()) {
      errors.push_back(std::string(f.status().message()));
    } else if (detect) {
      const FabricReport report = DetectFabric(FabricProbe::FromProcess());
      fabric = report.fabric;
      fabric_why = report.why;
    } else {
      fabric = *f;
      fabric_why = "set by --fabric";
    }
  }
  if (grace_period_s >= 0 && std::isfinite(grace_period_s)) {
    grace_period = std::chrono::milliseconds(static_cast<int64_t>(grace_period_s * 1000));
  }
  if (!token.empty() && !token_file.empty()) {
    errors.push_back(absl::StrCat("--token-file: \"", token_file,
                                  "\" given with a token (--token or $ULYSSES_TOKEN): keep one"));
  } else if (!token_file.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(token_file, "--token-file");
    if (read.ok()) {
      token = *std::move(read);
    } else {
      errors.emplace_back(read.status().message());
    }
  }
  if (errors.empty()) {
    // The credential files and the loopback rule, checked now rather than at the first call.
    if (absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(Channel());
        !channel.ok()) {
      absl::string_view message = channel.status().message();
      // MakeChannel names ChannelOptions fields: say the flags instead.
      const bool server = absl::ConsumePrefix(&message, "server:");
      errors.push_back(absl::StrCat(server ? "--coordinator:" : "--", message));
    }
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
}

ChannelOptions WorkerConfig::Channel() const {
  ChannelOptions options;
  options.server = coordinator;
  options.ca_file = ca_file;
  options.cert_file = cert_file;
  options.key_file = key_file;
  options.token = token;
  options.insecure = insecure;
  return options;
}
}  // namespace ulysses::agent
