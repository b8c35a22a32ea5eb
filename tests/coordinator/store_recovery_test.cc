// The store never bricks (issue 9, point 6): a full disk makes the coordinator
// NOT_SERVING with the reason on /healthz and ulysses_store_writable 0, loses nothing it
// acknowledged, keeps answering reads, and serves again by itself once writes succeed.
// The full disk is real SQLite: state_max_bytes caps the database file (max_page_count),
// a filler table stands in for other files on the disk, and deleting it frees space.
#include <sqlite3.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/coordinator/grpc_fixture.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::PollUntil;
using testing::TestTokens;
using testing::WithToken;

constexpr int64_t kCapBytes = 2 << 20;

void ExecSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

class StoreRecoveryTest : public testing::CoordinatorServerTest {
 protected:
  void SetUp() override {
    // Most of the capped file is taken by "other files" before the coordinator starts.
    {
      auto store = Store::Open(dir_.path());
      ASSERT_TRUE(store.ok()) << store.status();
    }
    // The database gets three quarters of state_max_bytes (the log files the rest):
    // 1.5 MiB here, of which the filler leaves ~400 KB.
    ExecSql(dir_.path() + "/coordinator.db",
            "CREATE TABLE filler(b BLOB); INSERT INTO filler VALUES(zeroblob(1170000));");
    config_.state_max_bytes = kCapBytes;
    testing::CoordinatorServerTest::SetUp();
  }

  std::string Scrape(const std::string& path) {
    httplib::Client http("127.0.0.1", server_->metrics_port());
    auto res = http.Get(path.c_str());
    if (!res) return "";
    return absl::StrCat(res->status, "\n", res->body);
  }
};

std::string JobWithLabel(const std::string& name, size_t bytes) {
  std::string y = testing::JobYaml(name, "    - {seq_len: 64, steps: 1}\n");
  // metadata: {name: X} -> add labels with one long value.
  const std::string key = "  name: " + name + "\n";
  y.replace(y.find(key), key.size(),
            key + "  labels: {note: \"" + std::string(bytes, 'n') + "\"}\n");
  return y;
}

TEST_F(StoreRecoveryTest, FullDiskStopsWritesLosesNothingAndRecoversWhenSpaceIsFreed) {
  std::vector<std::string> accepted;
  absl::Status full;
  for (int i = 0; i < 40 && full.ok(); ++i) {
    auto id = Submit(JobWithLabel(absl::StrCat("fill-", i), 60000));
    if (id.ok()) {
      accepted.push_back(*id);
    } else {
      full = id.status();
    }
  }
  ASSERT_FALSE(full.ok()) << "the capped store never filled";
  ASSERT_FALSE(accepted.empty());
  EXPECT_TRUE(absl::IsUnavailable(full)) << full;
  EXPECT_THAT(std::string(full.message()), HasSubstr("full"));

  // NOT_SERVING, with the reason and the metric; reads still answer. (The daemon's
  // main loop copies the state into the gRPC health service; here the test does.)
  server_->UpdateHealth();
  EXPECT_FALSE(Serving());
  std::string health = Scrape("/healthz");
  EXPECT_THAT(health, HasSubstr("503"));
  EXPECT_THAT(health, HasSubstr("full"));
  // Not ready (the Service stops sending traffic), but live: kubelet's livenessProbe must
  // not restart a coordinator that recovers in place (deploy/k8s/base/coordinator.yaml).
  std::string ready = Scrape("/readyz");
  EXPECT_THAT(ready, HasSubstr("503"));
  EXPECT_THAT(ready, HasSubstr("full"));
  EXPECT_THAT(Scrape("/livez"), HasSubstr("200\nok"));
  std::string metrics = Scrape("/metrics");
  EXPECT_THAT(metrics, HasSubstr("ulysses_store_writable 0"));
  EXPECT_THAT(metrics, HasSubstr("ulysses_store_write_errors_total{kind=\"io\"} 1"));
  for (const std::string& id : accepted) EXPECT_EQ(GetJob(id).id(), id);
  auto refused = Submit(JobWithLabel("while-full", 10));
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();

  // Free space, as an operator would; the coordinator notices by itself.
  ExecSql(dir_.path() + "/coordinator.db", "DELETE FROM filler;");
  ASSERT_TRUE(PollUntil(
      [&] {
        server_->UpdateHealth();
        return Serving();
      },
      std::chrono::seconds(10)));
  EXPECT_THAT(Scrape("/metrics"), HasSubstr("ulysses_store_writable 1"));
  EXPECT_THAT(Scrape("/healthz"), HasSubstr("200"));
  EXPECT_THAT(Scrape("/readyz"), HasSubstr("200\nok"));
  auto after = Submit(JobWithLabel("after", 10));
  ASSERT_TRUE(after.ok()) << after.status();

  // Memory equals the store: a restart shows exactly the acknowledged jobs, and the one
  // whose write failed was never created.
  std::vector<std::string> expected = accepted;
  expected.push_back(*after);
  RestartServer();
  v1::ListJobsRequest req;
  req.set_page_size(1000);
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(jobs_->ListJobs(&ctx, req, &resp).ok());
  std::vector<std::string> listed;
  for (const v1::Job& j : resp.jobs()) listed.push_back(j.id());
  EXPECT_THAT(listed, ::testing::UnorderedElementsAreArray(expected));
}

// /livez answers whether the ticker turns, without the coordinator's lock: live while
// ticks complete, 503 naming the stall once none completed for the limit.
TEST_F(StoreRecoveryTest, LivenessFollowsTheTickerNotTheStore) {
  EXPECT_THAT(Scrape("/livez"), HasSubstr("200\nok"));
  Coordinator* c = server_->coordinator();
  const int64_t now = SteadyMs();
  EXPECT_TRUE(c->LivenessAt(now, 60000).ok());
  // Ticks stop with the ticker thread; the last one then ages past the limit.
  c->Shutdown();
  absl::Status stalled = c->LivenessAt(now + 61000, 60000);
  EXPECT_TRUE(absl::IsUnavailable(stalled)) << stalled;
  EXPECT_THAT(std::string(stalled.message()), HasSubstr("no tick completed"));
  EXPECT_THAT(Scrape("/livez"), HasSubstr("200"));  // Within the limit still.
}

}  // namespace
}  // namespace ulysses::coordinator
