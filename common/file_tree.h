// File-tree helpers on plain POSIX calls (openat/unlinkat/readdir), used instead of the
// std::filesystem tree walkers. Why: the PyTorch pip wheel's libtorch_cpu.so exports its own
// statically linked copy of libstdc++'s std::filesystem (pytorch/pytorch#133437), so a binary
// linked against it may bind remove_all/directory_iterator to a copy built by another compiler
// and crash. These functions keep tree walks inside code we compile. scripts/lint.sh forbids
// std::filesystem::remove_all anywhere in the tree.
#ifndef ULYSSES_COMMON_FILE_TREE_H_
#define ULYSSES_COMMON_FILE_TREE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ulysses {

// Deletes `path` and, when it is a directory, everything under it. Symbolic links are
// removed as links and never followed (a link to a directory outside the tree leaves that
// directory and its files untouched); other mount points are entered like any directory.
// A missing `path` is OK (nothing to do). Entries vanishing concurrently are ignored.
// On failure the walk goes on with the other entries (removing as much as it can) and
// returns FailedPrecondition `cannot remove "<entry>" (<errno text>)` for the first entry
// that could not be removed, plus how many failed in all. Uses one file descriptor per
// directory level.
absl::Status RemoveTree(const std::string& path);

struct DirEntry {
  std::string name;   // The entry's name in the directory (no "/", never "." or "..").
  bool is_directory;  // A real directory; a symbolic link to one is false (not followed).
  bool is_symlink;
};

// The entries of the directory `path`, sorted by name. NotFound when `path` does not
// exist, FailedPrecondition when it is not a directory or cannot be read.
absl::StatusOr<std::vector<DirEntry>> ListDirectory(const std::string& path);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_FILE_TREE_H_
