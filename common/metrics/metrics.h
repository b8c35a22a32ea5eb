// Prometheus-model metrics behind a narrow interface (no prometheus-cpp).
//
//   metrics::Registry registry;
//   ASSIGN_OR_RETURN(metrics::CounterFamily* restarts,
//                    registry.AddCounter("ulysses_job_restarts_total",
//                                        "Job restarts by reason.", {"reason"}));
//   restarts->WithLabels({"worker_lost"})->Increment();
//   std::string body = registry.Serialize();  // text format 0.0.4
//
// Ownership: the Registry owns its families (pointers stay valid for the Registry's
// lifetime; families are never unregistered). A family owns its children; WithLabels()
// hands out a shared_ptr, so a child removed with Remove() stays safe to update (it
// is simply no longer exported). Cache the child on hot paths: WithLabels() takes the
// family mutex, while Counter/Gauge/Histogram updates are lock-free atomics.
//
// Thread-safety: everything here may be called from any thread. Registration errors
// come back as absl::Status and leave the registry unchanged. Misuse at update time
// (negative counter increment, NaN, wrong number of label values) is logged at
// ERROR and ignored: metrics never crash the process.
#ifndef ULYSSES_COMMON_METRICS_METRICS_H_
#define ULYSSES_COMMON_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/text_format.h"

namespace ulysses {
namespace metrics {

// A monotonically increasing value (e.g. events, bytes, seconds spent).
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `delta` (>= 0). Negative or NaN deltas are rejected with an ERROR log.
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that can go up and down (queue length, loss, heartbeat age).
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double delta = 1.0);
  void Decrement(double delta = 1.0) { Increment(-delta); }
  // Sets the gauge to the current Unix time in seconds (with sub-second precision).
  void SetToCurrentTime();
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into fixed buckets; exported as cumulative `_bucket{le=..}`
// (ending with le="+Inf"), `_sum` and `_count`.
class Histogram {
 public:
  // `bounds`: validated, strictly increasing, finite upper bounds (no +Inf).
  explicit Histogram(std::shared_ptr<const std::vector<double>> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Adds one observation; a value equal to a bound falls in that bound's bucket.
  // NaN is rejected with an ERROR log.
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;        // Finite upper bounds.
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries; last is +Inf.
    uint64_t count = 0;                // == cumulative.back().
    double sum = 0;
  };
  // Buckets are read one by one, so a snapshot taken during concurrent Observe()
  // calls may miss the newest observations, but count always equals the +Inf bucket.
  Snapshot Collect() const;

 private:
  std::shared_ptr<const std::vector<double>> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // Per bucket, not cumulative.
  std::atomic<double> sum_{0};
};

namespace internal {

// What the Registry needs from every family.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual FamilySnapshot Collect() const = 0;
};

}  // namespace internal

// A metric family: one name, one help text, fixed label names, one child per
// distinct tuple of label values. T is Counter, Gauge or Histogram. A family without
// labels has its one child from registration (exported as 0 / empty buckets).
template <typename T>
class Family final : public internal::FamilyBase {
 public:
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::function<std::shared_ptr<T>()> make_child);
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The child for `label_values`, given in the order of label_names(); created on
  // first use. A wrong number of values logs an ERROR and returns a detached child
  // that is never exported.
  std::shared_ptr<T> WithLabels(const std::vector<std::string>& label_values = {});
  // Stops exporting the child (e.g. when a job ends, to keep label sets bounded).
  // Returns false if there was no such child.
  bool Remove(const std::vector<std::string>& label_values);
  // Removes every child whose label values `match` accepts (e.g. all series of one job
  // whatever their other labels); `match` runs under the family mutex. Returns how many.
  size_t RemoveIf(const std::function<bool(const std::vector<std::string>&)>& match);
  // Removes every child.
  void Clear();
  size_t size() const;

  const std::string& name() const { return name_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  FamilySnapshot Collect() const override;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::function<std::shared_ptr<T>()> make_child_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::shared_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// One sample returned by a labelled callback gauge.
struct CallbackSample {
  std::vector<std::string> label_values;  // In the order of the family's label names.
  double value = 0;
};

// Bucket helpers. Both return `count` strictly increasing bounds.
// start, start*factor, start*factor^2, ... (start > 0, factor > 1).
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// start, start+width, ... (width > 0).
std::vector<double> LinearBuckets(double start, double width, int count);

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Name rules (checked here, error = InvalidArgument naming the offending part):
  //   metric names: [a-z_][a-z0-9_]* (snake_case; ':' is reserved for recording
  //   rules), no "__" prefix, no "_bucket"/"_sum"/"_count" suffix; counters must end
  //   in "_total" and other types must not. Help must be non-empty.
  //   label names: [a-z_][a-z0-9_]*, no "__" prefix, no duplicates, not "le" or
  //   "quantile" (reserved for histograms/summaries), not "job" or "instance" (target
  //   labels Prometheus adds at scrape time; use "job_id").
  // A name that collides with an existing family, or with the _bucket/_sum/_count
  // series of a histogram, is AlreadyExists.
  absl::StatusOr<CounterFamily*> AddCounter(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names = {});
  // `buckets`: finite, strictly increasing upper bounds; +Inf is implicit.
  absl::StatusOr<HistogramFamily*> AddHistogram(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names,
                                                std::vector<double> buckets);
  // A gauge whose value is computed at scrape time by `fn` (called without any
  // registry lock held, from the scraping thread; it must be thread-safe).
  absl::Status AddCallbackGauge(const std::string& name, const std::string& help,
                                std::function<double()> fn);
  // Labelled variant: `fn` returns one sample per label tuple. Samples with the wrong
  // number of label values or duplicate tuples are dropped with an ERROR log.
  absl::Status AddCallbackGaugeFamily(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names,
                                      std::function<std::vector<CallbackSample>()> fn);

  // Snapshots of every family, sorted by name.
  std::vector<FamilySnapshot> Collect() const;
  // The text exposition format 0.0.4 body of a scrape.
  std::string Serialize() const;

 private:
  absl::Status Insert(const std::string& name, MetricType type,
                      std::unique_ptr<internal::FamilyBase> family);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<internal::FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> series_names_ ABSL_GUARDED_BY(mu_);  // Every exported series name.
};

// Validation used by Registry, exposed for tests and for callers that build names.
absl::Status ValidateMetricName(const std::string& name, MetricType type);
absl::Status ValidateLabelNames(const std::string& metric, const std::vector<std::string>& labels);
absl::Status ValidateBuckets(const std::string& metric, const std::vector<double>& buckets);

}  // namespace metrics
}  // namespace ulysses

#endif  // ULYSSES_COMMON_METRICS_METRICS_H_
