// The format of the lines common/logging.h writes to stderr: text (default,
// "2026-11-21T15:04:05.123Z I 4242 worker.cc:42] message") or JSON lines for cluster log
// collectors (`--log-format json` of ulysses-coordinator and ulysses-worker):
//   {"time":"2026-11-21T15:04:05.123Z","level":"info","pid":4242,"source":"worker.cc:42",
//    "msg":"message"}
// The extra sink (SetLogSink) always gets the text line.
#ifndef ULYSSES_COMMON_LOG_FORMAT_H_
#define ULYSSES_COMMON_LOG_FORMAT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ulysses {

enum class LogFormat { kText, kJson };

void SetLogFormat(LogFormat format);
// "text" or "json"; InvalidArgument naming `flag`, the value and the choices otherwise.
absl::Status SetLogFormatFromFlag(absl::string_view flag, absl::string_view value);
// A text line as the JSON object above (the text itself as "msg" if it has no prefix).
std::string TextLogLineToJson(const std::string& line);

}  // namespace ulysses

#endif  // ULYSSES_COMMON_LOG_FORMAT_H_
