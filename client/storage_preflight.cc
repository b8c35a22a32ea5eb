#include "client/storage_preflight.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_tree.h"
#include "common/logging.h"

namespace ulysses::client {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kChunkBytes = size_t{8} << 20;  // ShardWriter::kChunkBytes
constexpr size_t kAlign = 4096;                  // ShardWriter::kBlock

std::string Errno(const std::string& what, const std::string& path, int err) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(err));
}

// Shared pacing of all writers: a writer may send its next chunk once the bytes sent so far are
// due at `limit` bytes/s since the start.
class Pacer {
 public:
  Pacer(double limit, Clock::time_point start) : limit_(limit), start_(start) {}
  void Before(size_t bytes) {
    if (limit_ <= 0) return;
    double due;
    {
      absl::MutexLock lock(&mu_);
      sent_ += static_cast<double>(bytes);
      due = sent_ / limit_;
    }
    std::this_thread::sleep_until(
        start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(due)));
  }

 private:
  const double limit_;
  const Clock::time_point start_;
  absl::Mutex mu_;
  double sent_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<StorageProbeResult> ProbeStorage(const StorageProbeOptions& o) {
  if (o.writers < 1 || o.writers > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--writers: ", o.writers, " is outside 1..64 (the ranks of one node: 8)"));
  }
  if (!(o.bytes >= kChunkBytes) || o.bytes > 1e13) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bytes: ", o.bytes, " is outside 8MiB..10TB (what the probe writes in all)"));
  }
  if (!(o.limit_bytes_per_s >= 0)) {
    return absl::InvalidArgumentError("--limit-rate: must be >= 0 bytes/s (0 = no limit)");
  }
  std::error_code ec;
  if (!fs::is_directory(o.dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dir: ", o.dir, " is not a directory (give a directory on the shared volume)"));
  }
  std::string tmpl = (fs::path(o.dir) / ".ulysses-preflight-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(Errno("cannot create a directory under", o.dir, errno),
                     " (the probe needs write access there, as the ranks do)"));
  }
  const std::string probe_dir = tmpl;
  const size_t per_writer =
      (static_cast<size_t>(o.bytes) / static_cast<size_t>(o.writers) + kChunkBytes - 1) /
      kChunkBytes * kChunkBytes;
  std::unique_ptr<char, decltype(&std::free)> buffer(
      static_cast<char*>(std::aligned_alloc(kAlign, kChunkBytes)), &std::free);
  if (!buffer) return absl::ResourceExhaustedError("cannot allocate the 8 MiB write buffer");
  for (size_t i = 0; i < kChunkBytes; ++i) buffer.get()[i] = static_cast<char>(i * 131 + 7);

  std::vector<std::string> errors(static_cast<size_t>(o.writers));
  std::atomic<int> direct{0};
  const Clock::time_point start = Clock::now();
  Pacer pacer(o.limit_bytes_per_s, start);
  std::vector<std::thread> threads;
  for (int w = 0; w < o.writers; ++w) {
    threads.emplace_back([&, w] {
      const std::string path = absl::StrCat(probe_dir, "/rank", w, ".bin");
      int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
      if (fd >= 0) {
        ++direct;
      } else {
        fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      }
      if (fd < 0) {
        errors[w] = Errno("cannot create", path, errno);
        return;
      }
      for (size_t done = 0; done < per_writer; done += kChunkBytes) {
        pacer.Before(kChunkBytes);
        size_t off = 0;
        while (off < kChunkBytes) {
          const ssize_t n = write(fd, buffer.get() + off, kChunkBytes - off);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            errors[w] = Errno("cannot write", path, n < 0 ? errno : ENOSPC);
            close(fd);
            return;
          }
          off += static_cast<size_t>(n);
        }
      }
      if (fsync(fd) != 0) errors[w] = Errno("cannot fsync", path, errno);
      close(fd);
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (absl::Status removed = RemoveTree(probe_dir); !removed.ok()) {
    ULOG(WARNING) << "storage probe: " << removed;
  }
  for (const std::string& e : errors) {
    if (!e.empty()) return absl::FailedPreconditionError(e);
  }
  StorageProbeResult r;
  r.writers = o.writers;
  r.bytes = static_cast<double>(per_writer) * o.writers;
  r.seconds = std::max(seconds, 1e-9);
  r.bytes_per_s = r.bytes / r.seconds;
  r.direct = direct.load() == o.writers;
  return r;
}

std::vector<StageSave> SaveEstimates(const std::vector<StagePlan>& plans, double bytes_per_s,
                                     double grace_s) {
  std::vector<StageSave> out;
  for (const StagePlan& p : plans) {
    StageSave s;
    s.checkpoint_bytes = p.snapshot_host_bytes * static_cast<double>(p.world);
    s.save_seconds = bytes_per_s > 0 ? s.checkpoint_bytes / bytes_per_s : 0;
    s.step_seconds = p.step_seconds();
    s.fits = s.step_seconds + s.save_seconds <= grace_s;
    out.push_back(s);
  }
  return out;
}

}  // namespace ulysses::client
