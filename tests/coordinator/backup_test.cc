// Backup, restore and the upgrade rollback point of the coordinator's store
// (coordinator/backup.h) on real SQLite files: a backup taken while another connection keeps
// committing is one consistent committed state; restore refuses corrupt or foreign files and
// occupied state dirs with the reason; opening a store of the previous schema backs it up
// before migrating, and restoring that backup rolls the upgrade back.
#include "coordinator/backup.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/state_lock.h"
#include "coordinator/store.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"
#include "tests/testing/files.h"

namespace ulysses::coordinator {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

JobRecord Job(int64_t number) {
  JobRecord j;
  j.id = absl::StrFormat("job-%06d", number);
  j.number = number;
  j.name = "demo";
  j.spec_yaml = "apiVersion: ulysses/v1\n";
  j.state = v1::JOB_STATE_PENDING;
  j.reason = "queued";
  j.created_ms = 1000 + number;
  StageRecord s0;
  s0.index = 0;
  s0.steps = 10;
  j.stages.push_back(s0);
  return j;
}

int64_t Jobs(const std::string& state_dir) {
  auto store = Store::Open(state_dir);
  if (!store.ok()) return -1;
  auto snap = (*store)->Load();
  return snap.ok() ? static_cast<int64_t>(snap->jobs.size()) : -1;
}

void WriteJobs(Store& store, int64_t first, int64_t count) {
  Store::Batch b;
  for (int64_t n = first; n < first + count; ++n) b.jobs.push_back(Job(n));
  ASSERT_TRUE(store.Write(b).ok());
}

void Sql(const std::string& file, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(file.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

TEST(BackupTest, ABackupWhileCommitsContinueIsOneCommittedStateAndRestoresIntoAnEmptyDir) {
  TempDir dir;
  const std::string state = dir.path() + "/state";
  auto store = Store::Open(state);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_NO_FATAL_FAILURE(WriteJobs(**store, 1, 50));
  // Another connection commits batches of 10 jobs while backups are taken: every backup
  // holds a whole number of batches.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> written{50};
  std::thread writer([&] {
    for (int64_t n = 51; !stop && n < 5000; n += 10) {
      WriteJobs(**store, n, 10);
      written = n + 9;
    }
  });
  std::vector<int64_t> counts;
  for (int i = 0; i < 5; ++i) {
    const std::string to = absl::StrCat(dir.path(), "/b", i, ".db");
    absl::StatusOr<BackupInfo> info = BackupStore(state, to);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->schema_version, kSchemaVersion);
    EXPECT_EQ(info->bytes, static_cast<int64_t>(fs::file_size(to)));
    EXPECT_EQ((fs::status(to).permissions() & fs::perms::others_read), fs::perms::none);
    EXPECT_FALSE(fs::exists(to + ".tmp"));
    EXPECT_FALSE(fs::exists(to + "-wal")) << "a backup is one self-contained file";
    counts.push_back(info->jobs);
  }
  stop = true;
  writer.join();
  for (int64_t c : counts) {
    EXPECT_GE(c, 50);
    EXPECT_LE(c, written.load());
    EXPECT_EQ(c % 10, 0) << "a backup holds part of a transaction";
  }
  // Restore the last one into a new state dir: the store opens with those jobs.
  const std::string restored = dir.path() + "/restored";
  absl::StatusOr<BackupInfo> r = RestoreStore(absl::StrCat(dir.path(), "/b4.db"), restored, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->path, restored + "/coordinator.db");
  EXPECT_EQ(Jobs(restored), counts.back());
}

TEST(BackupTest, RestoreRefusesAnOccupiedStateDirUnlessForcedAndKeepsTheOldStoreAside) {
  TempDir dir;
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  {
    auto store = Store::Open(a);
    ASSERT_TRUE(store.ok());
    ASSERT_NO_FATAL_FAILURE(WriteJobs(**store, 1, 3));
  }
  {
    auto store = Store::Open(b);
    ASSERT_TRUE(store.ok());
    ASSERT_NO_FATAL_FAILURE(WriteJobs(**store, 1, 7));
  }
  const std::string backup = dir.path() + "/a.bak";
  ASSERT_TRUE(BackupStore(a, backup).ok());
  absl::StatusOr<BackupInfo> refused = RestoreStore(backup, b, false);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "already holds a store"))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--force")) << refused.status();
  EXPECT_EQ(Jobs(b), 7) << "a refused restore changed the state dir";
  ASSERT_TRUE(RestoreStore(backup, b, true).ok());
  EXPECT_EQ(Jobs(b), 3);
  int kept = 0;
  for (const auto& e : fs::directory_iterator(b)) {
    kept += absl::StrContains(e.path().filename().string(), "coordinator.db.before-restore-") &&
            !absl::EndsWith(e.path().string(), "-wal");
  }
  EXPECT_EQ(kept, 1) << "the replaced store was not kept aside";
}

// The finding: `restore --force` into a running coordinator's state dir succeeded while the
// coordinator kept writing to the moved file, and the restored db kept the backup's 0644 until
// the next start. Now the restore needs the state dir's lock (state_lock.h), which a live
// coordinator holds, and the restored store is 0600 at once.
TEST(BackupTest, RestoreRefusesALiveCoordinatorsStateDirAndLeavesTheStoreOwnerOnly) {
  TempDir dir;
  const std::string a = dir.path() + "/a", live = dir.path() + "/live";
  {
    auto store = Store::Open(a);
    ASSERT_TRUE(store.ok());
    ASSERT_NO_FATAL_FAILURE(WriteJobs(**store, 1, 3));
  }
  const std::string backup = dir.path() + "/a.bak";
  ASSERT_TRUE(BackupStore(a, backup).ok());
  ASSERT_EQ(chmod(backup.c_str(), 0644), 0);
  {
    auto store = Store::Open(live);
    ASSERT_TRUE(store.ok());
    ASSERT_NO_FATAL_FAILURE(WriteJobs(**store, 1, 7));
  }
  {
    auto coordinator = StateDirLock::Acquire(live, "ulysses-coordinator");  // As it does.
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    absl::StatusOr<BackupInfo> refused = RestoreStore(backup, live, /*force=*/true);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                  absl::StrCat("is in use by ulysses-coordinator pid ", getpid())))
        << refused.status();
    EXPECT_EQ(Jobs(live), 7) << "a refused restore changed the state dir";
    // A second coordinator on the same directory is refused the same way.
    EXPECT_FALSE(StateDirLock::Acquire(live, "ulysses-coordinator").ok());
  }
  ASSERT_TRUE(RestoreStore(backup, live, /*force=*/true).ok());  // Stopped: the lock is free.
  EXPECT_EQ(Jobs(live), 3);
  struct stat st;
  ASSERT_EQ(stat((live + "/coordinator.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(BackupTest, CorruptTruncatedForeignAndNewerFilesAreRefusedWithTheReason) {
  TempDir dir;
  const std::string state = dir.path() + "/state";
  {
    auto store = Store::Open(state);
    ASSERT_TRUE(store.ok());
    ASSERT_NO_FATAL_FAILURE(WriteJobs(**store, 1, 400));  // Several pages of jobs.
  }
  const std::string good = dir.path() + "/good.db";
  ASSERT_TRUE(BackupStore(state, good).ok());
  std::string bytes = ::ulysses::testing::ReadFile(good);
  ASSERT_GT(bytes.size(), 8u * 4096);
  auto write = [&](const std::string& name, const std::string& content) {
    const std::string path = dir.path() + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  };
  struct Case {
    std::string name, content, reason;
  };
  std::string garbage_page = bytes;
  for (size_t i = 4096 * 2; i < 4096 * 3; ++i) garbage_page[i] = static_cast<char>(i * 7);
  std::string bad_header = bytes;
  bad_header.replace(0, 6, "NOTSQL");
  std::vector<Case> cases = {
      {"page.db", garbage_page, "integrity_check failed"},
      {"truncated.db", bytes.substr(0, bytes.size() / 2), "integrity_check failed"},
      {"header.db", bad_header, "not an SQLite database"},
      {"empty.db", "", "it is empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = write(c.name, c.content);
    const std::string target = dir.path() + "/into-" + c.name;
    absl::StatusOr<BackupInfo> r = RestoreStore(path, target, false);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.reason)) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), path)) << r.status();
    EXPECT_FALSE(fs::exists(target + "/coordinator.db")) << "a refused file was put in place";
  }
  // A valid SQLite file that is not a coordinator store, and one of a newer schema.
  const std::string foreign = dir.path() + "/foreign.db";
  ASSERT_NO_FATAL_FAILURE(Sql(foreign, "CREATE TABLE t(x)"));
  absl::StatusOr<BackupInfo> r = VerifyBackup(foreign);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "not a ulysses-coordinator store"))
      << r.status();
  const std::string newer = dir.path() + "/newer.db";
  fs::copy_file(good, newer);
  ASSERT_NO_FATAL_FAILURE(Sql(newer, absl::StrCat("UPDATE meta SET value='", kSchemaVersion + 1,
                                                  "' WHERE key='schema_version'")));
  r = VerifyBackup(newer);
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                absl::StrCat("schema version ", kSchemaVersion + 1,
                                             " is newer than this coordinator's ", kSchemaVersion)))
      << r.status();
  EXPECT_TRUE(VerifyBackup(good).ok());
}

// A store of the previous schema version (made from a current one by dropping what the
// last migration added) is backed up before Store::Open migrates it; restoring that
// backup (restore --rollback-to-backup) gives the previous version's file back, which the
// previous coordinator would open.
TEST(BackupTest, AnUpgradeBacksUpThePreviousSchemaAndRollingBackRestoresIt) {
  TempDir dir;
  const std::string state = dir.path() + "/state";
  {
    auto store = Store::Open(state);
    ASSERT_TRUE(store.ok());
    ASSERT_NO_FATAL_FAILURE(WriteJobs(**store, 1, 5));
  }
  const int previous = kSchemaVersion - 1;
  ASSERT_NO_FATAL_FAILURE(Sql(state + "/coordinator.db",
                              absl::StrCat("DROP TABLE checkpoint_dirs; UPDATE meta SET value='",
                                           previous, "' WHERE key='schema_version'")));
  EXPECT_TRUE(
      absl::StartsWith(NewestMigrationBackup(state).status().message(), "--rollback-to-backup:"));
  {
    auto store = Store::Open(state);  // The upgrade.
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_NO_FATAL_FAILURE(WriteJobs(**store, 6, 2));  // Work done after the upgrade.
  }
  const std::string backup = MigrationBackupPath(state + "/coordinator.db", previous);
  absl::StatusOr<BackupInfo> saved = VerifyBackup(backup);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->schema_version, previous);
  EXPECT_EQ(saved->jobs, 5);
  absl::StatusOr<std::string> newest = NewestMigrationBackup(state);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, backup);
  // Roll back.
  absl::StatusOr<BackupInfo> rolled = RestoreStore(*newest, state, /*force=*/true);
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  EXPECT_EQ(rolled->schema_version, previous);
  absl::StatusOr<BackupInfo> now = VerifyBackup(state + "/coordinator.db");
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->schema_version, previous) << "the store is not the previous version's file";
  EXPECT_EQ(now->jobs, 5);
  // This coordinator upgrades it again (keeping its jobs).
  EXPECT_EQ(Jobs(state), 5);
}

}  // namespace
}  // namespace ulysses::coordinator
