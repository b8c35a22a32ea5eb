#include "worker/agent/agent_messages.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/contract/rank_control.h"

namespace ulysses::agent {

namespace v1 = ::ulysses::v1;

void SetNow(google::protobuf::Timestamp* ts) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  ts->set_seconds(nanos / 1000000000);
  ts->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

bool NeedsAck(const v1::WorkerMessage& msg) { return msg.has_checkpoint() || msg.has_exited(); }

bool SameWork(const v1::WorkRef& a, const v1::WorkRef& b) {
  return a.job_id() == b.job_id() && a.generation() == b.generation();
}

std::string RefString(const v1::WorkRef& ref) {
  return absl::StrCat(ref.job_id(), " gen ", ref.generation(), " stage ", ref.stage(), " rank ",
                      ref.rank());
}

// The rank's events as the session's shared types (the one conversion on this hop).
v1::StepProgress ToProto(const contract::StepEvent& e) {
  v1::StepProgress p;
  p.set_stage(static_cast<int32_t>(e.stage));
  p.set_step(e.step);
  p.set_steps(e.steps);
  p.set_loss(e.loss);
  p.set_tokens_per_s(e.tokens_per_s);
  p.set_seq_len(e.seq_len);
  if (e.step_seconds.has_value()) p.set_step_seconds(*e.step_seconds);
  if (e.mfu.has_value()) p.set_mfu(*e.mfu);
  if (e.median_step_seconds.has_value()) p.set_median_step_seconds(*e.median_step_seconds);
  if (e.slowest_rank.has_value() && e.slowest_step_seconds.has_value()) {
    p.set_slowest_rank(static_cast<int32_t>(*e.slowest_rank));  // <= int32 max - 1 (contract)
    p.set_slowest_step_seconds(*e.slowest_step_seconds);
  }
  return p;
}
v1::Checkpoint ToProto(const contract::CheckpointEvent& e) {
  v1::Checkpoint c;
  c.set_path(e.path);
  c.set_stage(static_cast<int32_t>(e.stage));
  c.set_step(e.step);
  c.set_bytes(e.bytes);
  c.set_seconds(e.seconds);
  if (e.blocked_seconds.has_value()) c.set_blocked_seconds(*e.blocked_seconds);
  return c;
}
v1::EvalResult ToProto(const contract::EvalEvent& e) {
  v1::EvalResult r;
  r.set_stage(static_cast<int32_t>(e.stage));
  r.set_seq_len(e.seq_len);
  r.set_loss(e.loss);
  if (e.accuracy.has_value()) r.set_accuracy(*e.accuracy);
  r.set_step(e.step.value_or(0));
  return r;
}

absl::StatusOr<std::string> IntervalControlLine(const v1::CheckpointInterval& interval) {
  contract::CheckpointIntervalControl c;
  c.version = interval.version();
  c.every_steps = interval.every_steps();
  c.every_seconds = interval.every_seconds();
  c.reason = interval.reason();
  return contract::SerializeRankControl(c);
}

std::string LastLines(const std::string& tail) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(tail, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) lines.emplace_back(line);
  }
  std::string out;
  const size_t first = lines.size() > 2 ? lines.size() - 2 : 0;
  for (size_t i = first; i < lines.size(); ++i) {
    if (!out.empty()) out += " | ";
    out += lines[i];
  }
  if (out.size() > 500) out = out.substr(out.size() - 500);
  return out;
}

RankLabels Labels(const v1::WorkRef& ref) { return {ref.job_id(), ref.stage(), ref.rank()}; }

}  // namespace ulysses::agent
