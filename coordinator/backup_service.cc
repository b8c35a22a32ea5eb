#include "coordinator/backup_service.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/grpc/grpc_util.h"
#include "common/logging.h"
#include "coordinator/backup.h"

namespace ulysses::coordinator {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

class BackupReactor final : public grpc::ServerWriteReactor<v1::BackupStateChunk> {
 public:
  BackupReactor(const absl::StatusOr<auth::Principal>& caller, const std::string& state_dir) {
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    const std::string tmp = absl::StrCat(state_dir, "/backup-rpc-", std::random_device{}(), ".db");
    absl::StatusOr<BackupInfo> info = BackupStore(state_dir, tmp);
    if (!info.ok()) {
      ULOG(ERROR) << "BackupState: " << info.status();
      Finish(ToGrpcStatus(info.status()));
      return;
    }
    fd_ = open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    const int err = errno;
    unlink(tmp.c_str());  // The descriptor keeps it; nothing is left behind.
    if (fd_ < 0) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("cannot reopen the backup (", std::strerror(err), ")")));
      return;
    }
    info_ = *info;
    ULOG(INFO) << "BackupState by " << caller->Describe() << ": " << info_.bytes << " bytes, "
               << info_.jobs << " jobs";
    Next();
  }
  ~BackupReactor() override {
    if (fd_ >= 0) close(fd_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    chunk_.Clear();
    std::string* data = chunk_.mutable_data();
    data->resize(kChunkBytes);
    ssize_t n;
    do {
      n = read(fd_, data->data(), kChunkBytes);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("reading the backup: ", std::strerror(errno))));
      return;
    }
    if (n == 0) {
      Finish(sent_ == info_.bytes
                 ? grpc::Status::OK
                 : grpc::Status(grpc::StatusCode::INTERNAL, "the backup file changed size"));
      return;
    }
    data->resize(static_cast<size_t>(n));
    sent_ += n;
    chunk_.set_total_bytes(info_.bytes);
    chunk_.set_schema_version(info_.schema_version);
    chunk_.set_jobs(info_.jobs);
    StartWrite(&chunk_);
  }

  int fd_ = -1;
  BackupInfo info_;
  int64_t sent_ = 0;
  v1::BackupStateChunk chunk_;
};

}  // namespace

grpc::ServerWriteReactor<v1::BackupStateChunk>* NewBackupReactor(
    const absl::StatusOr<auth::Principal>& caller, const std::string& state_dir) {
  return new BackupReactor(caller, state_dir);
}

}  // namespace ulysses::coordinator
