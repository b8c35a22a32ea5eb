// The inter-node transport a worker's GPUs have (docs/DEPLOY.md "Fabric between nodes"),
// detected once at start from what the pod was given: the RDMA devices (/dev/infiniband/uverbs*
// and their adapters' PCI vendor in sysfs), the NCCL network plugin on the library path, and the
// environment the fabric components set. The agent logs it, exports it as
// ulysses_worker_fabric_info{fabric} and reports it at registration; the coordinator does not
// spread a CUDA group over workers that have only sockets unless the job allows it.
#ifndef ULYSSES_WORKER_AGENT_FABRIC_H_
#define ULYSSES_WORKER_AGENT_FABRIC_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ulysses/v1/enum_names.h"  // v1::FabricName: "sockets", "efa", "tcpxo", "ib".
#include "ulysses/v1/types.pb.h"

namespace ulysses::agent {

// Where detection looks; FromProcess() is the real machine, tests point it at directories.
struct FabricProbe {
  std::string sys_root = "/sys";           // <sys_root>/class/infiniband/<dev>/device/vendor
  std::string dev_root = "/dev";           // <dev_root>/infiniband/uverbs<N>
  std::map<std::string, std::string> env;  // The process environment (the fields read).
  std::vector<std::string> library_dirs;   // $LD_LIBRARY_PATH's entries, then the system's.
  static FabricProbe FromProcess();
};

struct FabricReport {
  v1::Fabric fabric = v1::FABRIC_SOCKETS;
  std::string why;  // One line: what was found (or what was missing), for the log.
};

// The rules, first match wins:
//   tcpxo    NCCL_FASTRAK_IFNAME is set and a FasTrak plugin (libnccl-net.so) is on the path;
//   efa      a uverbs device of an Amazon adapter (PCI vendor 0x1d0f) and aws-ofi-nccl
//            (libnccl-net-ofi.so, or libnccl-net.so under an ofi-nccl directory) on the path;
//   ib       a uverbs device of another adapter (InfiniBand / RoCE HCA), libibverbs on the
//            path, and NCCL_IB_DISABLE not 1;
//   sockets  otherwise (with why: e.g. EFA devices but no aws-ofi-nccl).
// Names are v1::FabricName's (proto/ulysses/v1/enum_names.h).
FabricReport DetectFabric(const FabricProbe& probe);

// --fabric: auto (detect) | sockets | efa | tcpxo | ib; errors name the flag and the choices.
absl::StatusOr<v1::Fabric> ParseFabricFlag(const std::string& value, bool* detect);

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_FABRIC_H_
