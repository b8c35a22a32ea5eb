#include "worker/engine/checkpoint/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/files.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::engine {
namespace {

using ::ulysses::testing::ReadFile;
using ::ulysses::testing::TempDir;

constexpr size_t kChunk = SequentialFileWriter::kChunkBytes;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen() & 0xFF);
  return s;
}

// Whether `dir`'s filesystem takes O_DIRECT (then the writer must use it).
bool DirectIoWorks(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  unlink(probe.c_str());
  return fd >= 0;
}

// Appends in pieces of the given sizes (zeros where the size is negative) and checks the file
// holds exactly the concatenation, for direct and page-cache writes alike.
void WriteAndCheck(const std::vector<long>& pieces, bool direct) {
  TempDir dir;
  const std::string path = dir.path() + "/f.bin";
  auto w = SequentialFileWriter::Create(path, direct);
  ASSERT_TRUE(w.ok()) << w.status();
  std::string expected;
  uint32_t seed = 1;
  for (long piece : pieces) {
    if (piece < 0) {
      ASSERT_TRUE((*w)->AppendZeros(static_cast<size_t>(-piece)).ok());
      expected.append(static_cast<size_t>(-piece), '\0');
    } else {
      const std::string bytes = RandomBytes(static_cast<size_t>(piece), seed++);
      ASSERT_TRUE((*w)->Append(bytes.data(), bytes.size()).ok());
      expected += bytes;
    }
  }
  EXPECT_EQ((*w)->bytes(), static_cast<int64_t>(expected.size()));
  const bool went_direct = (*w)->direct();
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(went_direct, direct && DirectIoWorks(dir.path()));
  EXPECT_EQ(std::filesystem::file_size(path), expected.size());
  EXPECT_TRUE(ReadFile(path) == expected) << "contents differ (direct " << went_direct << ")";
}

TEST(SequentialFileWriterTest, FileHoldsExactlyTheBytesAppendedAcrossChunksDirectOrNot) {
  const std::vector<std::vector<long>> cases = {
      {},   // empty file
      {1},  // less than a block
      {4095},
      {4096},
      {4097},                                  // around one block
      {32, 1000, -24, 3000},                   // a shard's prefix, table, padding, data
      {static_cast<long>(kChunk) - 1, 2},      // a piece ending one byte short of a chunk
      {static_cast<long>(kChunk), 5},          // exactly one chunk, then a tail
      {3, static_cast<long>(2 * kChunk) + 7},  // one piece over two chunk boundaries
      {-static_cast<long>(kChunk) - 9, 100},   // zeros over a chunk boundary
  };
  for (bool direct : {true, false}) {
    for (const auto& pieces : cases) {
      SCOPED_TRACE(::testing::Message() << "direct " << direct << ", " << pieces.size()
                                        << " pieces, first " << (pieces.empty() ? 0 : pieces[0]));
      WriteAndCheck(pieces, direct);
    }
  }
}

TEST(SequentialFileWriterTest, ReplacesAnOlderLongerFileAndRefusesWritesAfterFinish) {
  TempDir dir;
  const std::string path = dir.path() + "/f.bin";
  {
    auto w = SequentialFileWriter::Create(path);
    ASSERT_TRUE(w.ok());
    const std::string big = RandomBytes(3 * 4096 + 11, 7);
    ASSERT_TRUE((*w)->Append(big.data(), big.size()).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto w = SequentialFileWriter::Create(path);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append("abc", 3).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(ReadFile(path), "abc");
  const absl::Status after = (*w)->Append("d", 1);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  EXPECT_EQ((*w)->Finish().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SequentialFileWriterTest, UnwritablePathIsAnErrorNamingIt) {
  TempDir dir;
  const std::string path = dir.path() + "/missing-dir/f.bin";
  auto w = SequentialFileWriter::Create(path);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(path), std::string::npos) << w.status();
}

}  // namespace
}  // namespace ulysses::engine
