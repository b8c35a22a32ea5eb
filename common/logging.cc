#include "common/logging.h"

#include <sys/time.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ulysses {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("ULYSSES_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  auto parsed = ParseLogLevel(env);
  return parsed.ok() ? *parsed : LogLevel::kInfo;
}

struct LogState {
  std::mutex mu;
  LogLevel level = LevelFromEnv();
  LogSink sink;
};

LogState& State() {
  static LogState* state = new LogState();  // Never destroyed: usable during exit.
  return *state;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
    case LogLevel::kFatal:
      return 'F';
  }
  return '?';
}

std::string Timestamp() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm utc;
  gmtime_r(&tv.tv_sec, &utc);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                         utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                         static_cast<int>(tv.tv_usec / 1000));
}

const char* Basename(const char* path) {
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

}  // namespace

void SetLogLevel(LogLevel level) {
  std::lock_guard<std::mutex> lock(State().mu);
  State().level = level;
}

LogLevel GetLogLevel() {
  // Reads without the lock: a torn read of an enum is not possible on our targets,
  // and logging must stay cheap when disabled.
  return State().level;
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning" || lower == "warn") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("log level '", text, "' is not one of debug, info, warning, error"));
}

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(State().mu);
  State().sink = std::move(sink);
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  stream_ << Timestamp() << ' ' << LevelLetter(level) << ' ' << getpid() << ' ' << Basename(file)
          << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  std::string line = stream_.str();
  LogSink sink;
  {
    std::lock_guard<std::mutex> lock(State().mu);
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    sink = State().sink;
  }
  if (sink) sink(level_, line);
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace ulysses
