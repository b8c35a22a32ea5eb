// The JobService BackupState stream (admin only; docs/OPERATIONS.md "Backup and restore"):
// BackupStore (backup.h) of the coordinator's state dir into a private temporary file there,
// which is unlinked at once (the open descriptor keeps it readable) and streamed in order in
// chunks of at most 1 MiB, each carrying the file's size, schema version and job count.
#ifndef ULYSSES_COORDINATOR_BACKUP_SERVICE_H_
#define ULYSSES_COORDINATOR_BACKUP_SERVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/auth/principal.h"
#include "grpcpp/grpcpp.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::coordinator {

// A reactor that deletes itself when done; `caller` is the authorization's result (an error
// ends the stream with it).
grpc::ServerWriteReactor<v1::BackupStateChunk>* NewBackupReactor(
    const absl::StatusOr<auth::Principal>& caller, const std::string& state_dir);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_BACKUP_SERVICE_H_
