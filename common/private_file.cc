#include "common/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ulysses {

absl::Status WritePrivateFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write \"", tmp, "\" (", std::strerror(errno), ")"));
  }
  fchmod(fd, 0600);
  bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  ok = (close(fd) == 0) && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write \"", path, "\" (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

absl::Status EnsurePrivateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("directory \"", dir, "\": cannot create (", ec.message(), ")"));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) == 0 && (st.st_mode & 0777) != 0700 && chmod(dir.c_str(), 0700) != 0) {
    ULOG(WARNING) << "directory " << dir << " stays mode " << std::oct << (st.st_mode & 0777)
                  << std::dec << ": cannot make it 0700 (" << std::strerror(errno)
                  << "); make it owner-only, it holds specs, paths and logs";
  }
  return absl::OkStatus();
}

}  // namespace ulysses
