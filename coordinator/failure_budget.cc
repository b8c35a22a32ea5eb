#include "coordinator/failure_budget.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ulysses::coordinator {
namespace {

bool ProgressSince(const JobRecord& rec, int64_t ms) {
  return rec.last_checkpoint.has_value() && rec.last_checkpoint->committed_ms > ms;
}

bool InWindow(const JobRecord& rec, const FailureMark& m, int64_t now_ms) {
  return rec.failure_window_s <= 0 || now_ms - m.ms < rec.failure_window_s * 1000;
}

}  // namespace

BudgetCount CountFailure(JobRecord& rec, bool infra, int64_t now_ms) {
  BudgetCount out;
  out.infra = infra;
  out.budget = infra ? rec.max_infra_failures : rec.max_failures;
  auto& marks = rec.recent_failures;
  if (!marks.empty() && ProgressSince(rec, marks.back().ms)) {
    marks.clear();
    out.progress = true;
  }
  marks.erase(std::remove_if(marks.begin(), marks.end(),
                             [&](const FailureMark& m) { return !InWindow(rec, m, now_ms); }),
              marks.end());
  marks.push_back({now_ms, infra});
  int same = 0;
  for (const FailureMark& m : marks) same += m.infra == infra ? 1 : 0;
  if (same > kMaxRememberedFailures) {  // Forget the oldest of this kind.
    auto oldest = std::find_if(marks.begin(), marks.end(),
                               [&](const FailureMark& m) { return m.infra == infra; });
    marks.erase(oldest);
    --same;
  }
  out.count = same;
  out.exhausted = out.count >= out.budget;
  return out;
}

int CountingFailures(const JobRecord& rec, bool infra, int64_t now_ms) {
  const auto& marks = rec.recent_failures;
  if (marks.empty() || ProgressSince(rec, marks.back().ms)) return 0;
  int n = 0;
  for (const FailureMark& m : marks) n += m.infra == infra && InWindow(rec, m, now_ms) ? 1 : 0;
  return n;
}

std::string EncodeFailureMarks(const std::vector<FailureMark>& marks) {
  std::string out;
  for (const FailureMark& m : marks) {
    absl::StrAppend(&out, out.empty() ? "" : " ", m.infra ? "i" : "a", m.ms);
  }
  return out;
}

absl::StatusOr<std::vector<FailureMark>> DecodeFailureMarks(const std::string& text) {
  std::vector<FailureMark> out;
  for (absl::string_view item : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    FailureMark m;
    if ((item[0] != 'a' && item[0] != 'i') || !absl::SimpleAtoi(item.substr(1), &m.ms)) {
      return absl::DataLossError(
          absl::StrCat("jobs.recent_failures: '", item, "' is not a<ms> or i<ms>"));
    }
    m.infra = item[0] == 'i';
    out.push_back(m);
  }
  return out;
}

}  // namespace ulysses::coordinator
