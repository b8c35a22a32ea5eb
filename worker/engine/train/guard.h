// The engine edge for libtorch exceptions: runs a callable that returns absl::Status and turns
// any c10::Error or std::exception it throws into an INTERNAL Status prefixed with `context`
// (RESOURCE_EXHAUSTED for an out-of-memory error, so callers can tell "does not fit" apart).
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_GUARD_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_GUARD_H_

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ulysses::engine::train {

template <typename Fn>
absl::Status Guard(const std::string& context, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(context, ": out of device memory: ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  }
}

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_GUARD_H_
