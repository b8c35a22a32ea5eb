#include "common/file_tree.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "tests/testing/files.h"
#include "tests/testing/temp_dir.h"

namespace ulysses {
namespace {

using ::ulysses::testing::TempDir;

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  ASSERT_TRUE(Exists(path)) << path;
}

void MakeDir(const std::string& path) { ASSERT_EQ(mkdir(path.c_str(), 0755), 0) << path; }

using ::ulysses::testing::ReadFile;

TEST(RemoveTreeTest, RemovesNestedDirectoriesFilesAndEmptyDirs) {
  TempDir tmp;
  const std::string root = tmp.Sub("tree");
  MakeDir(root);
  MakeDir(root + "/a");
  MakeDir(root + "/a/b");
  MakeDir(root + "/a/b/c");
  MakeDir(root + "/empty");
  WriteFile(root + "/top.txt", "x");
  WriteFile(root + "/a/b/c/deep.bin", std::string(100000, 'y'));
  WriteFile(root + "/a/mid.txt", "z");
  ASSERT_EQ(symlink("a/mid.txt", (root + "/inner-link").c_str()), 0);

  ASSERT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(Exists(root));
  EXPECT_TRUE(Exists(tmp.path()));  // Only the named tree goes.
}

TEST(RemoveTreeTest, NeverFollowsSymlinksOutOfTheTree) {
  TempDir tmp;
  const std::string outside = tmp.Sub("outside");
  MakeDir(outside);
  MakeDir(outside + "/keep-dir");
  WriteFile(outside + "/keep.txt", "precious");
  WriteFile(outside + "/keep-dir/inner.txt", "also precious");

  const std::string root = tmp.Sub("tree");
  MakeDir(root);
  MakeDir(root + "/sub");
  ASSERT_EQ(symlink(outside.c_str(), (root + "/dir-link").c_str()), 0);
  ASSERT_EQ(symlink((outside + "/keep.txt").c_str(), (root + "/sub/file-link").c_str()), 0);
  ASSERT_EQ(symlink("/nonexistent/dangling", (root + "/dangling").c_str()), 0);

  ASSERT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(Exists(root));
  EXPECT_EQ(ReadFile(outside + "/keep.txt"), "precious");
  EXPECT_EQ(ReadFile(outside + "/keep-dir/inner.txt"), "also precious");
}

TEST(RemoveTreeTest, TopLevelSymlinkRemovesOnlyTheLink) {
  TempDir tmp;
  const std::string target = tmp.Sub("target");
  MakeDir(target);
  WriteFile(target + "/f.txt", "kept");
  const std::string link = tmp.Sub("link");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);

  ASSERT_TRUE(RemoveTree(link).ok());
  EXPECT_FALSE(Exists(link));
  EXPECT_EQ(ReadFile(target + "/f.txt"), "kept");
}

TEST(RemoveTreeTest, MissingPathIsOkAndPlainFileIsRemoved) {
  TempDir tmp;
  EXPECT_TRUE(RemoveTree(tmp.Sub("never-made")).ok());
  EXPECT_TRUE(RemoveTree(tmp.Sub("never-made/deeper")).ok());
  WriteFile(tmp.Sub("file"), "x");
  ASSERT_TRUE(RemoveTree(tmp.Sub("file")).ok());
  EXPECT_FALSE(Exists(tmp.Sub("file")));
  EXPECT_EQ(RemoveTree("").code(), absl::StatusCode::kInvalidArgument);
}

// Root ignores directory permissions, so the unremovable entry is made and removed by a
// child running as "nobody" when this test runs as root.
TEST(RemoveTreeTest, ReportsTheEntryItCannotRemoveAndRemovesTheRest) {
  TempDir tmp;
  ASSERT_EQ(chmod(tmp.path().c_str(), 0777), 0);
  const std::string root = tmp.Sub("tree");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // Child: only async-signal-safe-ish plain calls, result through the pipe.
    close(pipe_fds[0]);
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(2);
    if (mkdir(root.c_str(), 0755) != 0 || mkdir((root + "/locked").c_str(), 0755) != 0) _exit(3);
    std::ofstream(root + "/locked/stuck.txt") << "x";
    std::ofstream(root + "/free.txt") << "y";
    if (chmod((root + "/locked").c_str(), 0500) != 0) _exit(4);  // No unlink inside.
    const absl::Status status = RemoveTree(root);
    const std::string report = std::string(absl::StatusCodeToString(status.code())) + "|" +
                               std::string(status.message()) + "|" +
                               (Exists(root + "/free.txt") ? "free-left" : "free-gone") + "|" +
                               (Exists(root + "/locked/stuck.txt") ? "stuck-left" : "stuck-gone");
    if (write(pipe_fds[1], report.data(), report.size()) != static_cast<ssize_t>(report.size()))
      _exit(5);
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string report;
  char buf[512];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) report.append(buf, n);
  close(pipe_fds[0]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;

  EXPECT_EQ(report, absl::StrCat("FAILED_PRECONDITION|cannot remove \"", root,
                                 "/locked/stuck.txt\" (Permission denied); 2 more failed|",
                                 "free-gone|stuck-left"));
  // As the owner again (root, or the same user), the tree goes.
  ASSERT_EQ(chmod((root + "/locked").c_str(), 0755), 0);
  EXPECT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(Exists(root));
}

TEST(ListDirectoryTest, SortedEntriesWithTypesAndSymlinksNotFollowed) {
  TempDir tmp;
  MakeDir(tmp.Sub("b-dir"));
  WriteFile(tmp.Sub("a-file"), "x");
  ASSERT_EQ(symlink(tmp.Sub("b-dir").c_str(), tmp.Sub("c-link").c_str()), 0);

  auto entries = ListDirectory(tmp.path());
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "a-file");
  EXPECT_FALSE((*entries)[0].is_directory);
  EXPECT_EQ((*entries)[1].name, "b-dir");
  EXPECT_TRUE((*entries)[1].is_directory);
  EXPECT_EQ((*entries)[2].name, "c-link");
  EXPECT_FALSE((*entries)[2].is_directory);
  EXPECT_TRUE((*entries)[2].is_symlink);
}

TEST(ListDirectoryTest, MissingPathIsNotFoundAndFileIsFailedPrecondition) {
  TempDir tmp;
  EXPECT_EQ(ListDirectory(tmp.Sub("missing")).status().code(), absl::StatusCode::kNotFound);
  WriteFile(tmp.Sub("file"), "x");
  const auto status = ListDirectory(tmp.Sub("file")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find(tmp.Sub("file")), std::string::npos);
}

}  // namespace
}  // namespace ulysses
