#include "coordinator/backup.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "coordinator/state_lock.h"
#include "coordinator/store.h"

namespace ulysses::coordinator {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// An open connection, closed on scope exit.
struct Db {
  sqlite3* db = nullptr;
  ~Db() { sqlite3_close(db); }
  std::string error() const { return db ? sqlite3_errmsg(db) : "out of memory"; }
};

absl::Status Exec(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat(sql, ": ", msg));
  }
  return absl::OkStatus();
}

// The rows of a one-column query as text (at most `limit`).
absl::StatusOr<std::vector<std::string>> Column(sqlite3* db, const std::string& sql,
                                                int limit = 1) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    std::string msg = sqlite3_errmsg(db);
    sqlite3_finalize(stmt);
    return absl::InternalError(msg);
  }
  std::vector<std::string> rows;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW && static_cast<int>(rows.size()) < limit) {
    const unsigned char* text = sqlite3_column_text(stmt, 0);
    rows.emplace_back(text ? reinterpret_cast<const char*>(text) : "");
  }
  std::string msg = sqlite3_errmsg(db);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return absl::InternalError(msg);
  return rows;
}

absl::Status FsyncPath(const std::string& path, bool directory) {
  int fd = open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDWR) | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot fsync \"", path, "\" (", std::strerror(err), ")"));
  }
  close(fd);
  return absl::OkStatus();
}

// Creates `path` empty with mode 0600 (replacing a leftover).
absl::Status CreatePrivate(const std::string& path) {
  unlink(path.c_str());
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create \"", path, "\" (", std::strerror(errno), "; check the path)"));
  }
  close(fd);
  return absl::OkStatus();
}

std::string ParentDir(const std::string& path) {
  std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

std::string StorePath(const std::string& state_dir) { return state_dir + "/coordinator.db"; }

absl::StatusOr<BackupInfo> VerifyBackup(const std::string& file) {
  const auto start = Clock::now();
  auto refuse = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("\"", file, "\" is not a usable backup: ", why));
  };
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) return refuse(absl::StrCat("cannot read it (", ec.message(), "; check the path)"));
  if (size == 0) return refuse("it is empty (take a new backup)");
  {
    char header[16] = {0};
    std::ifstream in(file, std::ios::binary);
    in.read(header, sizeof(header));
    if (!in || std::memcmp(header, "SQLite format 3", 16) != 0) {
      return refuse("it is not an SQLite database (bad header; take a new backup)");
    }
  }
  Db db;
  // immutable: read the file as it is (no -wal/-shm beside it is consulted or created).
  std::string uri = "file:";
  for (const char c : file) {  // URI-escape what SQLite would read as query or escape.
    if (c == '%' || c == '?' || c == '#') {
      absl::StrAppendFormat(&uri, "%%%02X", static_cast<int>(static_cast<unsigned char>(c)));
    } else {
      uri.push_back(c);
    }
  }
  uri += "?immutable=1";
  if (sqlite3_open_v2(uri.c_str(), &db.db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) !=
      SQLITE_OK) {
    return refuse(absl::StrCat("SQLite cannot open it (", db.error(), ")"));
  }
  absl::StatusOr<std::vector<std::string>> check = Column(db.db, "PRAGMA integrity_check", 5);
  if (!check.ok()) {
    return refuse(absl::StrCat("integrity_check failed (", check.status().message(),
                               "; the file is corrupt: use another backup)"));
  }
  if (check->empty() || (*check)[0] != "ok") {
    return refuse(absl::StrCat("integrity_check failed (", absl::StrJoin(*check, "; "),
                               "; the file is corrupt: use another backup)"));
  }
  absl::StatusOr<std::vector<std::string>> version =
      Column(db.db, "SELECT value FROM meta WHERE key='schema_version'");
  if (!version.ok() || version->empty()) {
    return refuse("it has no schema_version in a meta table (not a ulysses-coordinator store)");
  }
  BackupInfo info;
  info.path = file;
  info.bytes = static_cast<int64_t>(size);
  info.schema_version = std::atoi((*version)[0].c_str());
  if (info.schema_version < 1) {
    return refuse(absl::StrCat("schema version \"", (*version)[0], "\" is not valid"));
  }
  if (info.schema_version > kSchemaVersion) {
    return refuse(absl::StrCat("schema version ", info.schema_version,
                               " is newer than this coordinator's ", kSchemaVersion,
                               " (restore it with the ulysses-coordinator that wrote it)"));
  }
  absl::StatusOr<std::vector<std::string>> jobs = Column(db.db, "SELECT count(*) FROM jobs");
  if (!jobs.ok() || jobs->empty()) {
    return refuse("it has no jobs table (not a ulysses-coordinator store)");
  }
  info.jobs = std::atoll((*jobs)[0].c_str());
  info.seconds = SecondsSince(start);
  return info;
}

absl::StatusOr<BackupInfo> CopyVerified(sqlite3* src, const std::string& source_name,
                                        const std::string& to) {
  const auto start = Clock::now();
  if (to.empty()) return absl::InvalidArgumentError("--to: empty (give the backup file's path)");
  const std::string tmp = to + ".tmp";
  RETURN_IF_ERROR(CreatePrivate(tmp));
  auto fail = [&](absl::Status s) {
    unlink(tmp.c_str());
    return s;
  };
  {
    Db dst;
    if (sqlite3_open_v2(tmp.c_str(), &dst.db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("cannot open \"", tmp, "\" (", dst.error(), ")")));
    }
    sqlite3_backup* backup = sqlite3_backup_init(dst.db, "main", src, "main");
    if (backup == nullptr) {
      return fail(
          absl::InternalError(absl::StrCat("backup of \"", source_name, "\": ", dst.error())));
    }
    // All pages in one step: one read transaction, so the copy is one committed state. A
    // writer holding the file briefly (checkpoint) gives BUSY/LOCKED: retry for a while.
    int rc = SQLITE_OK;
    for (int tries = 0; tries < 200; ++tries) {
      rc = sqlite3_backup_step(backup, -1);
      if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    sqlite3_backup_finish(backup);
    if (rc != SQLITE_DONE) {
      return fail(absl::UnavailableError(absl::StrCat("backup of \"", source_name, "\" failed (",
                                                      sqlite3_errstr(rc), "); try again")));
    }
    if (absl::Status s = Exec(dst.db, "PRAGMA journal_mode=DELETE"); !s.ok()) return fail(s);
  }
  absl::StatusOr<BackupInfo> info = VerifyBackup(tmp);
  if (!info.ok()) return fail(info.status());
  if (absl::Status s = FsyncPath(tmp, false); !s.ok()) return fail(s);
  if (std::rename(tmp.c_str(), to.c_str()) != 0) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("cannot rename \"", tmp, "\" to \"", to, "\" (", std::strerror(errno), ")")));
  }
  RETURN_IF_ERROR(FsyncPath(ParentDir(to), true));
  info->path = to;
  info->seconds = SecondsSince(start);
  return info;
}

absl::StatusOr<BackupInfo> BackupStore(const std::string& state_dir, const std::string& to) {
  const std::string from = StorePath(state_dir);
  if (!fs::exists(from)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state dir \"", state_dir, "\" holds no coordinator.db (check --state-dir)"));
  }
  Db src;
  // Read-write without create: a WAL reader may need to create the -shm; nothing is written.
  if (sqlite3_open_v2(from.c_str(), &src.db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open \"", from, "\" (", src.error(), ")"));
  }
  sqlite3_busy_timeout(src.db, 5000);
  return CopyVerified(src.db, from, to);
}

std::string MigrationBackupPath(const std::string& store_path, int from_version) {
  return absl::StrCat(store_path, ".schema-v", from_version, ".bak");
}

absl::StatusOr<std::string> NewestMigrationBackup(const std::string& state_dir) {
  std::string best;
  fs::file_time_type best_time;
  std::error_code ec;
  const std::string prefix = "coordinator.db.schema-v";
  for (const auto& entry : fs::directory_iterator(state_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() < 4 ||
        name.compare(name.size() - 4, 4, ".bak") != 0) {
      continue;
    }
    const auto t = entry.last_write_time(ec);
    if (best.empty() || t > best_time) {
      best = entry.path().string();
      best_time = t;
    }
  }
  if (best.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--rollback-to-backup: \"", state_dir,
        "\" holds no coordinator.db.schema-v<N>.bak (a coordinator writes one before it "
        "migrates the schema; restore an older backup with --from instead)"));
  }
  return best;
}

absl::StatusOr<BackupInfo> RestoreStore(const std::string& from, const std::string& state_dir,
                                        bool force) {
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(BackupInfo info, VerifyBackup(from));
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir \"", state_dir, "\": cannot create (", ec.message(), ")"));
  }
  // Never under a live coordinator: it would keep writing to the store moved aside.
  absl::StatusOr<std::unique_ptr<StateDirLock>> lock =
      StateDirLock::Acquire(state_dir, "ulysses restore");
  if (!lock.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("restore: ", lock.status().message(),
                     " (a running coordinator keeps writing to its store: stop it, then restore)"));
  }
  const std::string dst = StorePath(state_dir);
  const bool held = fs::exists(dst) || fs::exists(dst + "-wal");
  if (held && !force) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--state-dir \"", state_dir,
        "\" already holds a store (coordinator.db); restore into an empty directory, or pass "
        "--force to replace it (the old store is kept as coordinator.db.before-restore-<ms>)"));
  }
  const std::string tmp = dst + ".restore.tmp";
  RETURN_IF_ERROR(CreatePrivate(tmp));
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot copy \"", from, "\" to \"", tmp, "\" (", ec.message(), ")"));
  }
  // copy_file copies the backup's mode (often 0644): the store is owner-only.
  if (chmod(tmp.c_str(), 0600) != 0) {
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make \"", tmp, "\" owner-only (", std::strerror(errno), ")"));
  }
  if (absl::Status s = FsyncPath(tmp, false); !s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  if (held) {
    const std::string aside =
        absl::StrCat(dst, ".before-restore-", absl::ToUnixMillis(absl::Now()));
    for (const char* suffix : {"", "-wal"}) {
      const std::string old = dst + suffix;
      if (fs::exists(old) && std::rename(old.c_str(), (aside + suffix).c_str()) != 0) {
        unlink(tmp.c_str());
        return absl::FailedPreconditionError(
            absl::StrCat("cannot move the old \"", old, "\" aside (", std::strerror(errno), ")"));
      }
    }
    unlink((dst + "-shm").c_str());
  }
  if (std::rename(tmp.c_str(), dst.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rename \"", tmp, "\" to \"", dst, "\" (", std::strerror(err), ")"));
  }
  RETURN_IF_ERROR(FsyncPath(state_dir, true));
  info.path = dst;
  info.seconds = SecondsSince(start);
  return info;
}

}  // namespace ulysses::coordinator
