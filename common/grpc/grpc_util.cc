#include "common/grpc/grpc_util.h"

#include <string>

namespace ulysses {
namespace {

// Both enums number the canonical codes 0 (OK) .. 16 (UNAUTHENTICATED).
constexpr int kMaxCanonicalCode = 16;

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) {
    return grpc::Status::OK;
  }
  const int code = static_cast<int>(status.code());
  const grpc::StatusCode grpc_code = code > 0 && code <= kMaxCanonicalCode
                                         ? static_cast<grpc::StatusCode>(code)
                                         : grpc::StatusCode::UNKNOWN;
  std::string message(status.message());
  return grpc::Status(grpc_code, message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) {
    return absl::OkStatus();
  }
  const int code = static_cast<int>(status.error_code());
  const absl::StatusCode absl_code = code > 0 && code <= kMaxCanonicalCode
                                         ? static_cast<absl::StatusCode>(code)
                                         : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  const auto now = std::chrono::system_clock::now();
  if (timeout <= absl::ZeroDuration()) {
    return now;
  }
  // Saturate far-future deadlines instead of overflowing the clock.
  const absl::Duration max_ahead = absl::Hours(24 * 365 * 100);
  if (timeout > max_ahead) {
    timeout = max_ahead;
  }
  return now + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                   absl::ToChronoNanoseconds(timeout));
}

void SetDeadlineAfter(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    return;
  }
  context->set_deadline(DeadlineAfter(timeout));
}

}  // namespace ulysses
