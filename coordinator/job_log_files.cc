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
#include "common/private_file.h"
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

void JobLogFiles::Append(const std::vector<std::pair<std::string, v1::LogLine>>& lines,
                         const Admit& admit) {
  if (bytes_per_job_ <= 0) return;
  for (size_t i = 0; i < lines.size();) {
    const std::string& job = lines[i].first;
    std::vector<std::string> texts;
    for (; i < lines.size() && lines[i].first == job; ++i) {
      texts.push_back(absl::StrCat(LineJson(lines[i].second), "\n"));
    }
    absl::Status s = AppendJob(job, std::move(texts), admit);
    if (!s.ok() && std::find(failed_.begin(), failed_.end(), job) == failed_.end()) {
      failed_.push_back(job);
      ULOG(ERROR) << "log file of " << job << ": " << s << " (lines stay in memory only)";
    }
  }
}

int64_t JobLogFiles::Bytes(const std::string& job_id) {
  auto it = bytes_.find(job_id);
  if (it != bytes_.end()) return it->second;
  int64_t bytes = 0;
  for (const char* name : {"/log.jsonl", "/log.1.jsonl"}) {
    struct stat st;
    if (stat((JobDir(job_id) + name).c_str(), &st) == 0) bytes += st.st_size;
  }
  bytes_[job_id] = bytes;
  total_ += bytes;
  return bytes;
}

absl::Status JobLogFiles::AppendJob(const std::string& job_id, std::vector<std::string> lines,
                                    const Admit& admit) {
  // At its limit as written: the newest lines that fit in half of bytes_per_job_.
  const int64_t half = bytes_per_job_ / 2;
  int64_t size = 0;
  size_t first = lines.size();
  while (first > 0 && size + static_cast<int64_t>(lines[first - 1].size()) <= half) {
    size += static_cast<int64_t>(lines[--first].size());
  }
  if (size == 0) return absl::OkStatus();  // Not even the newest line fits: none is written.
  std::string text;
  text.reserve(static_cast<size_t>(size));
  for (size_t k = first; k < lines.size(); ++k) text += lines[k];

  const int64_t before = Bytes(job_id);
  if (bytes_total_ > 0 && total_ + size > bytes_total_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the log files of all jobs hold ", total_, " bytes, their share of state_max_bytes is ",
        bytes_total_, " (raise state_max_bytes, or let ended jobs expire)"));
  }
  if (admit && !admit(job_id, size)) {
    return absl::ResourceExhaustedError(
        "its tenant is at its byte quota (quotas.tenants.<tenant>.max_bytes)");
  }
  const std::string dir = JobDir(job_id);
  if (absl::Status s = EnsurePrivateDir(dir); !s.ok()) {
    return absl::UnavailableError(s.message());
  }
  const std::string current = dir + "/log.jsonl";
  const std::string previous = dir + "/log.1.jsonl";
  struct stat st;
  if (stat(current.c_str(), &st) == 0 && st.st_size + size > half) {
    if (std::rename(current.c_str(), previous.c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot rotate ", current, ": ", std::strerror(errno)));
    }
  }
  const int fd = open(current.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  absl::Status status = absl::OkStatus();
  if (fd < 0) {
    status =
        absl::UnavailableError(absl::StrCat("cannot open ", current, ": ", std::strerror(errno)));
  }
  size_t off = 0;
  while (fd >= 0 && off < text.size()) {
    const ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = absl::UnavailableError(
          absl::StrCat("cannot write ", current, ": ", std::strerror(errno)));
      break;
    }
    off += static_cast<size_t>(n);
  }
  if (fd >= 0) close(fd);
  // What is on disk now (a rotation replaced log.1.jsonl).
  int64_t after = 0;
  for (const std::string& path : {current, previous}) {
    if (stat(path.c_str(), &st) == 0) after += st.st_size;
  }
  bytes_[job_id] = after;
  total_ += after - before;
  return status;
}

void JobLogFiles::Forget(const std::string& job_id) {
  auto it = bytes_.find(job_id);
  if (it == bytes_.end()) return;
  total_ -= it->second;
  bytes_.erase(it);
}

void JobLogFiles::Remove(const std::string& job_id) {
  if (job_id.empty() || job_id == "." || job_id == ".." || job_id.find('/') != std::string::npos) {
    return;  // Not a job id: never a path outside the logs directory.
  }
  if (absl::Status s = RemoveTree(JobDir(job_id)); !s.ok()) {
    ULOG(ERROR) << "log files of deleted job " << job_id << ": " << s;
    return;
  }
  Forget(job_id);
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
