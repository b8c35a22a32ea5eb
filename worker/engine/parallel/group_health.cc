#include "worker/engine/parallel/group_health.h"

#include "absl/strings/str_cat.h"

namespace ulysses::engine::internal {

absl::Status GroupHealth::CheckUsable(absl::string_view op) const {
  if (aborted_) return AbortedError(op);
  if (broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat(backend_, " ", op, " on group '", group_,
                     "': an earlier collective failed; recreate the group"));
  }
  return absl::OkStatus();
}

absl::Status GroupHealth::AbortedError(absl::string_view op) const {
  return absl::AbortedError(absl::StrCat(backend_, " ", op, " on group '", group_, "': aborted"));
}

}  // namespace ulysses::engine::internal
