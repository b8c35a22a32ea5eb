#include "worker/engine/checkpoint/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ulysses::engine {

absl::StatusOr<std::unique_ptr<SequentialFileWriter>> SequentialFileWriter::Create(
    const std::string& path, bool direct) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = -1;
  if (direct) {
    fd = open(path.c_str(), flags | O_DIRECT, 0644);
    if (fd < 0 && errno != EINVAL) {
      return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    direct = fd >= 0;  // EINVAL: the filesystem has no direct I/O
  }
  if (fd < 0) fd = open(path.c_str(), flags, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  void* buffer = std::aligned_alloc(kBlock, kChunkBytes);
  if (buffer == nullptr) {
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the ", kChunkBytes, "-byte staging buffer for ", path));
  }
  return std::unique_ptr<SequentialFileWriter>(
      new SequentialFileWriter(path, fd, direct, static_cast<char*>(buffer)));
}

SequentialFileWriter::SequentialFileWriter(std::string path, int fd, bool direct, char* buffer)
    : path_(std::move(path)), fd_(fd), direct_(direct), buffer_(buffer) {}

SequentialFileWriter::~SequentialFileWriter() {
  if (fd_ >= 0) close(fd_);
  std::free(buffer_);
}

absl::Status SequentialFileWriter::ErrnoError(const char* what) const {
  return absl::InternalError(absl::StrCat(what, " ", path_, ": ", std::strerror(errno)));
}

absl::Status SequentialFileWriter::Append(const void* data, size_t size) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const size_t n = std::min(size, kChunkBytes - staged_);
    if (p != nullptr) {
      std::memcpy(buffer_ + staged_, p, n);
      p += n;
    } else {
      std::memset(buffer_ + staged_, 0, n);
    }
    staged_ += n;
    size -= n;
    appended_ += static_cast<int64_t>(n);
    if (staged_ == kChunkBytes) {
      if (absl::Status s = Flush(kChunkBytes); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status SequentialFileWriter::AppendZeros(size_t size) { return Append(nullptr, size); }

absl::Status SequentialFileWriter::Flush(size_t write_bytes) {
  size_t done = 0;
  while (done < write_bytes) {
    const ssize_t n =
        pwrite(fd_, buffer_ + done, write_bytes - done, file_offset_ + static_cast<int64_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && direct_) {
      // Opened with O_DIRECT but the filesystem refuses the write: the page cache from here.
      const int fl = fcntl(fd_, F_GETFL);
      if (fl < 0 || fcntl(fd_, F_SETFL, fl & ~O_DIRECT) != 0) {
        return ErrnoError("cannot turn off direct I/O for");
      }
      direct_ = false;
      continue;
    }
    if (n < 0) return ErrnoError("cannot write");
    if (n == 0) return absl::InternalError(absl::StrCat("cannot write ", path_, ": no progress"));
    done += static_cast<size_t>(n);
    if (direct_ && done % kBlock != 0 && done < write_bytes) {
      // A short direct write left the rest misaligned: finish it through the page cache.
      const int fl = fcntl(fd_, F_GETFL);
      if (fl < 0 || fcntl(fd_, F_SETFL, fl & ~O_DIRECT) != 0) {
        return ErrnoError("cannot turn off direct I/O for");
      }
      direct_ = false;
    }
  }
  file_offset_ += static_cast<int64_t>(staged_);
  staged_ = 0;
  return absl::OkStatus();
}

absl::Status SequentialFileWriter::Finish() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is finished"));
  if (staged_ > 0) {
    // Direct I/O writes whole blocks: pad with zeros, then cut the file back to its length.
    const size_t padded = direct_ ? (staged_ + kBlock - 1) / kBlock * kBlock : staged_;
    std::memset(buffer_ + staged_, 0, padded - staged_);
    if (absl::Status s = Flush(padded); !s.ok()) return s;
  }
  if (ftruncate(fd_, appended_) != 0) return ErrnoError("cannot set the length of");
  if (fsync(fd_) != 0) return ErrnoError("cannot fsync");
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) return ErrnoError("cannot close");
  return absl::OkStatus();
}

}  // namespace ulysses::engine
