// common/process/host_memory.h: the cgroup files are read from a fake cgroup root (a temporary
// directory), /proc/meminfo and sysconf from this machine.
#include "common/process/host_memory.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::process {
namespace {

using ::ulysses::testing::TempDir;

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(HostMemoryTest, ACgroupFileIsABytesCountOrZeroForNoLimitAndForAnythingElse) {
  TempDir dir;
  const std::string f = dir.Sub("memory.max");
  Write(f, "8589934592\n");
  EXPECT_EQ(ReadCgroupBytes(f), int64_t{8589934592});
  Write(f, "max\n");
  EXPECT_EQ(ReadCgroupBytes(f), 0);
  Write(f, "9223372036854771712\n");  // cgroup v1's "no limit"
  EXPECT_EQ(ReadCgroupBytes(f), 0);
  Write(f, "99999999999999999999999\n");  // beyond int64
  EXPECT_EQ(ReadCgroupBytes(f), 0);
  Write(f, "-5\n");
  EXPECT_EQ(ReadCgroupBytes(f), 0);
  Write(f, "lots\n");
  EXPECT_EQ(ReadCgroupBytes(f), 0);
  EXPECT_EQ(ReadCgroupBytes(dir.Sub("absent")), 0);
}

TEST(HostMemoryTest, TheLimitIsCgroupV2sElseV1sAndCapsWhatIsAvailable) {
  TempDir v2;
  EXPECT_EQ(CgroupMemoryLimitBytes(v2.path()), 0);  // No files: no limit.
  const int64_t unlimited = AvailableHostMemoryBytes(v2.path());
  EXPECT_GT(unlimited, 0);  // MemAvailable of this machine.
  EXPECT_LE(unlimited, PhysicalMemoryBytes());

  // 1 GiB limit, 768 MiB used: 256 MiB left (this machine has more than that available).
  ASSERT_GT(unlimited, int64_t{256} << 20);
  Write(v2.Sub("memory.max"), std::to_string(int64_t{1} << 30));
  Write(v2.Sub("memory.current"), std::to_string(int64_t{768} << 20));
  EXPECT_EQ(CgroupMemoryLimitBytes(v2.path()), int64_t{1} << 30);
  EXPECT_EQ(AvailableHostMemoryBytes(v2.path()), int64_t{256} << 20);

  // cgroup v1: memory/memory.limit_in_bytes and memory/memory.usage_in_bytes.
  TempDir v1;
  ASSERT_TRUE(std::filesystem::create_directory(v1.Sub("memory")));
  Write(v1.Sub("memory/memory.limit_in_bytes"), std::to_string(int64_t{2} << 30));
  Write(v1.Sub("memory/memory.usage_in_bytes"), std::to_string((int64_t{2} << 30) - 4096));
  EXPECT_EQ(CgroupMemoryLimitBytes(v1.path()), int64_t{2} << 30);
  EXPECT_EQ(AvailableHostMemoryBytes(v1.path()), 4096);

  // A cgroup over its limit has nothing left, not a negative amount.
  Write(v2.Sub("memory.current"), std::to_string(int64_t{2} << 30));
  EXPECT_EQ(AvailableHostMemoryBytes(v2.path()), 0);
}

}  // namespace
}  // namespace ulysses::process
