// The coordinator's metric families and scrape-time gauges (coordinator_metrics.h),
// registered in a real Registry and read back through its text exposition.
#include "coordinator/coordinator_metrics.h"

#include <string>

#include "gtest/gtest.h"

namespace ulysses::coordinator {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(CoordinatorMetricsTest, RegistersEveryFamilyAndComputesGaugesAtScrape) {
  metrics::Registry registry;
  int scrapes = 0;
  auto metrics = CoordinatorMetrics::Register(&registry, [&](CountsPart part) {
    ++scrapes;
    StateCounts c;
    c.jobs_by_state[v1::JOB_STATE_RUNNING] = 2;
    c.jobs_by_state[v1::JOB_STATE_PENDING] = 1;
    c.workers_by_state[v1::WORKER_STATE_IDLE] = 3;
    c.queued_jobs = 1;
    c.heartbeat_ages_s = {{"w-a", 1.5}};
    c.checkpoint_ages_s = {{"job-000009", 42}};
    (void)part;
    return c;
  });
  ASSERT_NE(metrics, nullptr);
  for (auto* f : {metrics->restarts, metrics->preemptions, metrics->preemption_lost_gpu_seconds,
                  metrics->stage_transitions, metrics->tokens, metrics->rejected_reports}) {
    EXPECT_NE(f, nullptr);
  }
  for (auto* f : {metrics->checkpoint_bytes, metrics->loss, metrics->tokens_per_s, metrics->step}) {
    EXPECT_NE(f, nullptr);
  }
  for (auto* f : {metrics->gang_wait, metrics->recovery, metrics->checkpoint_seconds}) {
    EXPECT_NE(f, nullptr);
  }
  metrics->CountRestart("worker_lost");
  metrics->CountRejected("stale");
  metrics->CountRejected("stale");
  metrics->loss->WithLabels({"job-000001"})->Set(2.5);
  const std::string text = registry.Serialize();
  EXPECT_TRUE(Has(text, "ulysses_job_restarts_total{reason=\"worker_lost\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ulysses_rejected_reports_total{reason=\"stale\"} 2")) << text;
  EXPECT_TRUE(Has(text, "ulysses_train_loss{job_id=\"job-000001\"} 2.5")) << text;
  EXPECT_TRUE(Has(text, "ulysses_jobs{state=\"running\"} 2")) << text;
  EXPECT_TRUE(Has(text, "ulysses_jobs{state=\"pending\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ulysses_jobs{state=\"failed\"} 0")) << text;  // Every state shown.
  EXPECT_TRUE(Has(text, "ulysses_workers{state=\"idle\"} 3")) << text;
  EXPECT_TRUE(Has(text, "ulysses_workers{state=\"lost\"} 0")) << text;
  EXPECT_TRUE(Has(text, "ulysses_queue_length 1")) << text;
  EXPECT_TRUE(Has(text, "ulysses_worker_heartbeat_age_seconds{worker=\"w-a\"} 1.5")) << text;
  EXPECT_TRUE(Has(text, "ulysses_checkpoint_age_seconds{job_id=\"job-000009\"} 42")) << text;
  // One call per scrape-time gauge: jobs, workers, worker slots, queue, heartbeat ages,
  // checkpoint ages and goodput ratios (CountsPart).
  EXPECT_EQ(scrapes, 7);
  EXPECT_NE(text.find("ulysses_build_info"), std::string::npos);

  // Per-job gauges of every stage, and another job's, then the job ends.
  metrics->SetJobStage("job-000001", 1, 20, 2048, 2);
  metrics->checkpoint_every->WithLabels({"job-000001"})->Set(20);
  metrics->SetEval("job-000001", 0, 3.5, 0.25);
  metrics->SetEval("job-000001", 1, 3.0, std::nullopt);
  metrics->SetEval("job-000002", 0, 4.0, 0.5);
  std::string with = registry.Serialize();
  EXPECT_TRUE(Has(with, "ulysses_train_group_size{job_id=\"job-000001\"} 2")) << with;
  // Stage index 1 is stage 2 in the gauge and in the labels, as in the CLI (1-based).
  EXPECT_TRUE(Has(with, "ulysses_train_stage{job_id=\"job-000001\"} 2")) << with;
  EXPECT_TRUE(Has(with, "ulysses_checkpoint_every_steps{job_id=\"job-000001\"} 20")) << with;
  EXPECT_TRUE(Has(with, "ulysses_eval_accuracy{job_id=\"job-000001\",stage=\"1\"} 0.25"));
  EXPECT_TRUE(Has(with, "ulysses_eval_loss{job_id=\"job-000001\",stage=\"2\"} 3"));
  EXPECT_EQ(with.find("ulysses_eval_accuracy{job_id=\"job-000001\",stage=\"2\"}"),
            std::string::npos);  // That evaluation measured no accuracy.
  metrics->ForgetJob("job-000001");
  const std::string after = registry.Serialize();
  EXPECT_EQ(after.find("job-000001\""), std::string::npos) << after;
  EXPECT_TRUE(Has(after, "ulysses_eval_accuracy{job_id=\"job-000002\",stage=\"1\"} 0.5"));
}

// The settings the alerts compare against (deploy/k8s/prometheus/ulysses-rules.yml).
TEST(CoordinatorMetricsTest, SettingsAreExported) {
  metrics::Registry registry;
  auto metrics = CoordinatorMetrics::Register(&registry, [](CountsPart) { return StateCounts(); });
  metrics->SetSettings(10, 900);
  metrics->SetHeartbeatInterval(2.5);
  const std::string text = registry.Serialize();
  EXPECT_TRUE(Has(text, "ulysses_heartbeat_interval_seconds 2.5")) << text;
  EXPECT_TRUE(Has(text, "ulysses_heartbeat_timeout_seconds 10")) << text;
  EXPECT_TRUE(Has(text, "ulysses_cancel_grace_seconds 900")) << text;
}

TEST(CoordinatorMetricsTest, WithoutARegistryStillCounts) {
  auto metrics = CoordinatorMetrics::Register(nullptr, [](CountsPart) { return StateCounts(); });
  ASSERT_NE(metrics->restarts, nullptr);
  metrics->CountRestart("worker_lost");
  EXPECT_EQ(metrics->restarts->WithLabels({"worker_lost"})->Value(), 1);
}

TEST(CoordinatorMetricsTest, StateSamplesCoverEveryState) {
  auto jobs = JobStateSamples({{v1::JOB_STATE_CANCELLED, 4}});
  EXPECT_EQ(jobs.size(), static_cast<size_t>(v1::JOB_STATE_CANCELLED - v1::JOB_STATE_PENDING + 1));
  EXPECT_EQ(jobs.front().label_values[0], "pending");
  EXPECT_EQ(jobs.back().label_values[0], "cancelled");
  EXPECT_EQ(jobs.back().value, 4);
  auto workers = WorkerStateSamples({});
  EXPECT_EQ(workers.front().label_values[0], "idle");
  EXPECT_EQ(workers.back().label_values[0], "suspect");
}

}  // namespace
}  // namespace ulysses::coordinator
