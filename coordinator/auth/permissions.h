// The role -> RPC permission table of ulysses-coordinator: the one place that says
// which role may call which RPC (docs/SECURITY.md mirrors it). Tenant scoping (a
// non-admin sees only its tenant's jobs) and worker-name rules (principal.h) are
// applied on top of it by the service and the coordinator.
#ifndef ULYSSES_COORDINATOR_AUTH_PERMISSIONS_H_
#define ULYSSES_COORDINATOR_AUTH_PERMISSIONS_H_

#include "coordinator/auth/principal.h"

namespace ulysses::coordinator::auth {

enum class Rpc {
  kSubmitJob,
  kGetJob,
  kListJobs,
  kCancelJob,
  kResumeJob,
  kWatchJob,
  kGetJobLogs,
  kListWorkers,
  kBackupState,
  kRegister,  // WorkerService/Register
  kSession,   // WorkerService/Session
};
inline constexpr Rpc kAllRpcs[] = {Rpc::kSubmitJob,  Rpc::kGetJob,      Rpc::kListJobs,
                                   Rpc::kCancelJob,  Rpc::kResumeJob,   Rpc::kWatchJob,
                                   Rpc::kGetJobLogs, Rpc::kListWorkers, Rpc::kBackupState,
                                   Rpc::kRegister,   Rpc::kSession};

// "/ulysses.v1.JobService/SubmitJob", ...
const char* RpcName(Rpc rpc);
// The table.
bool RoleMayCall(Role role, Rpc rpc);

}  // namespace ulysses::coordinator::auth

#endif  // ULYSSES_COORDINATOR_AUTH_PERMISSIONS_H_
