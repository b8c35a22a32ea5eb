#include "coordinator/state_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ulysses::coordinator {

absl::StatusOr<std::unique_ptr<StateDirLock>> StateDirLock::Acquire(const std::string& state_dir,
                                                                    const std::string& who) {
  const std::string path = absl::StrCat(state_dir, "/", kStateLockFile);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open \"", path, "\" (", std::strerror(errno), ")"));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[128] = {0};
    const ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
    close(fd);
    const std::string named =
        n > 0 ? std::string(absl::StripAsciiWhitespace(std::string(holder, n))) : "a process";
    if (err != EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot lock \"", path, "\" (", std::strerror(err), ")"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("state dir \"", state_dir, "\" is in use by ", named, " (it holds ",
                     kStateLockFile, "); stop it first, or use another state dir"));
  }
  const std::string text = absl::StrCat(who, " pid ", getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, text.data(), text.size(), 0) < 0) {
    // The lock holds without the note; only the refusal message of others is vaguer.
  }
  return std::unique_ptr<StateDirLock>(new StateDirLock(fd));
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) close(fd_);  // Releases the flock.
}

}  // namespace ulysses::coordinator
