#include "common/logging.h"

#include "common/log_format.h"

#include <sys/time.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace ulysses {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("ULYSSES_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  auto parsed = ParseLogLevel(env);
  return parsed.ok() ? *parsed : LogLevel::kInfo;
}

struct LogState {
  absl::Mutex mu;
  // Read without the lock on every log call (cheap when disabled).
  std::atomic<LogLevel> level{LevelFromEnv()};
  LogSink sink ABSL_GUARDED_BY(mu);
  LogFormat format ABSL_GUARDED_BY(mu) = LogFormat::kText;
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

const char* LevelName(char letter) {
  switch (letter) {
    case 'D':
      return "debug";
    case 'I':
      return "info";
    case 'W':
      return "warning";
    case 'E':
      return "error";
    case 'F':
      return "fatal";
  }
  return "unknown";
}

void AppendJsonString(absl::string_view text, std::string* out) {
  out->push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<int>(static_cast<unsigned char>(c)));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

}  // namespace

void SetLogFormat(LogFormat format) {
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  state.format = format;
}

absl::Status SetLogFormatFromFlag(absl::string_view flag, absl::string_view value) {
  if (value == "text") {
    SetLogFormat(LogFormat::kText);
  } else if (value == "json") {
    SetLogFormat(LogFormat::kJson);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": \"", value, "\" is not a log format (use text or json)"));
  }
  return absl::OkStatus();
}

std::string TextLogLineToJson(const std::string& line) {
  // "<time> <letter> <pid> <source>] <msg>"
  std::string out;
  const size_t end = line.find("] ");
  const size_t a = line.find(' ');
  const size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
  const size_t c = b == std::string::npos ? b : line.find(' ', b + 1);
  if (end == std::string::npos || c == std::string::npos || c > end || b != a + 2) {
    out = "{\"msg\":";
    AppendJsonString(line, &out);
    out.push_back('}');
    return out;
  }
  out = "{\"time\":";
  AppendJsonString(absl::string_view(line).substr(0, a), &out);
  absl::StrAppend(&out, ",\"level\":\"", LevelName(line[a + 1]), "\",\"pid\":");
  const std::string pid = line.substr(b + 1, c - b - 1);
  out.append(pid.find_first_not_of("0123456789") == std::string::npos && !pid.empty() ? pid : "0");
  out.append(",\"source\":");
  AppendJsonString(absl::string_view(line).substr(c + 1, end - c - 1), &out);
  out.append(",\"msg\":");
  AppendJsonString(absl::string_view(line).substr(end + 2), &out);
  out.push_back('}');
  return out;
}

void SetLogLevel(LogLevel level) { State().level.store(level, std::memory_order_relaxed); }

LogLevel GetLogLevel() { return State().level.load(std::memory_order_relaxed); }

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
  LogState& state = State();
  absl::MutexLock lock(&state.mu);
  state.sink = std::move(sink);
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
    LogState& state = State();
    absl::MutexLock lock(&state.mu);
    if (state.format == LogFormat::kJson) {
      std::fprintf(stderr, "%s\n", TextLogLineToJson(line).c_str());
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
    sink = state.sink;
  }
  if (sink) sink(level_, line);
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace ulysses
