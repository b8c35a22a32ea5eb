// The engine edge for libtorch exceptions: runs a callable that returns absl::Status and turns
// any c10::Error or std::exception it throws into an INTERNAL Status prefixed with `context`
// (RESOURCE_EXHAUSTED for an out-of-memory error, so callers can tell "does not fit" apart).
// A collective that failed inside autograd throws its Status as text (Status::ToString:
// "UNAVAILABLE: gloo alltoall ..."): UNAVAILABLE and DEADLINE_EXCEEDED keep their code, so a
// rank that lost a peer exits contract::kExitPeerLost (an infrastructure failure).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_GUARD_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_GUARD_H_

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ulysses::engine::train {

// INTERNAL `message`, or UNAVAILABLE / DEADLINE_EXCEEDED when it carries a Status of that code.
inline absl::Status StatusFromThrown(const std::string& message) {
  if (message.find("UNAVAILABLE: ") != std::string::npos) return absl::UnavailableError(message);
  if (message.find("DEADLINE_EXCEEDED: ") != std::string::npos) {
    return absl::DeadlineExceededError(message);
  }
  return absl::InternalError(message);
}

template <typename Fn>
absl::Status Guard(const std::string& context, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(context, ": out of device memory: ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return StatusFromThrown(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return StatusFromThrown(absl::StrCat(context, ": ", e.what()));
  }
}

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_GUARD_H_
