#include "coordinator/auth/permissions.h"

namespace ulysses::coordinator::auth {
namespace {

struct Entry {
  Rpc rpc;
  const char* name;
  bool admin, user, viewer, worker;  // Who may call it.
};

// THE table. Keep docs/SECURITY.md ("Roles") in step with it.
constexpr Entry kTable[] = {
    // rpc                 name                                     admin user   viewer worker
    {Rpc::kSubmitJob, "/ulysses.v1.JobService/SubmitJob", true, true, false, false},
    {Rpc::kGetJob, "/ulysses.v1.JobService/GetJob", true, true, true, false},
    {Rpc::kListJobs, "/ulysses.v1.JobService/ListJobs", true, true, true, false},
    {Rpc::kCancelJob, "/ulysses.v1.JobService/CancelJob", true, true, false, false},
    {Rpc::kResumeJob, "/ulysses.v1.JobService/ResumeJob", true, true, false, false},
    {Rpc::kWatchJob, "/ulysses.v1.JobService/WatchJob", true, true, true, false},
    {Rpc::kGetJobLogs, "/ulysses.v1.JobService/GetJobLogs", true, true, true, false},
    {Rpc::kListWorkers, "/ulysses.v1.JobService/ListWorkers", true, true, true, false},
    {Rpc::kBackupState, "/ulysses.v1.JobService/BackupState", true, false, false, false},
    {Rpc::kRegister, "/ulysses.v1.WorkerService/Register", true, false, false, true},
    {Rpc::kSession, "/ulysses.v1.WorkerService/Session", true, false, false, true},
};

const Entry& Find(Rpc rpc) {
  for (const Entry& e : kTable) {
    if (e.rpc == rpc) return e;
  }
  return kTable[0];  // Unreachable: every Rpc has a row (permissions_test checks it).
}

}  // namespace

const char* RpcName(Rpc rpc) { return Find(rpc).name; }

bool RoleMayCall(Role role, Rpc rpc) {
  const Entry& e = Find(rpc);
  if (e.rpc != rpc) return false;
  switch (role) {
    case Role::kAdmin:
      return e.admin;
    case Role::kUser:
      return e.user;
    case Role::kViewer:
      return e.viewer;
    case Role::kWorker:
      return e.worker;
  }
  return false;
}

}  // namespace ulysses::coordinator::auth
