// The real ulysses-coordinator and the real ulysses-worker agent (docs/SECURITY.md, "Paths"
// and "Worker reports"): the rank gets the checkpoint directory the coordinator checked, as
// data it cannot re-interpret; the agent refuses an assignment whose paths lie outside its
// own roots before a rank starts; an exit 0 without the final stage's checkpoint does not
// make a job SUCCEEDED. The engine is a stand-in script that records the spec document and
// argv the agent started it with and exits 0 without training: a rank that claims success.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc/grpc_util.h"
#include "common/spec/job_spec_parser.h"
#include "gtest/gtest.h"
#include "tests/coordinator/auth_channel.h"
#include "tests/coordinator/coordinator_process.h"
#include "tests/coordinator/test_util.h"
#include "ulysses/v1/job_service.grpc.pb.h"

namespace ulysses::coordinator::testing {
namespace {

namespace fs = std::filesystem;
using ::ulysses::testing::ReadFile;

constexpr char kRecordingEngine[] = R"(#!/bin/sh
# argv: rank -f SPEC ...; records SPEC and argv, then "succeeds" without a checkpoint.
out="$(dirname "$0")/seen"
mkdir -p "$out"
cp "$3" "$out/spec-$$.yaml"
printf '%s\n' "$@" > "$out/argv-$$.txt"
exit 0
)";

// The real ulysses-worker as a child process, killed when the test ends.
class WorkerProcess {
 public:
  WorkerProcess(const std::vector<std::string>& args, const std::string& log) {
    const char* dir = std::getenv("ULYSSES_BIN_DIR");
    std::string bin = std::string(dir ? dir : "build/bin") + "/ulysses-worker";
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      FILE* f = std::fopen(log.c_str(), "a");
      if (f != nullptr) {
        dup2(fileno(f), STDOUT_FILENO);
        dup2(fileno(f), STDERR_FILENO);
      }
      std::vector<std::string> copy = args;
      std::vector<char*> argv{bin.data()};
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
  }
  ~WorkerProcess() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

 private:
  pid_t pid_ = -1;
};

v1::Job GetJobAs(int port, const std::string& token, const std::string& id) {
  auto stub = v1::JobService::NewStub(MakeTestChannel(port, WithToken(token)));
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::GetJobResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(5));
  (void)stub->GetJob(&ctx, req, &resp);
  return resp.job();
}

bool Ended(const v1::Job& j) {
  return j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED ||
         j.state() == v1::JOB_STATE_CANCELLED;
}

std::vector<std::string> Recorded(const std::string& seen, const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(seen, ec)) {
    if (absl::StartsWith(e.path().filename().string(), prefix)) out.push_back(e.path().string());
  }
  return out;
}

TEST(WorkerTrustProcessTest, TheRankGetsTheCheckedDirTheAgentConfinesAndExit0NeedsACheckpoint) {
  TempDir dir;
  const std::string tokens = dir.Sub("tokens.yaml");
  WriteTestTokenFile(tokens);
  const std::string root = fs::weakly_canonical(dir.Sub("ckpt")).string();
  fs::create_directories(root + "/w9");  // The worker's own, narrower root.
  std::vector<std::string> args = SecureArgs(dir.Sub("state"), tokens);
  args.insert(args.end(), {"--checkpoint-root", root});
  CoordinatorProcess coord(args, dir.Sub("coordinator.log"));
  ASSERT_TRUE(coord.ReadPorts());

  const std::string engine = dir.Sub("engine/ulysses-train");
  fs::create_directories(dir.Sub("engine"));
  std::ofstream(engine) << kRecordingEngine;
  ASSERT_EQ(chmod(engine.c_str(), 0755), 0);
  std::ofstream(dir.Sub("w9.token")) << TestTokens::kWorkerW9 << "\n";
  ASSERT_EQ(chmod(dir.Sub("w9.token").c_str(), 0600), 0);
  const std::string worker_log = dir.Sub("worker.log");
  WorkerProcess worker({"--coordinator", absl::StrCat("127.0.0.1:", coord.port()), "--name", "w9",
                        "--work-dir", dir.Sub("work"), "--engine-bin", engine, "--ca",
                        ::ulysses::testing::TestCerts().ca, "--token-file", dir.Sub("w9.token"),
                        "--checkpoint-root", root + "/w9", "--grace-period-s", "1"},
                       worker_log);

  auto alice =
      v1::JobService::NewStub(MakeTestChannel(coord.port(), WithToken(TestTokens::kAlice)));
  auto submit = [&](const std::string& name, const std::string& checkpoint) {
    v1::SubmitJobRequest req;
    std::string yaml = JobYaml(name, "    - {seq_len: 64, steps: 2}\n", "{max_failures: 1}");
    if (!checkpoint.empty()) absl::StrAppend(&yaml, "  checkpoint: {dir: \"", checkpoint, "\"}\n");
    req.set_spec_yaml(yaml);
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    grpc::Status st = alice->SubmitJob(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.job_id();
  };
  auto wait_end = [&](const std::string& id) {
    v1::Job j;
    EXPECT_TRUE(PollUntil([&] { return Ended(j = GetJobAs(coord.port(), TestTokens::kAlice, id)); },
                          std::chrono::seconds(60)))
        << id << " did not end: " << j.reason() << "\n"
        << ReadFile(worker_log);
    return j;
  };

  // A directory YAML would misread as an override value (": " makes a mapping).
  const std::string odd = root + "/w9/team: a [b]";
  const std::string id = submit("claims", odd);
  ASSERT_FALSE(id.empty());
  v1::Job job = wait_end(id);
  // The stand-in engine exited 0 without committing a checkpoint: not a success.
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "without a committed checkpoint")) << job.reason();
  // The rank read exactly the checked directory: its spec document plus its --set flags,
  // parsed as ulysses-train parses them.
  const std::string seen = dir.Sub("engine/seen");
  std::vector<std::string> specs = Recorded(seen, "spec-");
  std::vector<std::string> argvs = Recorded(seen, "argv-");
  ASSERT_EQ(specs.size(), 1u) << ReadFile(worker_log);
  ASSERT_EQ(argvs.size(), 1u);
  spec::ParseOptions options;
  std::vector<std::string> argv = absl::StrSplit(ReadFile(argvs[0]), '\n');
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--set") options.overrides.push_back(argv[i + 1]);
  }
  absl::StatusOr<spec::JobSpec> rank_spec = spec::LoadJobSpecFile(specs[0], options);
  ASSERT_TRUE(rank_spec.ok()) << rank_spec.status();
  EXPECT_EQ(rank_spec->checkpoint.dir, odd);
  EXPECT_EQ(job.checkpoint_dir(), odd);

  // The coordinator's default directory (<root>/job-...) is outside the worker's root: the
  // agent refuses it and no rank starts.
  const std::string outside = submit("outside", "");
  ASSERT_FALSE(outside.empty());
  job = wait_end(outside);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(), "outside this worker's roots")) << job.reason();
  EXPECT_EQ(Recorded(seen, "spec-").size(), 1u);
}

}  // namespace
}  // namespace ulysses::coordinator::testing
