// Test fixture: registers every metric listed in docs/METRICS.md with the labels
// the control plane uses, and gives each a value, so the scrape tests exercise the
// real catalogue (names, types, label sets) against promtool and Prometheus.
#ifndef ULYSSES_TESTS_COMMON_METRICS_CATALOG_FOR_TEST_H_
#define ULYSSES_TESTS_COMMON_METRICS_CATALOG_FOR_TEST_H_

#include "common/metrics/build_info.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"

namespace ulysses {
namespace metrics {

inline void RegisterCatalogForTest(Registry* r) {
  const std::vector<double> seconds = ExponentialBuckets(0.5, 2, 12);  // 0.5 s .. 1024 s
  const std::vector<double> fast = ExponentialBuckets(0.0005, 2, 14);  // 0.5 ms .. 4 s
  ASSERT_TRUE(RegisterBuildInfo(r).ok());
  auto jobs = r->AddGauge("ulysses_jobs", "Jobs by state.", {"state"});
  auto queue = r->AddGauge("ulysses_queue_length", "Jobs waiting for a gang.");
  auto gang = r->AddHistogram("ulysses_gang_wait_seconds", "Gang wait.", {}, seconds);
  auto restarts =
      r->AddCounter("ulysses_job_restarts_total", "Job restarts by reason.", {"reason"});
  auto preempt = r->AddCounter("ulysses_preemptions_total", "Preemptions.");
  auto recovery =
      r->AddHistogram("ulysses_recovery_duration_seconds", "Recovery time.", {}, seconds);
  auto stages = r->AddCounter("ulysses_stage_transitions_total", "Stage transitions.");
  auto ckpt_s =
      r->AddHistogram("ulysses_checkpoint_save_duration_seconds", "Checkpoint save.", {}, seconds);
  auto ckpt_b = r->AddGauge("ulysses_checkpoint_bytes", "Checkpoint size.", {"job_id"});
  auto hb = r->AddGauge("ulysses_worker_heartbeat_age_seconds", "Heartbeat age.", {"worker"});
  auto workers = r->AddGauge("ulysses_workers", "Workers by state.", {"state"});
  auto loss = r->AddGauge("ulysses_train_loss", "Loss.", {"job_id"});
  auto tps = r->AddGauge("ulysses_train_tokens_per_second", "Tokens/s.", {"job_id"});
  auto step = r->AddGauge("ulysses_train_step", "Step.", {"job_id"});
  auto tokens = r->AddCounter("ulysses_train_tokens_total", "Tokens.", {"job_id"});
  auto a2a = r->AddHistogram("ulysses_alltoall_seconds", "All-to-all.", {}, fast);
  auto rpc = r->AddHistogram("ulysses_rpc_duration_seconds", "RPC time.", {"method"}, fast);
  for (const absl::Status& s :
       {jobs.status(), queue.status(), gang.status(), restarts.status(), preempt.status(),
        recovery.status(), stages.status(), ckpt_s.status(), ckpt_b.status(), hb.status(),
        workers.status(), loss.status(), tps.status(), step.status(), tokens.status(), a2a.status(),
        rpc.status()}) {
    ASSERT_TRUE(s.ok()) << s;
  }
  (*jobs)->WithLabels({"running"})->Set(2);
  (*jobs)->WithLabels({"queued"})->Set(1);
  (*queue)->WithLabels()->Set(1);
  (*gang)->WithLabels()->Observe(3.5);
  (*restarts)->WithLabels({"worker_lost"})->Increment();
  (*preempt)->WithLabels()->Increment(3);
  (*recovery)->WithLabels()->Observe(42);
  (*stages)->WithLabels()->Increment();
  (*ckpt_s)->WithLabels()->Observe(12.5);
  (*ckpt_b)->WithLabels({"j1"})->Set(1.5e9);
  (*hb)->WithLabels({"node-a/0"})->Set(0.8);
  (*workers)->WithLabels({"ready"})->Set(4);
  (*loss)->WithLabels({"j1"})->Set(2.25);
  (*tps)->WithLabels({"j1"})->Set(51234.5);
  (*step)->WithLabels({"j1"})->Set(1200);
  (*tokens)->WithLabels({"j1"})->Increment(12345);
  (*a2a)->WithLabels()->Observe(0.003);
  (*rpc)->WithLabels({"/ulysses.Coordinator/Heartbeat"})->Observe(0.0007);
}

}  // namespace metrics
}  // namespace ulysses

#endif  // ULYSSES_TESTS_COMMON_METRICS_CATALOG_FOR_TEST_H_
