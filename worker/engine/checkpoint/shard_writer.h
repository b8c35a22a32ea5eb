// SequentialFileWriter: writes one file front to back through a block-aligned staging buffer,
// with O_DIRECT where the filesystem takes it. A checkpoint shard is hundreds of MB to GBs
// written once and not read again by this process: through the page cache each byte is copied
// into the kernel and later written back (on the 2-core CI box 2.2 s of system CPU and 4.2 s of
// wall for 697 MB, against 0.12 s and 0.85 s direct; docs/BENCHMARKS.md "Checkpoint stall"),
// and an asynchronous save's writer thread steals that CPU from training. Direct I/O needs the
// buffer, the file offset and the length aligned to the device's block: the staging buffer is
// aligned, every write but the last is a whole number of blocks, and the last is padded with
// zeros and the file truncated back to its length. Where O_DIRECT is refused (tmpfs, some
// network filesystems: EINVAL at open or at the first write) the same writes go through the
// page cache. Either way Finish() fsyncs: the bytes on disk are identical.
#ifndef ULYSSES_WORKER_ENGINE_CHECKPOINT_SHARD_WRITER_H_
#define ULYSSES_WORKER_ENGINE_CHECKPOINT_SHARD_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ulysses::engine {

class SequentialFileWriter {
 public:
  // Bytes staged per write (a multiple of kBlock).
  static constexpr size_t kChunkBytes = size_t{8} << 20;
  // The alignment direct I/O gets: 4 KiB covers 512-byte and 4 KiB logical blocks.
  static constexpr size_t kBlock = 4096;

  // Creates (or truncates) `path`. `direct` false: never O_DIRECT (the page cache path).
  static absl::StatusOr<std::unique_ptr<SequentialFileWriter>> Create(const std::string& path,
                                                                      bool direct = true);
  ~SequentialFileWriter();
  SequentialFileWriter(const SequentialFileWriter&) = delete;
  SequentialFileWriter& operator=(const SequentialFileWriter&) = delete;

  absl::Status Append(const void* data, size_t size);
  absl::Status AppendZeros(size_t size);
  // Writes what is staged, sets the file's length to the bytes appended, fsyncs and closes.
  absl::Status Finish();

  int64_t bytes() const { return appended_; }
  // Whether the writes went around the page cache (false after a fallback).
  bool direct() const { return direct_; }

 private:
  SequentialFileWriter(std::string path, int fd, bool direct, char* buffer);
  absl::Status Flush(size_t write_bytes);  // writes staged bytes [0, write_bytes)
  absl::Status ErrnoError(const char* what) const;

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  char* buffer_ = nullptr;   // kChunkBytes, kBlock-aligned
  size_t staged_ = 0;        // bytes in buffer_
  int64_t file_offset_ = 0;  // where buffer_[0] goes
  int64_t appended_ = 0;
};

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_CHECKPOINT_SHARD_WRITER_H_
