// WritePrivateFile: replaces a file holding a secret (tokens, credentials) atomically,
// mode 0600 from the start, fsynced before the rename: readers see the old file or the
// whole new one, never a part, and nobody else can read it at any point.
#ifndef ULYSSES_COMMON_PRIVATE_FILE_H_
#define ULYSSES_COMMON_PRIVATE_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace ulysses {

// FailedPrecondition `cannot write "<path>" (<errno text>)` on any failure; the old
// file (if any) is then unchanged and no temporary is left behind.
absl::Status WritePrivateFile(const std::string& path, const std::string& text);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_PRIVATE_FILE_H_
