#include "worker/agent/fabric.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ulysses::agent {
namespace {

namespace fs = std::filesystem;

constexpr char kAmazonVendor[] = "0x1d0f";  // PCI vendor id of EFA adapters.
// Environment variables the rules read (nothing else is copied from the process).
constexpr const char* kEnvRead[] = {"LD_LIBRARY_PATH", "NCCL_FASTRAK_IFNAME", "NCCL_IB_DISABLE",
                                    "FI_PROVIDER", "NCCL_NET_PLUGIN"};

std::string Env(const FabricProbe& p, const std::string& name) {
  auto it = p.env.find(name);
  return it == p.env.end() ? "" : it->second;
}

// The first `<dir>/<name>` that exists, "" if none.
std::string FindLibrary(const FabricProbe& p, const std::string& name,
                        const std::string& dir_contains = "") {
  std::error_code ec;
  for (const std::string& dir : p.library_dirs) {
    if (!dir_contains.empty() && !absl::StrContains(dir, dir_contains)) continue;
    const fs::path path = fs::path(dir) / name;
    if (fs::exists(path, ec)) return path.string();
  }
  return "";
}

std::string ReadTrimmed(const fs::path& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return std::string(absl::StripAsciiWhitespace(s));
}

struct Adapters {
  int uverbs = 0;                   // /dev/infiniband/uverbs* the container has.
  std::vector<std::string> amazon;  // sysfs adapters with vendor 0x1d0f.
  std::vector<std::string> other;   // sysfs adapters of other vendors (Mellanox/NVIDIA ...).
};

Adapters FindAdapters(const FabricProbe& p) {
  Adapters a;
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(p.dev_root) / "infiniband", ec), end; !ec && it != end;
       it.increment(ec)) {
    if (absl::StartsWith(it->path().filename().string(), "uverbs")) ++a.uverbs;
  }
  ec.clear();
  for (fs::directory_iterator it(fs::path(p.sys_root) / "class" / "infiniband", ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string vendor = ReadTrimmed(it->path() / "device" / "vendor");
    (vendor == kAmazonVendor ? a.amazon : a.other).push_back(name);
  }
  return a;
}

}  // namespace

FabricProbe FabricProbe::FromProcess() {
  FabricProbe p;
  for (const char* name : kEnvRead) {
    if (const char* v = std::getenv(name); v != nullptr) p.env[name] = v;
  }
  for (absl::string_view dir : absl::StrSplit(Env(p, "LD_LIBRARY_PATH"), ':', absl::SkipEmpty())) {
    p.library_dirs.emplace_back(dir);
  }
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                          "/usr/lib", "/lib/x86_64-linux-gnu", "/lib64"}) {
    p.library_dirs.emplace_back(dir);
  }
  return p;
}

FabricReport DetectFabric(const FabricProbe& probe) {
  FabricReport r;
  if (!Env(probe, "NCCL_FASTRAK_IFNAME").empty()) {
    const std::string plugin = FindLibrary(probe, "libnccl-net.so");
    if (!plugin.empty()) {
      r.fabric = v1::FABRIC_TCPXO;
      r.why = absl::StrCat("GPUDirect-TCPXO: FasTrak plugin ", plugin, ", NICs ",
                           Env(probe, "NCCL_FASTRAK_IFNAME"));
      return r;
    }
  }
  const Adapters a = FindAdapters(probe);
  if (a.uverbs > 0 && !a.amazon.empty()) {
    std::string plugin = FindLibrary(probe, "libnccl-net-ofi.so");
    if (plugin.empty()) plugin = FindLibrary(probe, "libnccl-net.so", "ofi-nccl");
    if (!plugin.empty()) {
      r.fabric = v1::FABRIC_EFA;
      r.why = absl::StrCat("EFA: ", a.uverbs, " uverbs device(s), adapters ",
                           absl::StrJoin(a.amazon, ","), ", aws-ofi-nccl ", plugin);
      return r;
    }
    r.why = absl::StrCat("EFA adapters (", absl::StrJoin(a.amazon, ","),
                         ") but no aws-ofi-nccl (libnccl-net-ofi.so) on LD_LIBRARY_PATH: NCCL "
                         "would use TCP sockets between nodes");
    return r;
  }
  if (a.uverbs > 0 && !a.other.empty()) {
    if (Env(probe, "NCCL_IB_DISABLE") == "1") {
      r.why = absl::StrCat("HCAs ", absl::StrJoin(a.other, ","),
                           " present but NCCL_IB_DISABLE=1: TCP sockets between nodes");
      return r;
    }
    const std::string verbs = FindLibrary(probe, "libibverbs.so.1");
    if (!verbs.empty()) {
      r.fabric = v1::FABRIC_IB;
      r.why = absl::StrCat("InfiniBand/RoCE: ", a.uverbs, " uverbs device(s), HCAs ",
                           absl::StrJoin(a.other, ","), ", ", verbs);
      return r;
    }
    r.why = absl::StrCat("HCAs ", absl::StrJoin(a.other, ","),
                         " but no libibverbs.so.1 (rdma-core) on the library path: TCP sockets");
    return r;
  }
  if (!a.amazon.empty() || !a.other.empty()) {
    r.why =
        "RDMA adapters on the node but no /dev/infiniband/uverbs* in the container (no RDMA "
        "device resource requested): TCP sockets between nodes";
    return r;
  }
  r.why = "no RDMA device and no GPUDirect-TCPXO plugin: TCP sockets between nodes";
  return r;
}

absl::StatusOr<v1::Fabric> ParseFabricFlag(const std::string& value, bool* detect) {
  *detect = value == "auto";
  if (*detect) return v1::FABRIC_SOCKETS;
  for (v1::Fabric f : {v1::FABRIC_SOCKETS, v1::FABRIC_EFA, v1::FABRIC_TCPXO, v1::FABRIC_IB}) {
    if (value == v1::FabricName(f)) return f;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--fabric: \"", value, "\" is not a fabric; use auto (detect), sockets, efa, tcpxo or ib"));
}

}  // namespace ulysses::agent
