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

// Workers that report their fabric (as ulysses-worker does at registration): a CUDA group that
// must span two workers waits on `sockets` workers, with the reason in the job, unless the spec
// allows TCP; on `efa` workers it is placed. CPU workers are never restricted.
class FabricPassTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.state_dir = dir_.path();
    ASSERT_TRUE(ValidateAndFinalize(&config_).ok());
    absl::StatusOr<std::unique_ptr<Coordinator>> created = Coordinator::Create(config_, &registry_);
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = std::move(*created);
    admin_.user = "ops";
    admin_.role = auth::Role::kAdmin;
  }

  // A worker of two slots, "cuda:0,cuda:1" (or "cpu,cpu") reporting `fabric`.
  void AddWorker(const std::string& name, v1::Fabric fabric, bool cuda = true) {
    v1::RegisterRequest reg;
    reg.set_name(name);
    reg.set_host("10.0.0.1");
    reg.set_device(cuda ? "cuda:0" : "cpu");
    for (int i = 0; i < 2; ++i) reg.add_devices(cuda ? absl::StrCat("cuda:", i) : "cpu");
    reg.set_capacity(2);
    reg.set_fabric(fabric);
    absl::StatusOr<v1::RegisterResponse> r = coordinator_->Register(reg, admin_);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(coordinator_->OpenSession(r->worker_id(), admin_, &sinks_[sessions_++]).ok());
  }

  // Submits a sp 2 x dp 2 job (4 ranks: two workers), runs one pass, returns the job.
  v1::Job SubmitAndPass(const std::string& name, bool allow_tcp) {
    v1::SubmitJobRequest submit;
    submit.set_spec_yaml(testing::JobYaml(
        name, std::string("    - {seq_len: 64, steps: 4, sp_degree: 2, dp_degree: 2}\n") +
                  (allow_tcp ? "  parallelism: {allow_tcp_fabric: true}\n" : "")));
    absl::StatusOr<v1::SubmitJobResponse> s = coordinator_->SubmitJob(submit, admin_);
    EXPECT_TRUE(s.ok()) << s.status();
    coordinator_->TickForTesting();
    v1::GetJobRequest get;
    get.set_job_id(s.ok() ? s->job_id() : "");
    absl::StatusOr<v1::Job> job = coordinator_->GetJob(get, admin_);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // ulysses_wanted_workers as the last pass set it (-1: no sample).
  double WantedWorkers() const {
    const std::string text = registry_.Serialize();
    const std::string key = "\nulysses_wanted_workers ";
    const size_t at = text.find(key);
    return at == std::string::npos ? -1 : std::stod(text.substr(at + key.size()));
  }

  int Assignments() const {
    int n = 0;
    for (const CountingSink& s : sinks_) n += s.assignments;
    return n;
  }

  testing::TempDir dir_;
  CoordinatorConfig config_;
  metrics::Registry registry_;
  std::vector<CountingSink> sinks_ = std::vector<CountingSink>(4);  // Outlive the coordinator.
  int sessions_ = 0;
  std::unique_ptr<Coordinator> coordinator_;
  auth::Principal admin_;
};

TEST_F(FabricPassTest, ACudaGroupOverTwoSocketsWorkersWaitsWithTheReason) {
  AddWorker("gpu-a", v1::FABRIC_SOCKETS);
  AddWorker("gpu-b", v1::FABRIC_SOCKETS);
  const v1::Job job = SubmitAndPass("over-tcp", false);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Assignments(), 0);
  EXPECT_NE(job.reason().find("w-gpu-a, w-gpu-b reach other nodes only over TCP sockets"),
            std::string::npos)
      << job.reason();
  EXPECT_NE(job.reason().find("spec.parallelism.allow_tcp_fabric: true"), std::string::npos)
      << job.reason();
  EXPECT_EQ(WantedWorkers(), 2);  // The waiting 4-rank gang wants two 2-slot workers.
  // The job that allows TCP behind it is not blocked by it, and runs on the same workers.
  const v1::Job allowed = SubmitAndPass("tcp-ok", true);
  EXPECT_EQ(allowed.state(), v1::JOB_STATE_SCHEDULING) << allowed.reason();
  EXPECT_EQ(Assignments(), 4);
  coordinator_->TickForTesting();
  EXPECT_EQ(WantedWorkers(), 4);  // Both workers busy + the waiting gang's two.
}

TEST_F(FabricPassTest, OnEfaWorkersTheSameGroupIsPlaced) {
  AddWorker("gpu-a", v1::FABRIC_EFA);
  AddWorker("gpu-b", v1::FABRIC_EFA);
  const v1::Job job = SubmitAndPass("over-efa", false);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULING) << job.reason();
  EXPECT_EQ(Assignments(), 4);
}

TEST_F(FabricPassTest, CpuRanksAreNotRestricted) {
  AddWorker("cpu-a", v1::FABRIC_SOCKETS, /*cuda=*/false);
  AddWorker("cpu-b", v1::FABRIC_SOCKETS, /*cuda=*/false);
  const v1::Job job = SubmitAndPass("gloo", false);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULING) << job.reason();
  EXPECT_EQ(Assignments(), 4);
}

TEST_F(FabricPassTest, TheWorkerShowsItsFabricAndAnUnknownOneIsRefused) {
  AddWorker("gpu-a", v1::FABRIC_IB);
  v1::ListWorkersRequest list;
  absl::StatusOr<v1::ListWorkersResponse> workers = coordinator_->ListWorkers(list, admin_);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_EQ(workers->workers(0).fabric(), v1::FABRIC_IB);
  v1::RegisterRequest reg;
  reg.set_name("gpu-z");
  reg.set_host("10.0.0.9");
  reg.set_device("cpu");
  reg.set_fabric(static_cast<v1::Fabric>(42));
  absl::StatusOr<v1::RegisterResponse> r = coordinator_->Register(reg, admin_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("fabric"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace ulysses::coordinator
