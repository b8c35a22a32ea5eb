#include "common/metrics/metrics.h"

#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/metrics/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ulysses {
namespace metrics {
namespace {

using ::testing::HasSubstr;

TEST(RegistryTest, CounterGaugeSerialize) {
  Registry registry;
  auto restarts = registry.AddCounter("ulysses_job_restarts_total", "Restarts.", {"reason"});
  ASSERT_TRUE(restarts.ok()) << restarts.status();
  auto queue = registry.AddGauge("ulysses_queue_length", "Queued jobs.");
  ASSERT_TRUE(queue.ok()) << queue.status();

  (*restarts)->WithLabels({"worker_lost"})->Increment();
  (*restarts)->WithLabels({"worker_lost"})->Increment(2);
  (*restarts)->WithLabels({"oom"})->Increment();
  auto q = (*queue)->WithLabels();
  q->Set(7);
  q->Increment(3);
  q->Decrement(0.5);
  EXPECT_EQ(q->Value(), 9.5);

  EXPECT_EQ(registry.Serialize(),
            "# HELP ulysses_job_restarts_total Restarts.\n"
            "# TYPE ulysses_job_restarts_total counter\n"
            "ulysses_job_restarts_total{reason=\"oom\"} 1\n"
            "ulysses_job_restarts_total{reason=\"worker_lost\"} 3\n"
            "# HELP ulysses_queue_length Queued jobs.\n"
            "# TYPE ulysses_queue_length gauge\n"
            "ulysses_queue_length 9.5\n");
}

TEST(RegistryTest, CounterRejectsNegativeAndNaNIncrements) {
  Registry registry;
  auto family = registry.AddCounter("ulysses_preemptions_total", "Preemptions.");
  ASSERT_TRUE(family.ok());
  auto counter = (*family)->WithLabels();
  counter->Increment(5);
  counter->Increment(-2);
  counter->Increment(std::nan(""));
  counter->Increment(0);
  EXPECT_EQ(counter->Value(), 5);
}

TEST(RegistryTest, GaugeSetToCurrentTime) {
  Gauge gauge;
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  gauge.SetToCurrentTime();
  EXPECT_GE(gauge.Value(), before);
  EXPECT_LT(gauge.Value(), before + 60);
}

TEST(HistogramTest, CumulativeBucketsSumCount) {
  Registry registry;
  auto family =
      registry.AddHistogram("ulysses_gang_wait_seconds", "Gang wait.", {"pool"}, {0.1, 1, 10});
  ASSERT_TRUE(family.ok()) << family.status();
  auto h = (*family)->WithLabels({"gpu"});
  // 1.0 equals a bound and must land in le="1". Values are exact in binary.
  for (double v : {0.0625, 0.09375, 0.5, 1.0, 3.0, 20.0, 1e9}) {
    h->Observe(v);
  }
  h->Observe(std::nan(""));  // Rejected.

  Histogram::Snapshot snap = h->Collect();
  EXPECT_EQ(snap.cumulative, (std::vector<uint64_t>{2, 4, 5, 7}));
  EXPECT_EQ(snap.count, 7u);
  EXPECT_EQ(snap.sum, 1000000024.65625);

  const std::string body = registry.Serialize();
  EXPECT_THAT(body, HasSubstr("# TYPE ulysses_gang_wait_seconds histogram\n"));
  EXPECT_THAT(body, HasSubstr("ulysses_gang_wait_seconds_bucket{pool=\"gpu\",le=\"0.1\"} 2\n"
                              "ulysses_gang_wait_seconds_bucket{pool=\"gpu\",le=\"1\"} 4\n"
                              "ulysses_gang_wait_seconds_bucket{pool=\"gpu\",le=\"10\"} 5\n"
                              "ulysses_gang_wait_seconds_bucket{pool=\"gpu\",le=\"+Inf\"} 7\n"
                              "ulysses_gang_wait_seconds_sum{pool=\"gpu\"} 1000000024.65625\n"
                              "ulysses_gang_wait_seconds_count{pool=\"gpu\"} 7\n"));
}

TEST(HistogramTest, NegativeObservationsLandInFirstBucket) {
  Registry registry;
  auto family = registry.AddHistogram("ulysses_delta_seconds", "Delta.", {}, {0, 1});
  ASSERT_TRUE(family.ok());
  auto h = (*family)->WithLabels();
  h->Observe(-5);
  h->Observe(0);
  EXPECT_EQ(h->Collect().cumulative, (std::vector<uint64_t>{2, 2, 2}));
  EXPECT_EQ(h->Collect().sum, -5);
}

TEST(HistogramTest, BucketsMustBeStrictlyIncreasingAndFinite) {
  Registry registry;
  auto dup = registry.AddHistogram("ulysses_a_seconds", "A.", {}, {1, 2, 2});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.status().message(), HasSubstr("strictly increasing"));
  auto down = registry.AddHistogram("ulysses_a_seconds", "A.", {}, {5, 1});
  EXPECT_THAT(down.status().message(), HasSubstr("bucket 1 (1) <= bucket 0 (5)"));
  auto inf = registry.AddHistogram("ulysses_a_seconds", "A.", {}, {1, HUGE_VAL});
  EXPECT_THAT(inf.status().message(), HasSubstr("+Inf bucket is implicit"));
  auto nan = registry.AddHistogram("ulysses_a_seconds", "A.", {}, {std::nan("")});
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing was registered by the failures.
  EXPECT_TRUE(registry.AddHistogram("ulysses_a_seconds", "A.", {}, {1, 2}).ok());
}

TEST(BucketHelpersTest, ExponentialAndLinear) {
  EXPECT_EQ(ExponentialBuckets(0.5, 2, 4), (std::vector<double>{0.5, 1, 2, 4}));
  EXPECT_EQ(LinearBuckets(1, 0.5, 3), (std::vector<double>{1, 1.5, 2}));
}

TEST(NameValidationTest, MetricNames) {
  Registry r;
  struct Case {
    std::string name;
    MetricType type;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"ulysses_restarts", MetricType::kCounter, "must end in \"_total\""},
      {"ulysses_queue_total", MetricType::kGauge, "reserved for counters"},
      {"ulysses_wait_total", MetricType::kHistogram, "reserved for counters"},
      {"ulysses_jobs_count", MetricType::kGauge, "\"_count\" suffix is reserved"},
      {"ulysses_x_bucket", MetricType::kGauge, "\"_bucket\" suffix is reserved"},
      {"ulysses_x_sum", MetricType::kGauge, "\"_sum\" suffix is reserved"},
      {"__ulysses_internal", MetricType::kGauge, "\"__\" prefix is reserved"},
      {"ulysses:jobs", MetricType::kGauge, "reserved for recording rules"},
      {"ulyssesJobs", MetricType::kGauge, "snake_case"},
      {"9ulysses", MetricType::kGauge, "must not start with a digit"},
      {"ulysses-jobs", MetricType::kGauge, "'-' is not allowed"},
      {"", MetricType::kGauge, "is empty"},
  };
  for (const Case& c : cases) {
    absl::Status status = ValidateMetricName(c.name, c.type);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.name;
  }
  EXPECT_TRUE(ValidateMetricName("ulysses_train_tokens_total", MetricType::kCounter).ok());
  EXPECT_TRUE(ValidateMetricName("_ulysses_x", MetricType::kGauge).ok());
}

TEST(NameValidationTest, LabelNames) {
  EXPECT_THAT(ValidateLabelNames("m", {"le"}).message(), HasSubstr("\"le\" is reserved"));
  EXPECT_THAT(ValidateLabelNames("m", {"quantile"}).message(), HasSubstr("reserved"));
  EXPECT_THAT(ValidateLabelNames("m", {"__name__"}).message(), HasSubstr("\"__\" prefix"));
  EXPECT_THAT(ValidateLabelNames("m", {"state", "state"}).message(), HasSubstr("listed twice"));
  EXPECT_THAT(ValidateLabelNames("m", {"job"}).message(), HasSubstr("exported_job"));
  EXPECT_THAT(ValidateLabelNames("m", {"instance"}).message(), HasSubstr("instance_id"));
  EXPECT_THAT(ValidateLabelNames("m", {"Job"}).message(), HasSubstr("snake_case"));
  EXPECT_THAT(ValidateLabelNames("m", {"a.b"}).message(), HasSubstr("'.' is not allowed"));
  EXPECT_TRUE(ValidateLabelNames("m", {"job_id", "stage_2", "_x"}).ok());
}

TEST(RegistryTest, RegistrationErrorsAreClear) {
  Registry r;
  auto bad = r.AddCounter("ulysses_restarts", "Restarts.");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("ulysses_restarts_total"));
  auto no_help = r.AddGauge("ulysses_x", "");
  EXPECT_THAT(no_help.status().message(), HasSubstr("help text is empty"));
  auto le = r.AddHistogram("ulysses_h_seconds", "H.", {"le"}, {1});
  EXPECT_THAT(le.status().message(), HasSubstr("\"le\" is reserved"));

  ASSERT_TRUE(r.AddGauge("ulysses_x", "X.").ok());
  auto dup = r.AddGauge("ulysses_x", "X again.");
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  auto dup_type = r.AddHistogram("ulysses_x", "X.", {}, {1});
  EXPECT_EQ(dup_type.status().code(), absl::StatusCode::kAlreadyExists);
  // A family colliding with a histogram's generated series.
  ASSERT_TRUE(r.AddHistogram("ulysses_rpc_seconds", "RPC.", {}, {1}).ok());
  EXPECT_EQ(r.AddGauge("ulysses_rpc_seconds_bucket", "B.").status().code(),
            absl::StatusCode::kInvalidArgument);  // Reserved suffix caught first.
  EXPECT_EQ(r.AddCallbackGauge("ulysses_rpc_seconds", "R.", [] { return 1.0; }).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(RegistryTest, WrongLabelArityGivesDetachedChild) {
  Registry r;
  auto jobs = r.AddGauge("ulysses_jobs", "Jobs by state.", {"state"});
  ASSERT_TRUE(jobs.ok());
  (*jobs)->WithLabels({"running", "extra"})->Set(5);
  (*jobs)->WithLabels()->Set(6);
  EXPECT_EQ((*jobs)->size(), 0u);
  EXPECT_EQ(r.Serialize(), "# HELP ulysses_jobs Jobs by state.\n# TYPE ulysses_jobs gauge\n");
}

TEST(RegistryTest, RemoveAndClearChildren) {
  Registry r;
  auto loss = r.AddGauge("ulysses_train_loss", "Loss.", {"job_id"});
  ASSERT_TRUE(loss.ok());
  auto a = (*loss)->WithLabels({"a"});
  a->Set(2.5);
  (*loss)->WithLabels({"b"})->Set(3);
  EXPECT_EQ((*loss)->WithLabels({"a"}), a);  // Same child on every call.
  EXPECT_TRUE((*loss)->Remove({"a"}));
  EXPECT_FALSE((*loss)->Remove({"a"}));
  a->Set(9);  // Still safe to use after removal; just not exported.
  EXPECT_THAT(r.Serialize(), HasSubstr("ulysses_train_loss{job_id=\"b\"} 3\n"));
  EXPECT_THAT(r.Serialize(), ::testing::Not(HasSubstr("job_id=\"a\"")));
  (*loss)->Clear();
  EXPECT_EQ((*loss)->size(), 0u);
}

TEST(RegistryTest, CallbackGauges) {
  Registry r;
  double value = 1.5;
  ASSERT_TRUE(r.AddCallbackGauge("ulysses_uptime_seconds", "Uptime.", [&] { return value; }).ok());
  ASSERT_TRUE(
      r.AddCallbackGaugeFamily("ulysses_worker_heartbeat_age_seconds", "Age.", {"worker"}, [] {
         return std::vector<CallbackSample>{{{"w2"}, 0.25}, {{"w1"}, 3}, {{"w1"}, 4}, {{}, 7}};
       }).ok());
  std::string body = r.Serialize();
  EXPECT_THAT(body, HasSubstr("ulysses_uptime_seconds 1.5\n"));
  // Sorted by label value, duplicate and wrong-arity samples dropped.
  EXPECT_TRUE(absl::EndsWith(body,
                             "# TYPE ulysses_worker_heartbeat_age_seconds gauge\n"
                             "ulysses_worker_heartbeat_age_seconds{worker=\"w1\"} 3\n"
                             "ulysses_worker_heartbeat_age_seconds{worker=\"w2\"} 0.25\n"))
      << body;
  value = 2;
  EXPECT_THAT(r.Serialize(), HasSubstr("ulysses_uptime_seconds 2\n"));
}

TEST(RegistryTest, ConcurrentUpdatesAreExact) {
  Registry r;
  auto tokens = r.AddCounter("ulysses_train_tokens_total", "Tokens.", {"job_id"});
  auto wait = r.AddHistogram("ulysses_wait_seconds", "Wait.", {}, {0.5, 1.5});
  auto level = r.AddGauge("ulysses_level", "Level.");
  ASSERT_TRUE(tokens.ok() && wait.ok() && level.ok());
  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        // Looking the child up each time also exercises the family map under contention.
        (*tokens)->WithLabels({t % 2 == 0 ? "even" : "odd"})->Increment(0.5);
        (*wait)->WithLabels()->Observe(i % 2);
        (*level)->WithLabels()->Increment();
        if (i % 1000 == 0) {
          r.Serialize();  // Concurrent scrapes.
        }
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  EXPECT_EQ((*tokens)->WithLabels({"even"})->Value(), kThreads * kIters * 0.25);
  EXPECT_EQ((*tokens)->WithLabels({"odd"})->Value(), kThreads * kIters * 0.25);
  Histogram::Snapshot snap = (*wait)->WithLabels()->Collect();
  EXPECT_EQ(snap.count, static_cast<uint64_t>(kThreads * kIters));
  EXPECT_EQ(snap.cumulative[0], static_cast<uint64_t>(kThreads * kIters / 2));
  EXPECT_EQ(snap.sum, kThreads * kIters / 2);
  EXPECT_EQ((*level)->WithLabels()->Value(), kThreads * kIters);
}

TEST(BuildInfoTest, RegistersVersionAndSha) {
  Registry r;
  ASSERT_TRUE(RegisterBuildInfo(&r).ok());
  EXPECT_EQ(RegisterBuildInfo(&r).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(BuildVersion().empty());
  EXPECT_NE(BuildVersion(), "unknown");  // Comes from the CMake project version.
  EXPECT_FALSE(BuildGitSha().empty());
  EXPECT_THAT(r.Serialize(), HasSubstr("ulysses_build_info{version=\"" + BuildVersion() +
                                       "\",git_sha=\"" + BuildGitSha() + "\"} 1\n"));
}

TEST(RegistryTest, LabelLessFamiliesAreExportedBeforeTheFirstEvent) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounter("x_preemptions_total", "Preemptions.").ok());
  ASSERT_TRUE(registry.AddHistogram("x_wait_seconds", "Waits.", {}, {1, 2}).ok());
  ASSERT_TRUE(registry.AddCounter("x_restarts_total", "By reason.", {"reason"}).ok());
  const std::string body = registry.Serialize();
  EXPECT_THAT(body, HasSubstr("\nx_preemptions_total 0\n"));
  EXPECT_THAT(body, HasSubstr("x_wait_seconds_bucket{le=\"+Inf\"} 0\n"));
  EXPECT_THAT(body, HasSubstr("x_wait_seconds_count 0\n"));
  // A labelled family has no series until a label tuple is used.
  EXPECT_THAT(body, ::testing::Not(HasSubstr("x_restarts_total{")));
}

}  // namespace
}  // namespace metrics
}  // namespace ulysses
