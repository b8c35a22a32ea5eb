// Backup and restore of the coordinator's SQLite store (docs/OPERATIONS.md "Backup and
// restore").
//
// BackupStore copies <state_dir>/coordinator.db with SQLite's online backup API: one read
// transaction over the whole file, so the copy is the state after some commit, while the
// running coordinator keeps committing (WAL: a reader does not block the writer). The copy
// is written to <to>.tmp (mode 0600), switched to journal_mode=DELETE (one self-contained
// file), checked like a restore would check it, fsynced and renamed over <to>.
//
// VerifyBackup opens a file read-only and checks it is a coordinator store this binary can
// run: PRAGMA integrity_check says "ok", meta.schema_version is 1..kSchemaVersion.
//
// RestoreStore verifies the file first, then puts it in place as <state_dir>/coordinator.db
// (copy to a temporary in the same directory, fsync, rename, fsync the directory). A state
// dir already holding a store is refused unless `force`; with `force` the old store (and
// its -wal/-shm) is kept aside as coordinator.db.before-restore-<unix ms>. Never run it
// against the state dir of a running coordinator.
#ifndef ULYSSES_COORDINATOR_BACKUP_H_
#define ULYSSES_COORDINATOR_BACKUP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct sqlite3;

namespace ulysses::coordinator {

struct BackupInfo {
  std::string path;        // The file written or checked.
  int64_t bytes = 0;       // Its size.
  int schema_version = 0;  // meta.schema_version.
  int64_t jobs = 0;        // Rows of `jobs`.
  double seconds = 0;      // Time taken (backup or verification).
};

// The store file of a state dir.
std::string StorePath(const std::string& state_dir);

absl::StatusOr<BackupInfo> BackupStore(const std::string& state_dir, const std::string& to);

// FailedPrecondition naming the file, what is wrong and the fix.
absl::StatusOr<BackupInfo> VerifyBackup(const std::string& file);

absl::StatusOr<BackupInfo> RestoreStore(const std::string& from, const std::string& state_dir,
                                        bool force);

// Upgrades: before Store::Open migrates a file of schema `from_version` it copies it (the
// same online backup, verified) to MigrationBackupPath(store, from_version), i.e.
// <state_dir>/coordinator.db.schema-v<from>.bak, replacing an older one of that version.
std::string MigrationBackupPath(const std::string& store_path, int from_version);
// The newest such file in `state_dir` (`restore --rollback-to-backup`), or
// FailedPrecondition naming what is missing.
absl::StatusOr<std::string> NewestMigrationBackup(const std::string& state_dir);
// Copies the open database `src` (named `source_name` in messages) to `to` as above.
absl::StatusOr<BackupInfo> CopyVerified(sqlite3* src, const std::string& source_name,
                                        const std::string& to);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_BACKUP_H_
