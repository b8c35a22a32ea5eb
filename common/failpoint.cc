#include "common/failpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ulysses {
namespace {

struct Failpoint {
  std::string name;             // Empty: nothing armed.
  std::optional<int64_t> step;  // nullopt: fires at every step.
  std::string marker;           // Empty: no marker file.
};

// Parses ULYSSES_FAILPOINT / ULYSSES_FAILPOINT_MARKER; logs what it armed.
Failpoint ParseEnv() {
  Failpoint fp;
  const char* value = std::getenv(kFailpointEnv);
  if (value == nullptr || *value == '\0') return fp;
  const std::string text = value;
  const size_t at = text.find('@');
  std::string name = text.substr(0, at);
  std::optional<int64_t> step;
  if (at != std::string::npos) {
    int64_t s = 0;
    if (!absl::SimpleAtoi(text.substr(at + 1), &s) || s < 0) {
      ULOG(ERROR) << kFailpointEnv << "=" << text
                  << ": malformed (expected <name>[@<step>], step >= 0); no failpoint armed";
      return fp;
    }
    step = s;
  }
  if (name.empty()) {
    ULOG(ERROR) << kFailpointEnv << "=" << text << ": empty failpoint name; no failpoint armed";
    return fp;
  }
  fp.name = std::move(name);
  fp.step = step;
  if (const char* m = std::getenv(kFailpointMarkerEnv); m != nullptr) fp.marker = m;
  ULOG(WARNING) << "failpoint " << fp.name
                << (fp.step ? absl::StrCat(" at step ", *fp.step) : std::string(" at every step"))
                << " is ARMED by " << kFailpointEnv << " (tests only): this process will block "
                << "forever when it is reached"
                << (fp.marker.empty() ? std::string()
                                      : absl::StrCat(", after creating ", fp.marker));
  return fp;
}

const Failpoint& Armed() {
  static const Failpoint fp = ParseEnv();
  return fp;
}

// marker.tmp + rename: the marker's existence means its content is complete.
void WriteMarker(const std::string& path) {
  const std::string tmp = path + ".tmp";
  const std::string text = absl::StrCat(getpid(), "\n");
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const char* failed = nullptr;
  if (fd < 0) {
    failed = "open";
  } else if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    failed = "write";
  }
  if (fd >= 0 && close(fd) != 0 && failed == nullptr) failed = "close";
  if (failed == nullptr && std::rename(tmp.c_str(), path.c_str()) != 0) failed = "rename";
  if (failed != nullptr) {
    ULOG(ERROR) << "failpoint: cannot create marker " << path << " (" << failed
                << "): " << std::strerror(errno);
  }
}

}  // namespace

bool FailpointArmed(std::string_view name, int64_t step) {
  const Failpoint& fp = Armed();
  if (fp.name.empty() || fp.name != name) return false;
  return !fp.step || *fp.step == step;
}

void HangAtFailpoint(std::string_view name, int64_t step) {
  if (!FailpointArmed(name, step)) return;
  const Failpoint& fp = Armed();
  ULOG(ERROR) << "failpoint " << fp.name << " reached at step " << step << " (pid " << getpid()
              << "); blocking until killed";
  if (!fp.marker.empty()) WriteMarker(fp.marker);  // Last: the log line is out by then.
  for (;;) pause();
}

}  // namespace ulysses
