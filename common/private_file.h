// WritePrivateFile: replaces a file holding a secret (tokens, credentials) atomically,
// mode 0600 from the start, fsynced before the rename: readers see the old file or the
// whole new one, never a part, and nobody else can read it at any point.
// EnsurePrivateDir: a directory only its owner can enter (the coordinator's state dir).
#ifndef ULYSSES_COMMON_PRIVATE_FILE_H_
#define ULYSSES_COMMON_PRIVATE_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace ulysses {

// FailedPrecondition `cannot write "<path>" (<errno text>)` on any failure; the old
// file (if any) is then unchanged and no temporary is left behind.
absl::Status WritePrivateFile(const std::string& path, const std::string& text);

// Creates `dir` (and its parents) and makes it owner-only (0700); an existing directory is
// tightened to 0700. FailedPrecondition naming the directory when it cannot be created;
// when it exists but cannot be tightened (not its owner: e.g. a volume's root owned by
// root with an fsGroup), a warning is logged and the result is OK.
absl::Status EnsurePrivateDir(const std::string& dir);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_PRIVATE_FILE_H_
