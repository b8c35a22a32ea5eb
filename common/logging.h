// Minimal leveled logging with timestamps, safe to use from several threads.
//
//   ULOG(INFO) << "registered worker " << name;
//
// Lines go to stderr as "2026-11-21T15:04:05.123Z I worker.cc:42] message".
// The level threshold comes from SetLogLevel() or the ULYSSES_LOG_LEVEL
// environment variable (debug|info|warning|error). An optional sink receives
// every emitted line as well (the worker uses it to stream logs to the coordinator).
#ifndef ULYSSES_COMMON_LOGGING_H_
#define ULYSSES_COMMON_LOGGING_H_

#include <functional>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ulysses {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning"/"warn", "error" (case-insensitive).
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);

// A sink receives (level, fully formatted line without trailing newline).
using LogSink = std::function<void(LogLevel, const std::string&)>;
// Installs (or clears with nullptr) the extra sink. Thread-safe.
void SetLogSink(LogSink sink);

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // Emits the line; aborts the process for kFatal.
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows a stream expression when the level is disabled.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace ulysses

#define ULYSSES_LOG_LEVEL_DEBUG ::ulysses::LogLevel::kDebug
#define ULYSSES_LOG_LEVEL_INFO ::ulysses::LogLevel::kInfo
#define ULYSSES_LOG_LEVEL_WARNING ::ulysses::LogLevel::kWarning
#define ULYSSES_LOG_LEVEL_ERROR ::ulysses::LogLevel::kError
#define ULYSSES_LOG_LEVEL_FATAL ::ulysses::LogLevel::kFatal

#define ULOG(severity)                                                                        \
  (ULYSSES_LOG_LEVEL_##severity < ::ulysses::GetLogLevel())                                   \
      ? (void)0                                                                               \
      : ::ulysses::internal::Voidify() &                                                      \
            ::ulysses::internal::LogMessage(ULYSSES_LOG_LEVEL_##severity, __FILE__, __LINE__) \
                .stream()

#endif  // ULYSSES_COMMON_LOGGING_H_
