// JobLogFiles keeps a job's log files within their limit as written (after JSON escaping), all
// jobs' files within their share of state_max_bytes, and a refused job's lines off the disk.
#include "coordinator/job_log_files.h"

#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::coordinator {
namespace {

using ::ulysses::testing::TempDir;

int64_t FileBytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

int64_t JobBytes(const JobLogFiles& files, const std::string& job) {
  return FileBytes(files.JobDir(job) + "/log.jsonl") +
         FileBytes(files.JobDir(job) + "/log.1.jsonl");
}

// `n` lines of `job`, sequence numbers from `first`, each text `chars` control characters
// (\x01: 6 bytes each once escaped as \u0001).
std::vector<std::pair<std::string, v1::LogLine>> ControlLines(const std::string& job, int first,
                                                              int n, int chars) {
  std::vector<std::pair<std::string, v1::LogLine>> out;
  for (int i = 0; i < n; ++i) {
    v1::LogLine line;
    line.set_sequence(first + i);
    line.set_text(std::string(static_cast<size_t>(chars), '\x01'));
    out.emplace_back(job, std::move(line));
  }
  return out;
}

// The finding: a 64 KiB limit left 43.4 MB on disk (escaping x6, and a batch larger than half
// the limit was written whole). Now the files hold at most the limit as written, newest kept.
TEST(JobLogFilesTest, AJobsFilesStayWithinTheirLimitAfterEscaping) {
  TempDir dir;
  const int64_t limit = 64 * 1024;
  JobLogFiles files(dir.path() + "/logs", limit);
  int seq = 1;
  files.Append(ControlLines("job-1", seq, 200, 1000));  // One batch of ~1.2 MB escaped.
  seq += 200;
  EXPECT_LE(JobBytes(files, "job-1"), limit);
  for (int batch = 0; batch < 50; ++batch, seq += 5) {
    files.Append(ControlLines("job-1", seq, 5, 1000));
    EXPECT_LE(JobBytes(files, "job-1"), limit) << "after batch " << batch;
  }
  EXPECT_EQ(files.Bytes("job-1"), JobBytes(files, "job-1"));
  std::vector<v1::LogLine> kept = files.Load("job-1");
  ASSERT_FALSE(kept.empty());
  EXPECT_EQ(kept.back().sequence(), seq - 1);  // The newest line is kept.
  struct stat st;
  ASSERT_EQ(stat((files.JobDir("job-1") + "/log.jsonl").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // Like coordinator.db.
}

TEST(JobLogFilesTest, TheTotalShareAndARefusingTenantKeepLinesOffTheDisk) {
  TempDir dir;
  JobLogFiles files(dir.path() + "/logs", 1 << 20, /*bytes_total=*/20000);
  for (int i = 0; i < 20; ++i) files.Append(ControlLines("job-1", 1 + i * 2, 2, 1000));
  EXPECT_LE(files.total_bytes(), 20000);
  EXPECT_GT(files.total_bytes(), 10000);
  EXPECT_EQ(files.total_bytes(), JobBytes(files, "job-1"));

  JobLogFiles quota(dir.path() + "/logs2", 1 << 20);
  int64_t asked = 0;
  quota.Append(ControlLines("job-2", 1, 3, 100), [&](const std::string& job, int64_t bytes) {
    EXPECT_EQ(job, "job-2");
    asked += bytes;
    return false;  // Its tenant is at its byte quota.
  });
  EXPECT_GT(asked, 3 * 600);  // It asked for the escaped size.
  EXPECT_EQ(JobBytes(quota, "job-2"), 0);
  EXPECT_TRUE(quota.Load("job-2").empty());
  // Removing a job's files gives its bytes back.
  files.Remove("job-1");
  EXPECT_EQ(files.total_bytes(), 0);
}

}  // namespace
}  // namespace ulysses::coordinator
