#include "common/contract/rank_event.h"

#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ulysses::contract {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxStage = std::numeric_limits<int32_t>::max();     // v1 stage is int32.
constexpr int64_t kMaxRank = std::numeric_limits<int32_t>::max() - 1;  // v1 rank is int32.
constexpr size_t kMaxPathBytes = 4096;

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// The optional per-rank fields of a step event, in wire order within each type.
template <typename E>
auto StepNumbers(E& e) {
  return std::array<std::pair<const char*, decltype(&e.step_seconds)>, 13>{{
      {"step_seconds", &e.step_seconds},
      {"data_wait_seconds", &e.data_wait_seconds},
      {"forward_seconds", &e.forward_seconds},
      {"backward_seconds", &e.backward_seconds},
      {"optimizer_seconds", &e.optimizer_seconds},
      {"alltoall_seconds", &e.alltoall_seconds},
      {"rank_tokens_per_s", &e.rank_tokens_per_s},
      {"model_flops_per_s", &e.model_flops_per_s},
      {"mfu", &e.mfu},
      {"median_step_seconds", &e.median_step_seconds},
      {"slowest_step_seconds", &e.slowest_step_seconds},
      {"grad_norm", &e.grad_norm},
      {"lr", &e.lr},
  }};
}
template <typename E>
auto StepInts(E& e) {
  return std::array<std::pair<const char*, decltype(&e.alltoall_bytes)>, 5>{{
      {"alltoall_bytes", &e.alltoall_bytes},
      {"peak_allocated_bytes", &e.peak_allocated_bytes},
      {"peak_reserved_bytes", &e.peak_reserved_bytes},
      {"memory_limit_bytes", &e.memory_limit_bytes},
      {"slowest_rank", &e.slowest_rank},
  }};
}

ordered_json ToJson(const RankEvent& event) {
  return std::visit(
      Overloaded{
          [](const StepEvent& e) {
            ordered_json j{
                {"event", StepEvent::kKind}, {"stage", e.stage}, {"step", e.step},
                {"steps", e.steps},          {"loss", e.loss},   {"tokens_per_s", e.tokens_per_s},
                {"seq_len", e.seq_len}};
            for (const auto& [key, value] : StepNumbers(e)) {
              if (value->has_value()) j[key] = **value;
            }
            for (const auto& [key, value] : StepInts(e)) {
              if (value->has_value()) j[key] = **value;
            }
            return j;
          },
          [](const CheckpointEvent& e) {
            ordered_json j{{"event", CheckpointEvent::kKind},
                           {"stage", e.stage},
                           {"step", e.step},
                           {"path", e.path},
                           {"bytes", e.bytes},
                           {"seconds", e.seconds}};
            if (e.blocked_seconds.has_value()) j["blocked_seconds"] = *e.blocked_seconds;
            return j;
          },
          [](const EvalEvent& e) {
            ordered_json j{{"event", EvalEvent::kKind},
                           {"stage", e.stage},
                           {"seq_len", e.seq_len},
                           {"loss", e.loss}};
            if (e.accuracy.has_value()) j["accuracy"] = *e.accuracy;
            if (e.step.has_value()) j["step"] = *e.step;
            return j;
          },
          [](const DoneEvent& e) {
            ordered_json j{{"event", DoneEvent::kKind}, {"stage", e.stage}};
            if (e.peak_rss_bytes.has_value()) j["peak_rss_bytes"] = *e.peak_rss_bytes;
            return j;
          },
      },
      event);
}

std::string Shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

std::string IntRule(int64_t min, int64_t max) {
  if (max == kNoMax) return absl::StrCat("an integer >= ", min);
  return absl::StrCat("an integer in [", min, ", ", max, "]");
}

std::string NumberRule(double min, double max) {
  if (std::isinf(max)) return absl::StrCat("a finite number >= ", min);
  return absl::StrCat("a finite number in [", min, ", ", max, "]");
}

// Reads the fields of one event object, checking each against its rule, and
// remembers which fields were read so NoOtherFields can reject the rest.
class FieldReader {
 public:
  FieldReader(const json& object, const char* kind) : object_(object), kind_(kind) {}

  absl::Status Int(const char* key, int64_t min, int64_t max, int64_t* out) {
    const json* value = Find(key);
    if (value == nullptr) return Missing(key, IntRule(min, max));
    return ReadInt(key, *value, min, max, out);
  }

  absl::Status OptionalInt(const char* key, int64_t min, int64_t max, std::optional<int64_t>* out) {
    const json* value = Find(key);
    if (value == nullptr) return absl::OkStatus();
    int64_t v = 0;
    if (absl::Status s = ReadInt(key, *value, min, max, &v); !s.ok()) return s;
    *out = v;
    return absl::OkStatus();
  }

  absl::Status Number(const char* key, double min, double max, double* out) {
    const json* value = Find(key);
    if (value == nullptr) return Missing(key, NumberRule(min, max));
    return ReadNumber(key, *value, min, max, out);
  }

  absl::Status OptionalNumber(const char* key, double min, double max, std::optional<double>* out) {
    const json* value = Find(key);
    if (value == nullptr) return absl::OkStatus();
    double v = 0;
    if (absl::Status s = ReadNumber(key, *value, min, max, &v); !s.ok()) return s;
    *out = v;
    return absl::OkStatus();
  }

  absl::Status Path(const char* key, std::string* out) {
    constexpr char kRule[] = "a non-empty path of at most 4096 bytes without control characters";
    const json* value = Find(key);
    if (value == nullptr) return Missing(key, kRule);
    if (!value->is_string())
      return Error(key, *value, absl::StrCat("is not a string (", kRule, ")"));
    const std::string& path = value->get_ref<const std::string&>();
    bool control = false;
    for (unsigned char c : path) control = control || c < 0x20 || c == 0x7f;
    if (path.empty() || path.size() > kMaxPathBytes || control) {
      return Error(key, *value, absl::StrCat("is not a valid path (", kRule, ")"));
    }
    *out = path;
    return absl::OkStatus();
  }

  absl::Status NoOtherFields() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (it.key() == "event" || read_.count(it.key()) > 0) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(kind_, ".", it.key(), ": unknown field (a ", kind_,
                       " event has only the fields listed in docs/CONTRACTS.md; remove it)"));
    }
    return absl::OkStatus();
  }

 private:
  const json* Find(const char* key) {
    auto it = object_.find(key);
    if (it == object_.end()) return nullptr;
    read_.insert(key);
    return &*it;
  }

  absl::Status ReadInt(const char* key, const json& value, int64_t min, int64_t max,
                       int64_t* out) const {
    const std::string rule = IntRule(min, max);
    if (!value.is_number_integer()) {
      return Error(key, value, absl::StrCat("is not an integer (", rule, ")"));
    }
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(kNoMax)) {
      return Error(key, value, absl::StrCat("is out of range (", rule, ")"));
    }
    const int64_t v = value.get<int64_t>();
    if (v < min || v > max) return Error(key, value, absl::StrCat("is out of range (", rule, ")"));
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ReadNumber(const char* key, const json& value, double min, double max,
                          double* out) const {
    const std::string rule = NumberRule(min, max);
    if (!value.is_number()) return Error(key, value, absl::StrCat("is not a number (", rule, ")"));
    const double v = value.get<double>();
    if (!std::isfinite(v) || v < min || v > max) {
      return Error(key, value, absl::StrCat("is out of range (", rule, ")"));
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status Missing(const char* key, const std::string& rule) const {
    return absl::InvalidArgumentError(absl::StrCat(kind_, ".", key, ": missing (a ", kind_,
                                                   " event needs \"", key, "\": ", rule, ")"));
  }

  absl::Status Error(const char* key, const json& value, const std::string& problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(kind_, ".", key, ": ", Shown(value), " ", problem));
  }

  const json& object_;
  const char* kind_;
  std::set<std::string> read_;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

absl::StatusOr<RankEvent> ReadStep(FieldReader& r) {
  StepEvent e;
  if (auto s = r.Int("stage", 0, kMaxStage, &e.stage); !s.ok()) return s;
  if (auto s = r.Int("steps", 1, kNoMax, &e.steps); !s.ok()) return s;
  if (auto s = r.Int("step", 1, e.steps, &e.step); !s.ok()) return s;
  if (auto s = r.Number("loss", 0, kInf, &e.loss); !s.ok()) return s;
  if (auto s = r.Number("tokens_per_s", 0, kInf, &e.tokens_per_s); !s.ok()) return s;
  if (auto s = r.Int("seq_len", 1, kNoMax, &e.seq_len); !s.ok()) return s;
  for (const auto& [key, value] : StepNumbers(e)) {
    if (auto s = r.OptionalNumber(key, 0, kInf, value); !s.ok()) return s;
  }
  for (const auto& [key, value] : StepInts(e)) {
    // A rank is a v1 int32 (WorkRef.rank); the other counts are bytes.
    const int64_t max = value == &e.slowest_rank ? kMaxRank : kNoMax;
    if (auto s = r.OptionalInt(key, 0, max, value); !s.ok()) return s;
  }
  if (e.slowest_rank.has_value() != e.slowest_step_seconds.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step.slowest_rank: ",
        e.slowest_rank.has_value() ? absl::StrCat(*e.slowest_rank) : "absent",
        " but step.slowest_step_seconds ", e.slowest_step_seconds.has_value() ? "given" : "absent",
        " (give both, or neither)"));
  }
  return e;
}

absl::StatusOr<RankEvent> ReadCheckpoint(FieldReader& r) {
  CheckpointEvent e;
  if (auto s = r.Int("stage", 0, kMaxStage, &e.stage); !s.ok()) return s;
  if (auto s = r.Int("step", 0, kNoMax, &e.step); !s.ok()) return s;
  if (auto s = r.Path("path", &e.path); !s.ok()) return s;
  if (auto s = r.Int("bytes", -1, kNoMax, &e.bytes); !s.ok()) return s;
  if (auto s = r.Number("seconds", 0, kInf, &e.seconds); !s.ok()) return s;
  if (auto s = r.OptionalNumber("blocked_seconds", 0, kInf, &e.blocked_seconds); !s.ok()) return s;
  return e;
}

absl::StatusOr<RankEvent> ReadEval(FieldReader& r) {
  EvalEvent e;
  if (auto s = r.Int("stage", 0, kMaxStage, &e.stage); !s.ok()) return s;
  if (auto s = r.Int("seq_len", 1, kNoMax, &e.seq_len); !s.ok()) return s;
  if (auto s = r.Number("loss", 0, kInf, &e.loss); !s.ok()) return s;
  if (auto s = r.OptionalNumber("accuracy", 0, 1, &e.accuracy); !s.ok()) return s;
  if (auto s = r.OptionalInt("step", 0, kNoMax, &e.step); !s.ok()) return s;
  return e;
}

absl::StatusOr<RankEvent> ReadDone(FieldReader& r) {
  DoneEvent e;
  if (auto s = r.Int("stage", 0, kMaxStage, &e.stage); !s.ok()) return s;
  if (auto s = r.OptionalInt("peak_rss_bytes", 0, kNoMax, &e.peak_rss_bytes); !s.ok()) return s;
  return e;
}

struct EventReader {
  const char* kind;
  absl::StatusOr<RankEvent> (*read)(FieldReader&);
};
constexpr EventReader kEventReaders[] = {{StepEvent::kKind, ReadStep},
                                         {CheckpointEvent::kKind, ReadCheckpoint},
                                         {EvalEvent::kKind, ReadEval},
                                         {DoneEvent::kKind, ReadDone}};

}  // namespace

const char* RankEventKind(const RankEvent& event) {
  return std::visit([](const auto& e) { return std::decay_t<decltype(e)>::kKind; }, event);
}

std::string SerializeRankEvent(const RankEvent& event) { return ToJson(event).dump(); }

void WriteRankEvent(std::ostream& out, const RankEvent& event) {
  out << SerializeRankEvent(event) + "\n" << std::flush;
}

absl::StatusOr<std::optional<RankEvent>> ParseRankEventLine(absl::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty() || line.front() != '{') return std::nullopt;
  const json object = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  const bool claims_event = absl::StartsWith(line, "{\"event\"");
  if (object.is_discarded() || !object.is_object()) {
    if (!claims_event) return std::nullopt;
    return absl::InvalidArgumentError(
        "event line is not a JSON object (one complete JSON object per line)");
  }
  auto kind_it = object.find("event");
  if (kind_it == object.end()) return std::nullopt;
  if (!kind_it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event: ", Shown(*kind_it), " is not a string (one of step, checkpoint, eval, done)"));
  }
  const std::string& kind = kind_it->get_ref<const std::string&>();
  for (const EventReader& reader : kEventReaders) {
    if (kind != reader.kind) continue;
    FieldReader fields(object, reader.kind);
    absl::StatusOr<RankEvent> event = reader.read(fields);
    if (!event.ok()) return event.status();
    if (absl::Status s = fields.NoOtherFields(); !s.ok()) return s;
    return std::optional<RankEvent>(*std::move(event));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "event: ", Shown(*kind_it), " is not an event kind (one of step, checkpoint, eval, done)"));
}

bool operator==(const StepEvent& a, const StepEvent& b) {
  if (!(a.stage == b.stage && a.step == b.step && a.steps == b.steps && a.loss == b.loss &&
        a.tokens_per_s == b.tokens_per_s && a.seq_len == b.seq_len)) {
    return false;
  }
  const auto an = StepNumbers(a), bn = StepNumbers(b);
  for (size_t i = 0; i < an.size(); ++i) {
    if (*an[i].second != *bn[i].second) return false;
  }
  const auto ai = StepInts(a), bi = StepInts(b);
  for (size_t i = 0; i < ai.size(); ++i) {
    if (*ai[i].second != *bi[i].second) return false;
  }
  return true;
}
bool operator==(const CheckpointEvent& a, const CheckpointEvent& b) {
  return a.stage == b.stage && a.step == b.step && a.path == b.path && a.bytes == b.bytes &&
         a.seconds == b.seconds && a.blocked_seconds == b.blocked_seconds;
}
bool operator==(const EvalEvent& a, const EvalEvent& b) {
  return a.stage == b.stage && a.seq_len == b.seq_len && a.loss == b.loss &&
         a.accuracy == b.accuracy && a.step == b.step;
}
bool operator==(const DoneEvent& a, const DoneEvent& b) {
  return a.stage == b.stage && a.peak_rss_bytes == b.peak_rss_bytes;
}

}  // namespace ulysses::contract
