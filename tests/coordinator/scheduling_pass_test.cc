// Scheduling passes are asked for by events and run by the ticker (coordinator.h
// RequestScheduleLocked / MaybeScheduleLocked): a Coordinator whose ticker is not started,
// driven by its public calls, so that when a pass runs is decided by the test alone.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "coordinator/config.h"
#include "coordinator/coordinator.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace ulysses::coordinator {
namespace {

class CountingSink : public WorkerSink {
 public:
  void Send(const v1::CoordinatorMessage& m) override { assignments += m.has_assignment(); }
  void Close(const absl::Status&) override {}
  int assignments = 0;
};

// The `_count` sample of ulysses_scheduling_pass_seconds in the registry's exposition.
int64_t PassCount(const metrics::Registry& registry) {
  const std::string text = registry.Serialize();
  const std::string key = "ulysses_scheduling_pass_seconds_count ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + key.size()));
}

TEST(SchedulingPassTest, EventsAskForAPassAndOneTickerPassPlacesEveryQueuedJob) {
  testing::TempDir dir;
  CoordinatorConfig config;
  config.state_dir = dir.path();
  ASSERT_TRUE(ValidateAndFinalize(&config).ok());
  metrics::Registry registry;
  std::vector<CountingSink> sinks(4);  // Outlive the coordinator (it closes them).
  absl::StatusOr<std::unique_ptr<Coordinator>> created = Coordinator::Create(config, &registry);
  ASSERT_TRUE(created.ok()) << created.status();
  Coordinator& coordinator = **created;  // Its ticker is not started.
  auth::Principal admin;
  admin.user = "ops";
  admin.role = auth::Role::kAdmin;

  // Four workers of two slots come back (a reconnect storm in miniature) ...
  for (int i = 0; i < 4; ++i) {
    v1::RegisterRequest reg;
    reg.set_name(absl::StrCat("node-", i));
    reg.set_host(absl::StrCat("10.0.0.", i + 1));
    reg.set_device("cpu");
    reg.set_capacity(2);
    absl::StatusOr<v1::RegisterResponse> r = coordinator.Register(reg, admin);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(coordinator.OpenSession(r->worker_id(), admin, &sinks[i]).ok());
  }
  // ... and six two-rank jobs are submitted: four fit.
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) {
    v1::SubmitJobRequest submit;
    submit.set_spec_yaml(testing::JobYaml(absl::StrCat("pass-", i),
                                          "    - {seq_len: 64, steps: 4, sp_degree: 2}\n"));
    absl::StatusOr<v1::SubmitJobResponse> s = coordinator.SubmitJob(submit, admin);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->job().state(), v1::JOB_STATE_PENDING);
    ids.push_back(s->job_id());
  }
  // Ten events, no pass yet: none ran inline.
  EXPECT_EQ(PassCount(registry), 0);
  for (const CountingSink& s : sinks) EXPECT_EQ(s.assignments, 0);

  coordinator.TickForTesting();
  EXPECT_EQ(PassCount(registry), 1);
  int assignments = 0;
  for (const CountingSink& s : sinks) assignments += s.assignments;
  EXPECT_EQ(assignments, 8);
  int scheduling = 0, pending = 0;
  for (const std::string& id : ids) {
    v1::GetJobRequest get;
    get.set_job_id(id);
    absl::StatusOr<v1::Job> job = coordinator.GetJob(get, admin);
    ASSERT_TRUE(job.ok()) << job.status();
    scheduling += job->state() == v1::JOB_STATE_SCHEDULING;
    pending += job->state() == v1::JOB_STATE_PENDING;
  }
  EXPECT_EQ(scheduling, 4);
  EXPECT_EQ(pending, 2);
}

}  // namespace
}  // namespace ulysses::coordinator
