#include "coordinator/job_log_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/file_tree.h"
#include "common/logging.h"
#include "google/protobuf/util/json_util.h"

namespace ulysses::coordinator {
namespace {

namespace fs = std::filesystem;

std::string LineJson(const v1::LogLine& line) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  (void)google::protobuf::util::MessageToJsonString(line, &out, options);
  return out;
}

void ReadInto(const std::string& path, std::vector<v1::LogLine>* out) {
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) {
    v1::LogLine line;
    if (google::protobuf::util::JsonStringToMessage(text, &line).ok()) {
      out->push_back(std::move(line));
    }
  }
}

}  // namespace

void JobLogFiles::Append(const std::vector<std::pair<std::string, v1::LogLine>>& lines) {
  if (bytes_per_job_ <= 0) return;
  for (size_t i = 0; i < lines.size();) {
    const std::string& job = lines[i].first;
    std::string text;
    for (; i < lines.size() && lines[i].first == job; ++i) {
      absl::StrAppend(&text, LineJson(lines[i].second), "\n");
    }
    absl::Status s = AppendJob(job, text);
    if (!s.ok() && std::find(failed_.begin(), failed_.end(), job) == failed_.end()) {
      failed_.push_back(job);
      ULOG(ERROR) << "log file of " << job << ": " << s << " (lines stay in memory only)";
    }
  }
}

absl::Status JobLogFiles::AppendJob(const std::string& job_id, const std::string& text) {
  const std::string dir = JobDir(job_id);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string current = dir + "/log.jsonl";
  struct stat st;
  if (stat(current.c_str(), &st) == 0 &&
      st.st_size + static_cast<int64_t>(text.size()) > bytes_per_job_ / 2) {
    if (std::rename(current.c_str(), (dir + "/log.1.jsonl").c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot rotate ", current, ": ", std::strerror(errno)));
    }
  }
  const int fd = open(current.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", current, ": ", std::strerror(errno)));
  }
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::UnavailableError(
          absl::StrCat("cannot write ", current, ": ", std::strerror(err)));
    }
    off += static_cast<size_t>(n);
  }
  close(fd);
  return absl::OkStatus();
}

void JobLogFiles::Remove(const std::string& job_id) {
  if (job_id.empty() || job_id == "." || job_id == ".." || job_id.find('/') != std::string::npos) {
    return;  // Not a job id: never a path outside the logs directory.
  }
  if (absl::Status s = RemoveTree(JobDir(job_id)); !s.ok()) {
    ULOG(ERROR) << "log files of deleted job " << job_id << ": " << s;
  }
}

int JobLogFiles::RemoveExcept(const std::vector<std::string>& keep) {
  absl::StatusOr<std::vector<DirEntry>> entries = ListDirectory(dir_);
  if (!entries.ok()) return 0;  // No logs directory yet (NotFound) or unreadable.
  int removed = 0;
  for (const DirEntry& e : *entries) {
    if (!e.is_directory || std::binary_search(keep.begin(), keep.end(), e.name)) continue;
    Remove(e.name);
    ++removed;
  }
  return removed;
}

std::vector<v1::LogLine> JobLogFiles::Load(const std::string& job_id) const {
  std::vector<v1::LogLine> out;
  if (bytes_per_job_ <= 0) return out;
  ReadInto(JobDir(job_id) + "/log.1.jsonl", &out);
  ReadInto(JobDir(job_id) + "/log.jsonl", &out);
  return out;
}

}  // namespace ulysses::coordinator
