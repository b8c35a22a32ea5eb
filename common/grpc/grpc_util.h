// Glue between absl::Status and gRPC, used by every gRPC client and service.
//
// Both sides use the canonical status codes with the same numbers, so the mapping
// is 1:1 by code and keeps the message; absl payloads are not carried over the
// wire. Codes outside the canonical range become UNKNOWN. Stateless and
// thread-safe.
#ifndef ULYSSES_COMMON_GRPC_GRPC_UTIL_H_
#define ULYSSES_COMMON_GRPC_GRPC_UTIL_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <chrono>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ulysses {

// absl -> gRPC, for service handlers: `reactor->Finish(ToGrpcStatus(status))`.
grpc::Status ToGrpcStatus(const absl::Status& status);
// gRPC -> absl, for clients.
absl::Status FromGrpcStatus(const grpc::Status& status);

// Sets `context`'s deadline to now + `timeout` (every client call must have one).
// A timeout <= 0 gives a deadline of now (the call fails DEADLINE_EXCEEDED);
// absl::InfiniteDuration() leaves the context without a deadline.
void SetDeadlineAfter(grpc::ClientContext* context, absl::Duration timeout);

// Converts `timeout` to a system_clock time point now + timeout (saturating).
std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_GRPC_GRPC_UTIL_H_
