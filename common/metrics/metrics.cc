#include "common/metrics/metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"

namespace ulysses {
namespace metrics {
namespace {

// Misuse at update time is a bug in the caller; log the first few occurrences
// per process so a hot loop cannot flood the log.
void LogMisuse(const std::string& message) {
  static std::atomic<int> logged{0};
  constexpr int kMaxLogged = 20;
  int n = logged.fetch_add(1, std::memory_order_relaxed);
  if (n < kMaxLogged) {
    ULOG(ERROR) << "metrics: " << message
                << (n + 1 == kMaxLogged ? " (further misuse not logged)" : "");
  }
}

void AtomicAdd(std::atomic<double>* target, double delta) {
  double current = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// Checks [a-z_][a-z0-9_]*; `what` is "metric name" or "label name".
absl::Status CheckSnakeCase(const std::string& name, absl::string_view what,
                            const std::string& context) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(context, what, " is empty"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = i == 0 ? IsNameStart(c) : IsNameChar(c);
    if (ok) {
      continue;
    }
    std::string why;
    if (c >= 'A' && c <= 'Z') {
      why = "upper-case letters are not allowed; use snake_case";
    } else if (c == ':') {
      why = "':' is reserved for recording rules";
    } else if (i == 0 && c >= '0' && c <= '9') {
      why = "it must not start with a digit";
    } else {
      why = absl::StrCat("character '", std::string(1, c), "' is not allowed; use [a-z0-9_]");
    }
    return absl::InvalidArgumentError(
        absl::StrCat(context, what, " \"", name, "\" is invalid: ", why));
  }
  if (absl::StartsWith(name, "__")) {
    return absl::InvalidArgumentError(absl::StrCat(
        context, what, " \"", name, "\" is invalid: the \"__\" prefix is reserved for Prometheus"));
  }
  return absl::OkStatus();
}

std::vector<std::string> SeriesNames(const std::string& name, MetricType type) {
  if (type == MetricType::kHistogram) {
    return {name, name + "_bucket", name + "_sum", name + "_count"};
  }
  return {name};
}

std::vector<std::pair<std::string, std::string>> ZipLabels(const std::vector<std::string>& names,
                                                           const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, std::string>> labels;
  labels.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    labels.emplace_back(names[i], values[i]);
  }
  return labels;
}

void AppendChildSamples(const Counter& child,
                        std::vector<std::pair<std::string, std::string>> labels,
                        FamilySnapshot* out) {
  out->samples.push_back(Sample{"", std::move(labels), child.Value()});
}

void AppendChildSamples(const Gauge& child, std::vector<std::pair<std::string, std::string>> labels,
                        FamilySnapshot* out) {
  out->samples.push_back(Sample{"", std::move(labels), child.Value()});
}

void AppendChildSamples(const Histogram& child,
                        std::vector<std::pair<std::string, std::string>> labels,
                        FamilySnapshot* out) {
  Histogram::Snapshot snap = child.Collect();
  for (size_t i = 0; i < snap.cumulative.size(); ++i) {
    auto bucket_labels = labels;
    double le = i < snap.bounds.size() ? snap.bounds[i] : HUGE_VAL;
    bucket_labels.emplace_back("le", FormatValue(le));
    out->samples.push_back(
        Sample{"_bucket", std::move(bucket_labels), static_cast<double>(snap.cumulative[i])});
  }
  out->samples.push_back(Sample{"_sum", labels, snap.sum});
  out->samples.push_back(Sample{"_count", std::move(labels), static_cast<double>(snap.count)});
}

// A gauge family whose samples come from a function at scrape time.
class CallbackGaugeFamily final : public internal::FamilyBase {
 public:
  CallbackGaugeFamily(std::string name, std::string help, std::vector<std::string> label_names,
                      std::function<std::vector<CallbackSample>()> fn)
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        fn_(std::move(fn)) {}

  FamilySnapshot Collect() const override {
    FamilySnapshot out{name_, help_, MetricType::kGauge, {}};
    std::map<std::vector<std::string>, double> unique;
    for (CallbackSample& sample : fn_()) {
      if (sample.label_values.size() != label_names_.size()) {
        LogMisuse(absl::StrCat(name_, ": callback returned ", sample.label_values.size(),
                               " label values, expected ", label_names_.size(), " (",
                               absl::StrJoin(label_names_, ","), "); sample dropped"));
        continue;
      }
      if (!unique.emplace(std::move(sample.label_values), sample.value).second) {
        LogMisuse(absl::StrCat(name_, ": callback returned a duplicate label tuple; dropped"));
      }
    }
    for (const auto& [values, value] : unique) {
      out.samples.push_back(Sample{"", ZipLabels(label_names_, values), value});
    }
    return out;
  }

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::function<std::vector<CallbackSample>()> fn_;
};

}  // namespace

// ---- Values ---------------------------------------------------------------------

void Counter::Increment(double delta) {
  if (!(delta >= 0)) {  // Also catches NaN.
    LogMisuse(absl::StrCat("counter increment by ", FormatValue(delta),
                           " ignored: counters only go up (use a Gauge)"));
    return;
  }
  AtomicAdd(&value_, delta);
}

void Gauge::Increment(double delta) { AtomicAdd(&value_, delta); }

void Gauge::SetToCurrentTime() {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  Set(std::chrono::duration<double>(now).count());
}

Histogram::Histogram(std::shared_ptr<const std::vector<double>> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    counts_[i].store(0, std::memory_order_relaxed);
  }
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) {
    LogMisuse("histogram observation of NaN ignored");
    return;
  }
  // First bound >= value; past the end means the +Inf bucket.
  size_t index = std::lower_bound(bounds_->begin(), bounds_->end(), value) - bounds_->begin();
  counts_[index].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, value);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot snap;
  snap.bounds = *bounds_;
  snap.cumulative.resize(bounds_->size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    snap.cumulative[i] = running;
  }
  snap.count = running;
  snap.sum = sum_.load(std::memory_order_relaxed);
  return snap;
}

// ---- Families -------------------------------------------------------------------

template <typename T>
Family<T>::Family(std::string name, std::string help, MetricType type,
                  std::vector<std::string> label_names,
                  std::function<std::shared_ptr<T>()> make_child)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      make_child_(std::move(make_child)) {
  // A label-less family has exactly one series: export it from the start (0, empty
  // buckets), as Prometheus client libraries do, so rate(), increase() and absent()
  // see it on a healthy process before the first event.
  if (label_names_.empty()) children_.emplace(std::vector<std::string>{}, make_child_());
}

template <typename T>
std::shared_ptr<T> Family<T>::WithLabels(const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names_.size()) {
    LogMisuse(absl::StrCat(name_, ": got ", label_values.size(), " label values {",
                           absl::StrJoin(label_values, ","), "}, expected ", label_names_.size(),
                           " (", absl::StrJoin(label_names_, ","),
                           "); updates to this child are not exported"));
    return make_child_();
  }
  absl::MutexLock lock(&mu_);
  auto it = children_.find(label_values);
  if (it == children_.end()) {
    it = children_.emplace(label_values, make_child_()).first;
  }
  return it->second;
}

template <typename T>
bool Family<T>::Remove(const std::vector<std::string>& label_values) {
  absl::MutexLock lock(&mu_);
  return children_.erase(label_values) > 0;
}

template <typename T>
size_t Family<T>::RemoveIf(const std::function<bool(const std::vector<std::string>&)>& match) {
  absl::MutexLock lock(&mu_);
  size_t removed = 0;
  for (auto it = children_.begin(); it != children_.end();) {
    if (match(it->first)) {
      it = children_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

template <typename T>
void Family<T>::Clear() {
  absl::MutexLock lock(&mu_);
  children_.clear();
}

template <typename T>
size_t Family<T>::size() const {
  absl::MutexLock lock(&mu_);
  return children_.size();
}

template <typename T>
FamilySnapshot Family<T>::Collect() const {
  std::vector<std::pair<std::vector<std::string>, std::shared_ptr<T>>> children;
  {
    absl::MutexLock lock(&mu_);
    children.assign(children_.begin(), children_.end());
  }
  FamilySnapshot out{name_, help_, type_, {}};
  for (const auto& [values, child] : children) {
    AppendChildSamples(*child, ZipLabels(label_names_, values), &out);
  }
  return out;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- Buckets and validation -----------------------------------------------------

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) {
    bounds.push_back(bound);
  }
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> bounds;
  bounds.reserve(count > 0 ? count : 0);
  for (int i = 0; i < count; ++i) {
    bounds.push_back(start + width * i);
  }
  return bounds;
}

absl::Status ValidateMetricName(const std::string& name, MetricType type) {
  RETURN_IF_ERROR(CheckSnakeCase(name, "metric name", ""));
  for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(name, suffix)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric name \"", name, "\" is invalid: the \"", suffix,
                       "\" suffix is reserved for histogram series; rename it"));
    }
  }
  bool has_total = absl::EndsWith(name, "_total");
  if (type == MetricType::kCounter && !has_total) {
    return absl::InvalidArgumentError(absl::StrCat("counter name \"", name,
                                                   "\" is invalid: counters must end in \"_total\" "
                                                   "(e.g. \"",
                                                   name, "_total\")"));
  }
  if (type != MetricType::kCounter && has_total) {
    return absl::InvalidArgumentError(
        absl::StrCat(MetricTypeName(type), " name \"", name,
                     "\" is invalid: the \"_total\" suffix is reserved for counters; drop it"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelNames(const std::string& metric, const std::vector<std::string>& labels) {
  std::set<std::string> seen;
  const std::string context = absl::StrCat(metric, ": ");
  for (const std::string& label : labels) {
    RETURN_IF_ERROR(CheckSnakeCase(label, "label name", context));
    if (label == "le" || label == "quantile") {
      return absl::InvalidArgumentError(
          absl::StrCat(context, "label name \"", label,
                       "\" is reserved (histogram buckets / summary quantiles); rename it"));
    }
    if (label == "job" || label == "instance") {
      return absl::InvalidArgumentError(absl::StrCat(
          context, "label name \"", label,
          "\" collides with the target label Prometheus attaches to every scraped series "
          "(it would be renamed exported_",
          label, "); use e.g. \"", label, "_id\""));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, "label name \"", label, "\" is listed twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBuckets(const std::string& metric, const std::vector<double>& buckets) {
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (!std::isfinite(buckets[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(metric, ": bucket ", i, " is ", FormatValue(buckets[i]),
                       "; bounds must be finite (the +Inf bucket is implicit, do not list it)"));
    }
    if (i > 0 && !(buckets[i] > buckets[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          metric, ": buckets must be strictly increasing, but bucket ", i, " (",
          FormatValue(buckets[i]), ") <= bucket ", i - 1, " (", FormatValue(buckets[i - 1]), ")"));
    }
  }
  return absl::OkStatus();
}

// ---- Registry -------------------------------------------------------------------

absl::Status Registry::Insert(const std::string& name, MetricType type,
                              std::unique_ptr<internal::FamilyBase> family) {
  std::vector<std::string> series = SeriesNames(name, type);
  absl::MutexLock lock(&mu_);
  for (const std::string& s : series) {
    if (series_names_.count(s) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric \"", name, "\": the series name \"", s,
                       "\" is already exported by another family in this registry"));
    }
  }
  series_names_.insert(series.begin(), series.end());
  families_.emplace(name, std::move(family));
  return absl::OkStatus();
}

namespace {

absl::Status ValidateFamily(const std::string& name, const std::string& help, MetricType type,
                            const std::vector<std::string>& label_names) {
  RETURN_IF_ERROR(ValidateMetricName(name, type));
  if (help.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric \"", name, "\": help text is empty; say what it measures"));
  }
  return ValidateLabelNames(name, label_names);
}

}  // namespace

absl::StatusOr<CounterFamily*> Registry::AddCounter(const std::string& name,
                                                    const std::string& help,
                                                    std::vector<std::string> label_names) {
  RETURN_IF_ERROR(ValidateFamily(name, help, MetricType::kCounter, label_names));
  auto family =
      std::make_unique<CounterFamily>(name, help, MetricType::kCounter, std::move(label_names),
                                      [] { return std::make_shared<Counter>(); });
  CounterFamily* raw = family.get();
  RETURN_IF_ERROR(Insert(name, MetricType::kCounter, std::move(family)));
  return raw;
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names) {
  RETURN_IF_ERROR(ValidateFamily(name, help, MetricType::kGauge, label_names));
  auto family =
      std::make_unique<GaugeFamily>(name, help, MetricType::kGauge, std::move(label_names),
                                    [] { return std::make_shared<Gauge>(); });
  GaugeFamily* raw = family.get();
  RETURN_IF_ERROR(Insert(name, MetricType::kGauge, std::move(family)));
  return raw;
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(const std::string& name,
                                                        const std::string& help,
                                                        std::vector<std::string> label_names,
                                                        std::vector<double> buckets) {
  RETURN_IF_ERROR(ValidateFamily(name, help, MetricType::kHistogram, label_names));
  RETURN_IF_ERROR(ValidateBuckets(name, buckets));
  auto bounds = std::make_shared<const std::vector<double>>(std::move(buckets));
  auto family =
      std::make_unique<HistogramFamily>(name, help, MetricType::kHistogram, std::move(label_names),
                                        [bounds] { return std::make_shared<Histogram>(bounds); });
  HistogramFamily* raw = family.get();
  RETURN_IF_ERROR(Insert(name, MetricType::kHistogram, std::move(family)));
  return raw;
}

absl::Status Registry::AddCallbackGauge(const std::string& name, const std::string& help,
                                        std::function<double()> fn) {
  if (!fn) {
    return absl::InvalidArgumentError(absl::StrCat("metric \"", name, "\": null callback"));
  }
  return AddCallbackGaugeFamily(name, help, {}, [fn = std::move(fn)] {
    return std::vector<CallbackSample>{CallbackSample{{}, fn()}};
  });
}

absl::Status Registry::AddCallbackGaugeFamily(const std::string& name, const std::string& help,
                                              std::vector<std::string> label_names,
                                              std::function<std::vector<CallbackSample>()> fn) {
  RETURN_IF_ERROR(ValidateFamily(name, help, MetricType::kGauge, label_names));
  if (!fn) {
    return absl::InvalidArgumentError(absl::StrCat("metric \"", name, "\": null callback"));
  }
  auto family =
      std::make_unique<CallbackGaugeFamily>(name, help, std::move(label_names), std::move(fn));
  return Insert(name, MetricType::kGauge, std::move(family));
}

std::vector<FamilySnapshot> Registry::Collect() const {
  std::vector<const internal::FamilyBase*> families;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, family] : families_) {
      families.push_back(family.get());
    }
  }
  // Families are never removed, so the pointers stay valid without the lock; the
  // lock is not held while callbacks run.
  std::vector<FamilySnapshot> out;
  out.reserve(families.size());
  for (const internal::FamilyBase* family : families) {
    out.push_back(family->Collect());
  }
  return out;
}

std::string Registry::Serialize() const { return WriteTextFormat(Collect()); }

}  // namespace metrics
}  // namespace ulysses
