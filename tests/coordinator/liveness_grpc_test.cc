// Worker liveness with a SUSPECT window (docs/COORDINATOR.md "Worker liveness"), through
// the real gRPC API against an in-process coordinator (grpc_fixture.h): a worker silent
// past heartbeat_timeout_s is SUSPECT (no new work, its ranks keep running, its job is not
// restarted) and comes back without a restart when it speaks again; it is LOST after
// lost_after_s, or at once when a rank of its job reports a broken collective (exit 69).
// Also the version skew a coordinator accepts from workers (version_policy.h).
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc/channel.h"
#include "common/grpc/grpc_util.h"
#include "common/metrics/build_info.h"
#include "coordinator/version_policy.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "sqlite3.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"
#include "tests/testing/files.h"

namespace ulysses::coordinator {
namespace {

using testing::FakeWorker;
using testing::JobYaml;
using testing::PollUntil;
using testing::TestChannelOptions;
using testing::TestTokens;
using testing::WithToken;

class LivenessGrpcTest : public testing::CoordinatorServerTest {
 protected:
  // Silent for 1 s: SUSPECT; LOST only after 60 s (longer than any test here waits), so a
  // LOST below comes from the broken-collective rule, not the timer.
  void Configure(CoordinatorConfig* c) override {
    c->heartbeat_timeout_s = 1;
    c->lost_after_s = 60;
  }

  v1::WorkerState StateOf(const std::string& name) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    v1::ListWorkersResponse workers;
    EXPECT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
    for (const v1::Worker& w : workers.workers()) {
      if (w.name() == name) return w.state();
    }
    return v1::WORKER_STATE_UNSPECIFIED;
  }

  bool HasLogLine(const std::string& id, const std::string& text) {
    for (const v1::LogLine& l : Logs(id)) {
      if (absl::StrContains(l.text(), text)) return true;
    }
    return false;
  }

  // A 2-rank job running on two workers; returns rank -> (worker, assignment).
  std::map<int, std::pair<FakeWorker*, v1::Assignment>> RunTwoRankJob(FakeWorker& a, FakeWorker& b,
                                                                      std::string* id) {
    auto submitted = Submit(JobYaml("blip", "    - {seq_len: 256, steps: 40, sp_degree: 2}\n"));
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    *id = submitted.value_or("");
    auto assigned = CollectAssignments({&a, &b}, 2);
    EXPECT_EQ(assigned.size(), 2u);
    for (auto& [rank, wa] : assigned) wa.first->Started(wa.second.ref());
    EXPECT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
    return assigned;
  }
};

TEST_F(LivenessGrpcTest, ASilentWorkerIsSuspectGetsNoNewWorkAndComesBackWithoutARestart) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  std::string id;
  auto assigned = RunTwoRankJob(w1, w2, &id);
  ASSERT_EQ(assigned.size(), 2u);
  FakeWorker* silent = assigned[1].first;
  FakeWorker* speaking = assigned[0].first;
  const std::string silent_name = silent == &w1 ? "w1" : "w2";

  // The network cut: the session stays open, nothing arrives (a SIGSTOPped agent).
  silent->StopHeartbeats();
  ASSERT_TRUE(PollUntil([&] { return StateOf(silent_name) == v1::WORKER_STATE_SUSPECT; }));
  // The other rank keeps reporting; the job is not restarted.
  speaking->Progress(assigned[0].second.ref(), 3, 2.5);
  ASSERT_TRUE(PollUntil([&] { return GetJob(id).stages(0).progress().step() == 3; }));
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_TRUE(HasLogLine(id, "worker " + silent_name + " SUSPECT")) << "no log line";

  // No new work for a SUSPECT worker: an idle one that goes silent gets none, and gets
  // the job once it speaks again.
  FakeWorker& w3 = AddWorker("w3");
  w3.StopHeartbeats();
  ASSERT_TRUE(PollUntil([&] { return StateOf("w3") == v1::WORKER_STATE_SUSPECT; }));
  auto small = Submit(JobYaml("small", "    - {seq_len: 256, steps: 4}\n"));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE(w3.WaitAssignment(std::chrono::milliseconds(1500)))
      << "a SUSPECT worker was given new work";
  EXPECT_EQ(GetJob(*small).state(), v1::JOB_STATE_PENDING);
  w3.StartHeartbeats(std::chrono::milliseconds(100));
  auto a3 = w3.WaitAssignment(std::chrono::seconds(10));
  ASSERT_TRUE(a3) << "the worker got no work after it came back";
  EXPECT_EQ(a3->ref().job_id(), *small);

  // The silent worker speaks again (the same session): BUSY, same generation, no abort.
  silent->StartHeartbeats(std::chrono::milliseconds(100));
  ASSERT_TRUE(PollUntil([&] { return StateOf(silent_name) == v1::WORKER_STATE_BUSY; }));
  EXPECT_FALSE(speaking->WaitAbort(std::chrono::milliseconds(500)));
  EXPECT_FALSE(silent->WaitAbort(std::chrono::milliseconds(10)));
  job = GetJob(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_TRUE(HasLogLine(id, "worker " + silent_name + " answered again after"));
  ASSERT_TRUE(assigned[0].first->CommitLast(assigned[0].second));  // success needs it
  for (auto& [rank, wa] : assigned) wa.first->Exited(wa.second.ref(), 0);
  ASSERT_TRUE(WaitState(id, v1::JOB_STATE_SUCCEEDED));
  EXPECT_EQ(GetJob(id).restarts(), 0);
}

TEST_F(LivenessGrpcTest, ABrokenCollectiveMakesTheSuspectWorkerLostAtOnceAndRestartsTheJobOnce) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  std::string id;
  auto assigned = RunTwoRankJob(w1, w2, &id);
  ASSERT_EQ(assigned.size(), 2u);
  FakeWorker* silent = assigned[1].first;
  FakeWorker* speaking = assigned[0].first;
  const std::string silent_name = silent == &w1 ? "w1" : "w2";
  silent->StopHeartbeats();
  ASSERT_TRUE(PollUntil([&] { return StateOf(silent_name) == v1::WORKER_STATE_SUSPECT; }));
  EXPECT_EQ(GetJob(id).restarts(), 0);

  // Rank 0's collective with the silent worker's rank broke.
  speaking->Exited(assigned[0].second.ref(), 69, "allreduce: connection reset by peer");
  ASSERT_TRUE(PollUntil([&] { return StateOf(silent_name) == v1::WORKER_STATE_LOST; }))
      << "the SUSPECT worker was not declared LOST (lost_after_s is 60 s)";
  v1::Job job = GetJob(id);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.infra_failures(), 1);
  EXPECT_EQ(job.failures(), 0);
  ASSERT_GE(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LOST);
  EXPECT_TRUE(absl::StrContains(job.attempts(0).reason(), "while it was SUSPECT"))
      << job.attempts(0).reason();
  EXPECT_EQ(StateOf(speaking == &w1 ? "w1" : "w2"), v1::WORKER_STATE_IDLE);
}

// Without a SUSPECT worker a lost-peer exit is an ordinary infrastructure failure of the
// rank: nobody is declared LOST.
TEST_F(LivenessGrpcTest, ABrokenCollectiveWithEveryWorkerHeardFromLosesNoWorker) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  std::string id;
  auto assigned = RunTwoRankJob(w1, w2, &id);
  ASSERT_EQ(assigned.size(), 2u);
  assigned[0].first->Exited(assigned[0].second.ref(), 69);
  ASSERT_TRUE(PollUntil([&] { return GetJob(id).restarts() == 1; }));
  EXPECT_EQ(GetJob(id).attempts(0).outcome(), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_NE(StateOf("w1"), v1::WORKER_STATE_LOST);
  EXPECT_NE(StateOf("w2"), v1::WORKER_STATE_LOST);
}

class ShortLivenessGrpcTest : public testing::CoordinatorServerTest {
 protected:
  void Configure(CoordinatorConfig* c) override {
    c->heartbeat_timeout_s = 1;
    c->lost_after_s = 3;
  }
};

TEST_F(ShortLivenessGrpcTest, ASilenceLongerThanLostAfterEndsTheAttemptOnce) {
  FakeWorker& w1 = AddWorker("w1");
  FakeWorker& w2 = AddWorker("w2");
  auto id = Submit(JobYaml("cut", "    - {seq_len: 256, steps: 40, sp_degree: 2}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto assigned = CollectAssignments({&w1, &w2}, 2);
  ASSERT_EQ(assigned.size(), 2u);
  for (auto& [rank, wa] : assigned) wa.first->Started(wa.second.ref());
  ASSERT_TRUE(WaitState(*id, v1::JOB_STATE_RUNNING));
  FakeWorker* silent = assigned[1].first;
  FakeWorker* speaking = assigned[0].first;
  silent->StopHeartbeats();
  auto abort = speaking->WaitAbort(std::chrono::seconds(15));
  ASSERT_TRUE(abort) << "the survivor was not aborted after lost_after_s";
  EXPECT_TRUE(absl::StrContains(abort->reason(), "lost_after_s 3")) << abort->reason();
  v1::Job job = GetJob(*id);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.attempts(0).outcome(), v1::ATTEMPT_OUTCOME_LOST);
}

// Version skew (coordinator/version_policy.h): a worker of the previous minor version, as a
// recorded RegisterRequest of release 0.0.9 (testdata/worker-0.0.9), registers with this
// coordinator; versions outside the policy are refused naming both versions and the fix, and
// leave no worker behind.
class VersionSkewGrpcTest : public testing::CoordinatorServerTest {
 protected:
  absl::Status RegisterAs(const v1::RegisterRequest& request) {
    auto stub = v1::WorkerService::NewStub(Channel(testing::WithWorkerCert(request.name())));
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    v1::RegisterResponse response;
    return FromGrpcStatus(stub->Register(&ctx, request, &response));
  }
  bool Listed(const std::string& name) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(5));
    v1::ListWorkersResponse workers;
    EXPECT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &workers).ok());
    for (const v1::Worker& w : workers.workers()) {
      if (w.name() == name) return true;
    }
    return false;
  }
};

TEST_F(VersionSkewGrpcTest, APreviousMinorWorkerRegistersAndOtherVersionsAreRefusedWithTheFix) {
  const std::string own = metrics::BuildVersion();
  if (own.rfind("0.1.", 0) != 0) {
    GTEST_SKIP() << "this coordinator is " << own << ": record the previous release's worker "
                 << "messages in tests/coordinator/testdata/ and point this test at them";
  }
  const char* source = std::getenv("ULYSSES_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "ULYSSES_SOURCE_DIR is not set (run through ctest)";
  const std::string text = ::ulysses::testing::ReadFile(
      std::string(source) + "/tests/coordinator/testdata/worker-0.0.9/register.textproto");
  v1::RegisterRequest recorded;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &recorded)) << text;
  ASSERT_EQ(recorded.agent_version(), "0.0.9");
  absl::Status s = RegisterAs(recorded);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(Listed("old-worker"));

  v1::RegisterRequest current = recorded;
  current.set_name("current-worker");
  current.set_agent_version(own);
  EXPECT_TRUE(RegisterAs(current).ok());

  struct Refused {
    std::string version, fix;
  };
  for (const Refused& r : {Refused{"0.2.0", "upgrade the coordinator to 0.2 first"},
                           Refused{"1.1.0", "upgrade the coordinator to 1.1 first"},
                           Refused{"0.1", "is not a release version"}}) {
    SCOPED_TRACE(r.version);
    v1::RegisterRequest request = recorded;
    request.set_name("skewed-worker");
    request.set_agent_version(r.version);
    s = RegisterAs(request);
    ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), r.version)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), own)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), r.fix)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "accepts 0.0.x and 0.1.x")) << s;
  }
  EXPECT_FALSE(Listed("skewed-worker"));
}

// ulyssesctl sends its release as `ulysses-version` metadata (common/grpc/channel.h): the
// same policy as for workers, on every JobService call; a call without it is not checked.
TEST_F(VersionSkewGrpcTest, AClientOfThePreviousMinorIsServedAndOtherVersionsAreRefusedWithTheFix) {
  const std::string own = metrics::BuildVersion();
  if (own.rfind("0.1.", 0) != 0) {
    GTEST_SKIP() << "this coordinator is " << own << ": update the versions below";
  }
  auto list = [&](const std::string& version) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    if (!version.empty()) ctx.AddMetadata(kVersionMetadata, version);
    v1::ListJobsResponse response;
    return FromGrpcStatus(jobs_->ListJobs(&ctx, v1::ListJobsRequest(), &response));
  };
  for (const std::string& ok : {std::string("0.0.9"), own, std::string("")}) {
    absl::Status s = list(ok);
    EXPECT_TRUE(s.ok()) << ok << ": " << s;
  }
  struct Refused {
    std::string version, fix;
  };
  for (const Refused& r :
       {Refused{"0.2.0", "upgrade the coordinator to 0.2 first (or use a ulyssesctl of 0.1)"},
        Refused{"1.1.0", "upgrade the coordinator to 1.1 first"},
        Refused{"0.1", "is not a release version"}}) {
    SCOPED_TRACE(r.version);
    absl::Status s = list(r.version);
    ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "ulyssesctl version")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), r.version)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), own)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), r.fix)) << s;
  }
  // Streams too (GetJobLogs): refused before anything is sent.
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(10));
  ctx.AddMetadata(kVersionMetadata, "0.2.0");
  v1::GetJobLogsRequest request;
  request.set_job_id("job-000001");
  auto reader = jobs_->GetJobLogs(&ctx, request);
  v1::GetJobLogsResponse response;
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// max_heartbeats_per_s: the interval asked of workers grows with the cluster (fixture:
// heartbeat_interval_s 0.2, heartbeat_timeout_s 2, so at most 1 s), a registering worker gets
// the current one and a connected worker learns a new one from its next Ack, once.
class HeartbeatRateGrpcTest : public testing::CoordinatorServerTest {
 protected:
  void Configure(CoordinatorConfig* c) override { c->max_heartbeats_per_s = 2; }
};

TEST_F(HeartbeatRateGrpcTest, TheIntervalGrowsWithTheClusterAndReachesConnectedWorkersInAnAck) {
  FakeWorker& w1 = AddWorker("w1");
  EXPECT_EQ(w1.heartbeat_interval_ms(), 200);  // No worker counted yet: heartbeat_interval_s.
  AddWorker("w2");
  AddWorker("w3");
  server_->coordinator()->TickForTesting();  // 3 workers / 2 per s = 1.5 s, capped at 1 s.
  const uint64_t first = w1.Heartbeat(/*request_ack=*/true);
  std::optional<v1::Ack> ack = w1.WaitAck(first);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->heartbeat_interval_ms(), 1000);
  const uint64_t second = w1.Heartbeat(/*request_ack=*/true);
  ack = w1.WaitAck(second);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->heartbeat_interval_ms(), 0);  // Told already.
  EXPECT_EQ(AddWorker("w4").heartbeat_interval_ms(), 1000);
}

// The workers row `id` as the store holds it: (host, last_seen_ms); nullopt when none.
std::optional<std::pair<std::string, int64_t>> StoredWorker(const std::string& state_dir,
                                                            const std::string& id) {
  sqlite3* db = nullptr;
  const std::string path = state_dir + "/coordinator.db";
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return std::nullopt;
  }
  std::optional<std::pair<std::string, int64_t>> out;
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT host, last_seen_ms FROM workers WHERE id = ?", -1, &stmt,
                         nullptr) == SQLITE_OK &&
      sqlite3_bind_text(stmt, 1, id.c_str(), -1, SQLITE_TRANSIENT) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    out.emplace(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)),
                sqlite3_column_int64(stmt, 1));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

using ReRegistrationGrpcTest = testing::CoordinatorServerTest;

// After a coordinator restart every agent re-registers at once: one that changed nothing
// durable costs no store commit; one that did (here its host) is stored.
TEST_F(ReRegistrationGrpcTest, OnlyARegistrationThatChangesTheWorkerWritesTheStore) {
  FakeWorker& w = AddWorker("w1", "rack-a", "10.0.0.7");
  const auto first = StoredWorker(config_.state_dir, "w-w1");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->first, "10.0.0.7");
  // A later millisecond, so that a write of last_seen_ms would show.
  while (absl::ToUnixMillis(absl::Now()) <= first->second) {
  }
  ASSERT_TRUE(w.Register().ok());
  const auto unchanged = StoredWorker(config_.state_dir, "w-w1");
  ASSERT_TRUE(unchanged.has_value());
  EXPECT_EQ(unchanged->second, first->second) << "an unchanged re-registration was written";
  w.set_host("10.0.0.8");
  ASSERT_TRUE(w.Register().ok());
  const auto moved = StoredWorker(config_.state_dir, "w-w1");
  ASSERT_TRUE(moved.has_value());
  EXPECT_EQ(moved->first, "10.0.0.8");
  // And a restarted coordinator knows the new host.
  RestartServer();
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineAfter(&ctx, absl::Seconds(10));
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.workers_size(), 1);
  EXPECT_EQ(resp.workers(0).host(), "10.0.0.8");
}

TEST(VersionPolicyTest, TheOwnAndThePreviousMinorOfTheSameMajorAreAccepted) {
  for (const char* ok : {"0.4.0", "0.4.7", "0.3.0", "0.3.12", "0.4.1-rc1"}) {
    EXPECT_TRUE(CheckPeerVersion("worker", ok, "0.4.2").ok()) << ok;
  }
  for (const char* bad : {"0.2.9", "0.5.0", "1.4.2", "", "0.4", "x.y.z"}) {
    EXPECT_EQ(CheckPeerVersion("worker", bad, "0.4.2").code(),
              absl::StatusCode::kFailedPrecondition)
        << bad;
  }
  absl::Status old = CheckPeerVersion("worker", "0.2.9", "0.4.2");
  EXPECT_EQ(old.message(),
            "worker version 0.2.9 is not accepted by this coordinator (version 0.4.2; it accepts "
            "0.3.x and 0.4.x): upgrade the worker to 0.4");
  EXPECT_TRUE(CheckPeerVersion("worker", "1.0.3", "1.0.0").ok());
  EXPECT_FALSE(CheckPeerVersion("worker", "0.9.0", "1.0.0").ok());   // Another major.
  EXPECT_TRUE(CheckPeerVersion("worker", "7.7.7", "unknown").ok());  // Development build.
  // The finding: a 7 KB forged version was echoed whole. It is quoted at most 32 printable
  // bytes long, with its size.
  absl::Status forged = CheckPeerVersion("ulyssesctl", std::string(7000, '9') + "\x1b[2J", "0.4.2");
  EXPECT_EQ(forged.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LT(forged.message().size(), 300u) << forged.message();
  EXPECT_TRUE(absl::StrContains(forged.message(), "... (7004 bytes)")) << forged.message();
  EXPECT_EQ(forged.message().find('\x1b'), std::string::npos);
}

// The finding: the version check was advisory (omitting the header passed). ulyssesctl names
// itself in its user-agent, and a call from it without the header is refused; a plain gRPC
// client (grpcurl, these tests' stubs) is not asked for one.
TEST_F(LivenessGrpcTest, UlyssesctlWithoutItsVersionHeaderIsRefused) {
  TestChannelOptions as_ctl = WithToken(TestTokens::kAdmin);
  as_ctl.user_agent = absl::StrCat(kClientProduct, "/", metrics::BuildVersion());
  auto ctl = v1::JobService::NewStub(Channel(as_ctl));
  auto list = [&](v1::JobService::Stub* stub, bool with_header) {
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    if (with_header) ctx.AddMetadata(kVersionMetadata, metrics::BuildVersion());
    v1::ListJobsResponse resp;
    return stub->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
  };
  grpc::Status refused = list(ctl.get(), false);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "sent no ulysses-version header"))
      << refused.error_message();
  EXPECT_TRUE(list(ctl.get(), true).ok());
  EXPECT_TRUE(list(jobs_.get(), false).ok());  // Not ulyssesctl: not asked.
}

}  // namespace
}  // namespace ulysses::coordinator
