#include "common/file_tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ulysses {
namespace {

constexpr int kDirOpenFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

// The first failure of a walk and how many there were.
struct Failures {
  std::string first_path;
  int first_errno = 0;
  int count = 0;

  void Add(const std::string& path, int err) {
    if (count++ == 0) {
      first_path = path;
      first_errno = err;
    }
  }
};

// Reads the names in the open directory `dir_fd` (which stays open; the caller closes it).
// Returns errno, 0 on success.
int ReadNames(int dir_fd, std::vector<std::string>* names) {
  const int fd = dup(dir_fd);  // closedir() closes its own descriptor.
  if (fd < 0) return errno;
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    close(fd);
    return err;
  }
  rewinddir(dir);
  int err = 0;
  for (;;) {
    errno = 0;
    const dirent* entry = readdir(dir);
    if (entry == nullptr) {
      err = errno;
      break;
    }
    if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
    names->emplace_back(entry->d_name);
  }
  closedir(dir);
  return err;
}

// Empties the open directory `dir_fd` (shown as `shown` in errors), depth first.
void RemoveContents(int dir_fd, const std::string& shown, Failures* failures) {
  std::vector<std::string> names;
  if (const int err = ReadNames(dir_fd, &names); err != 0) {
    failures->Add(shown, err);
    return;
  }
  for (const std::string& name : names) {
    const std::string child = absl::StrCat(shown, "/", name);
    struct stat st;
    if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) failures->Add(child, errno);
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      // O_NOFOLLOW: if the entry was swapped for a symlink since fstatat, this fails (ELOOP or
      // ENOTDIR) rather than walking into the link's target.
      const int child_fd = openat(dir_fd, name.c_str(), kDirOpenFlags);
      if (child_fd < 0) {
        if (errno != ENOENT) failures->Add(child, errno);
        continue;
      }
      RemoveContents(child_fd, child, failures);
      close(child_fd);
      if (unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        failures->Add(child, errno);
      }
    } else if (unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      failures->Add(child, errno);
    }
  }
}

absl::Status ToStatus(const Failures& failures) {
  if (failures.count == 0) return absl::OkStatus();
  std::string message = absl::StrCat("cannot remove \"", failures.first_path, "\" (",
                                     std::strerror(failures.first_errno), ")");
  if (failures.count > 1) absl::StrAppend(&message, "; ", failures.count - 1, " more failed");
  return absl::FailedPreconditionError(message);
}

}  // namespace

absl::Status RemoveTree(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("RemoveTree: empty path");
  Failures failures;
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    failures.Add(path, errno);
    return ToStatus(failures);
  }
  if (!S_ISDIR(st.st_mode)) {  // A file or a symlink (to anything): remove just it.
    if (unlink(path.c_str()) != 0 && errno != ENOENT) failures.Add(path, errno);
    return ToStatus(failures);
  }
  const int fd = open(path.c_str(), kDirOpenFlags);
  if (fd < 0) {
    if (errno != ENOENT) failures.Add(path, errno);
    return ToStatus(failures);
  }
  RemoveContents(fd, path, &failures);
  close(fd);
  if (rmdir(path.c_str()) != 0 && errno != ENOENT) failures.Add(path, errno);
  return ToStatus(failures);
}

absl::StatusOr<std::vector<DirEntry>> ListDirectory(const std::string& path) {
  const int fd = open(path.c_str(), kDirOpenFlags);
  if (fd < 0) {
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot list directory \"", path, "\" (", std::strerror(err), ")");
    if (err == ENOENT) return absl::NotFoundError(message);
    return absl::FailedPreconditionError(message);
  }
  std::vector<std::string> names;
  const int err = ReadNames(fd, &names);
  std::vector<DirEntry> entries;
  if (err == 0) {
    std::sort(names.begin(), names.end());
    for (std::string& name : names) {
      struct stat st;
      if (fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // Gone since.
      entries.push_back({std::move(name), S_ISDIR(st.st_mode), S_ISLNK(st.st_mode)});
    }
  }
  close(fd);
  if (err != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list directory \"", path, "\" (", std::strerror(err), ")"));
  }
  return entries;
}

}  // namespace ulysses
