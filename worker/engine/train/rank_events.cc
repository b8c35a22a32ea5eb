#include "worker/engine/train/rank_events.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/contract/rank_event.h"
#include "worker/engine/checkpoint/checkpoint.h"

namespace ulysses::engine::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Every stdout event goes through the one protocol definition (common/contract/rank_event.h).
// Serialised: the preemption watch (preemption.h) may report a checkpoint from its own thread.
ABSL_CONST_INIT absl::Mutex g_stdout_mu(absl::kConstInit);
void EmitEvent(const contract::RankEvent& event) {
  absl::MutexLock lock(&g_stdout_mu);
  contract::WriteRankEvent(std::cout, event);
}

void AppendMetrics(const std::string& out_dir, const json& line) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  std::ofstream f(fs::path(out_dir) / "metrics.jsonl", std::ios::app);
  f << line.dump() << "\n";
}

// The step event's optional per-rank fields (finite and >= 0, as the protocol requires).
void SetRankFigures(const RankStepFigures& f, contract::StepEvent* e) {
  auto seconds = [](double v) { return std::isfinite(v) ? std::max(0.0, v) : 0.0; };
  e->step_seconds = seconds(f.step_seconds);
  e->data_wait_seconds = seconds(f.data_wait_seconds);
  e->forward_seconds = seconds(f.forward_seconds);
  e->backward_seconds = seconds(f.backward_seconds);
  e->optimizer_seconds = seconds(f.optimizer_seconds);
  e->alltoall_seconds = seconds(f.alltoall_seconds);
  e->alltoall_bytes = std::max<int64_t>(0, f.alltoall_bytes);
  e->peak_allocated_bytes = std::max<int64_t>(0, f.peak_allocated_bytes);
  e->peak_reserved_bytes = std::max<int64_t>(0, f.peak_reserved_bytes);
  if (f.memory_limit_bytes > 0) e->memory_limit_bytes = f.memory_limit_bytes;
  e->rank_tokens_per_s = seconds(f.rank_tokens_per_s);
  if (f.model_flops_per_s > 0) e->model_flops_per_s = seconds(f.model_flops_per_s);
}

}  // namespace

GroupStepFigures GroupFigures(const std::vector<double>& step_seconds) {
  GroupStepFigures g;
  if (step_seconds.empty()) return g;
  std::vector<double> s;
  s.reserve(step_seconds.size());
  for (double v : step_seconds) s.push_back(std::isfinite(v) && v > 0 ? v : 0.0);
  g.slowest_rank = static_cast<int>(std::max_element(s.begin(), s.end()) - s.begin());
  g.slowest_step_seconds = s[g.slowest_rank];
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  g.median_step_seconds = n % 2 == 1 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  return g;
}

std::string ProgressLine(const contract::StepEvent& e,
                         std::optional<double> checkpoint_age_seconds) {
  // A person reads this line: the stage counts from 1 (docs/CONTRACTS.md, "Stage numbers");
  // the event's `stage` is the 0-based index.
  std::string line =
      absl::StrFormat("stage %d step %d/%d seq_len %d loss %.4f tok/s %.0f", e.stage + 1, e.step,
                      e.steps, e.seq_len, e.loss, e.tokens_per_s);
  if (e.mfu.has_value()) absl::StrAppendFormat(&line, " mfu %.1f%%", *e.mfu * 100);
  if (e.slowest_rank.has_value() && e.slowest_step_seconds.has_value()) {
    absl::StrAppendFormat(&line, " slowest r%d %.3fs", *e.slowest_rank, *e.slowest_step_seconds);
    if (e.median_step_seconds.has_value()) {
      absl::StrAppendFormat(&line, " (median %.3fs)", *e.median_step_seconds);
    }
  }
  if (checkpoint_age_seconds.has_value()) {
    absl::StrAppendFormat(&line, " ckpt %.0fs ago", std::max(0.0, *checkpoint_age_seconds));
  } else {
    absl::StrAppend(&line, " ckpt none");
  }
  return line;
}

int64_t PeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

RankReporter::RankReporter(bool enabled, std::string out_dir, bool step_events, bool progress_line)
    : enabled_(enabled),
      step_events_(step_events),
      progress_line_(progress_line),
      out_dir_(std::move(out_dir)) {}

void RankReporter::Step(const StepReport& r) {
  if ((step_events_ || (enabled_ && progress_line_)) && std::isfinite(r.stats.loss)) {
    contract::StepEvent event;
    event.stage = r.stage;
    event.step = r.step_in_stage;
    event.steps = r.steps;
    event.loss = r.stats.loss;
    event.tokens_per_s = r.tokens_per_s;
    event.seq_len = r.seq_len;
    if (r.rank.has_value()) SetRankFigures(*r.rank, &event);
    if (r.group.has_value()) {
      event.slowest_rank = r.group->slowest_rank;
      event.slowest_step_seconds = r.group->slowest_step_seconds;
      event.median_step_seconds = r.group->median_step_seconds;
    }
    if (r.mfu.has_value() && std::isfinite(*r.mfu) && *r.mfu >= 0) event.mfu = *r.mfu;
    // A skipped step's norm may be non-finite: the protocol carries finite ones only.
    if (std::isfinite(r.stats.grad_norm) && r.stats.grad_norm >= 0) {
      event.grad_norm = r.stats.grad_norm;
    }
    if (std::isfinite(r.lr) && r.lr >= 0) event.lr = r.lr;
    if (step_events_) EmitEvent(event);
    if (enabled_ && progress_line_) {
      std::cerr << ProgressLine(event, r.checkpoint_age_seconds) + "\n" << std::flush;
    }
  }
  if (!enabled_) return;
  if (!std::isfinite(r.stats.loss)) {
    // The protocol carries finite losses only; a skipped non-finite step is a log line
    // (metrics.jsonl records it with "skipped").
    absl::MutexLock lock(&g_stdout_mu);
    std::cout << "step " << r.step_in_stage << " of stage " << r.stage + 1
              << " skipped: non-finite loss" << std::endl;
  }
  AppendMetrics(out_dir_, json{{"step", r.global_step},
                               {"stage", r.stage},
                               {"step_in_stage", r.step_in_stage},
                               {"data_cursor", r.data_cursor},
                               {"seq_len", r.seq_len},
                               {"sp_degree", r.sp},
                               {"dp_degree", r.dp},
                               {"loss", r.stats.loss},
                               {"grad_norm", r.stats.grad_norm},
                               {"lr", r.lr},
                               {"tokens", static_cast<int64_t>(r.stats.tokens)},
                               {"tokens_per_s", r.tokens_per_s},
                               {"step_seconds", r.seconds},
                               {"skipped", r.stats.skipped},
                               {"loss_scale", r.stats.loss_scale},
                               {"peak_rss_bytes", PeakRssBytes()}});
}

void RankReporter::Eval(int stage, int64_t step, int64_t seq_len, const EvalResult& r) {
  if (!enabled_) return;
  contract::EvalEvent event;
  event.stage = stage;
  event.seq_len = seq_len;
  event.loss = r.loss;
  event.step = step;
  json metric{{"stage", stage},
              {"step_in_stage", step},
              {"seq_len", seq_len},
              {"loss", r.loss},
              {"tokens", r.tokens}};
  if (r.has_accuracy) {
    event.accuracy = r.accuracy;
    metric["accuracy"] = r.accuracy;
  }
  EmitEvent(event);
  AppendMetrics(out_dir_, json{{"eval", metric}});
}

void RankReporter::Checkpoint(int stage, int64_t step_in_stage, const std::string& path,
                              double seconds, std::optional<double> blocked_seconds) {
  if (!enabled_) return;
  absl::StatusOr<int64_t> bytes_or = CheckpointBytes(path);
  const int64_t bytes = bytes_or.ok() ? *bytes_or : -1;
  contract::CheckpointEvent event;
  event.stage = stage;
  event.step = step_in_stage;
  event.path = path;
  event.bytes = bytes;
  event.seconds = seconds;
  event.blocked_seconds = blocked_seconds;
  EmitEvent(event);
}

void RankReporter::Done(int stage, bool with_peak_rss) {
  if (!enabled_) return;
  contract::DoneEvent event;
  event.stage = stage;
  if (with_peak_rss) event.peak_rss_bytes = PeakRssBytes();
  EmitEvent(event);
}

}  // namespace ulysses::engine::train
