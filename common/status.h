// Status helpers for Abseil 20220623, which ships absl::Status/StatusOr but no
// propagation macros. Every module boundary in Ulysses returns absl::Status or
// absl::StatusOr<T>; these macros keep call sites short.
#ifndef ULYSSES_COMMON_STATUS_H_
#define ULYSSES_COMMON_STATUS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define ULYSSES_STATUS_CONCAT_INNER_(a, b) a##b
#define ULYSSES_STATUS_CONCAT_(a, b) ULYSSES_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    ::absl::Status ulysses_status_tmp_ = (expr);               \
    if (!ulysses_status_tmp_.ok()) return ulysses_status_tmp_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, FnReturningStatusOr());` declares/assigns x from the
// value, or returns the error status from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(ULYSSES_STATUS_CONCAT_(ulysses_statusor_, __LINE__), lhs, rexpr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)       \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace ulysses {

// Returns `status` with `context` prepended to its message ("context: message"),
// keeping the code. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_STATUS_H_
