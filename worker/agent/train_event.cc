#include "worker/agent/train_event.h"

#include <sys/wait.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ulysses::agent {
namespace {

using nlohmann::json;

absl::Status ReadInt(const json& obj, const char* key, bool required, int64_t* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("event is missing \"", key, "\""));
    return absl::OkStatus();
  }
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("event field \"", key, "\" is not a number"));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadDouble(const json& obj, const char* key, double* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("event field \"", key, "\" is not a number"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

}  // namespace

const char* TrainEventKindName(TrainEvent::Kind kind) {
  switch (kind) {
    case TrainEvent::Kind::kStep:
      return "step";
    case TrainEvent::Kind::kCheckpoint:
      return "checkpoint";
    case TrainEvent::Kind::kEval:
      return "eval";
    case TrainEvent::Kind::kDone:
      return "done";
  }
  return "?";
}

absl::StatusOr<TrainEvent> ParseTrainEvent(absl::string_view line) {
  if (line.empty() || line.front() != '{') {
    return absl::InvalidArgumentError("not a JSON event line");
  }
  json obj = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded() || !obj.is_object()) {
    return absl::InvalidArgumentError("not a JSON object");
  }
  auto kind_it = obj.find("event");
  if (kind_it == obj.end() || !kind_it->is_string()) {
    return absl::InvalidArgumentError("JSON line has no string \"event\" field");
  }
  const std::string kind = kind_it->get<std::string>();
  TrainEvent event;
  if (kind == "step") {
    event.kind = TrainEvent::Kind::kStep;
  } else if (kind == "checkpoint") {
    event.kind = TrainEvent::Kind::kCheckpoint;
  } else if (kind == "eval") {
    event.kind = TrainEvent::Kind::kEval;
  } else if (kind == "done") {
    event.kind = TrainEvent::Kind::kDone;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown event \"", kind, "\""));
  }
  const bool is_step = event.kind == TrainEvent::Kind::kStep;
  const bool is_ckpt = event.kind == TrainEvent::Kind::kCheckpoint;
  if (auto s = ReadInt(obj, "stage", true, &event.stage); !s.ok()) return s;
  if (auto s = ReadInt(obj, "step", is_step || is_ckpt, &event.step); !s.ok()) return s;
  if (auto s = ReadInt(obj, "steps", false, &event.steps); !s.ok()) return s;
  if (auto s = ReadInt(obj, "seq_len", false, &event.seq_len); !s.ok()) return s;
  if (auto s = ReadInt(obj, "bytes", false, &event.bytes); !s.ok()) return s;
  if (auto s = ReadDouble(obj, "loss", &event.loss); !s.ok()) return s;
  if (auto s = ReadDouble(obj, "tokens_per_s", &event.tokens_per_s); !s.ok()) return s;
  if (auto s = ReadDouble(obj, "seconds", &event.seconds); !s.ok()) return s;
  auto acc = obj.find("accuracy");
  if (acc != obj.end() && acc->is_number()) event.accuracy = acc->get<double>();
  auto path = obj.find("path");
  if (path != obj.end() && path->is_string()) event.path = path->get<std::string>();
  if (is_ckpt && event.path.empty()) {
    return absl::InvalidArgumentError("checkpoint event has no \"path\"");
  }
  return event;
}

const char* AttemptOutcomeName(AttemptOutcome outcome) {
  switch (outcome) {
    case AttemptOutcome::kSucceeded:
      return "succeeded";
    case AttemptOutcome::kPreempted:
      return "preempted";
    case AttemptOutcome::kBadInput:
      return "bad_input";
    case AttemptOutcome::kFailed:
      return "failed";
    case AttemptOutcome::kAborted:
      return "aborted";
  }
  return "?";
}

AttemptOutcome MapExit(int wait_status, StopCause cause) {
  const bool exited = WIFEXITED(wait_status);
  const int code = exited ? WEXITSTATUS(wait_status) : -1;
  if (exited && code == kExitStageFinished) return AttemptOutcome::kSucceeded;
  switch (cause) {
    case StopCause::kAbort:
      return AttemptOutcome::kAborted;
    case StopCause::kPreempt:
      return AttemptOutcome::kPreempted;
    case StopCause::kNone:
      break;
  }
  if (!exited) return AttemptOutcome::kFailed;
  if (code == kExitPreempted) return AttemptOutcome::kPreempted;
  if (code == kExitBadInput) return AttemptOutcome::kBadInput;
  return AttemptOutcome::kFailed;
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* name = strsignal(sig);
    return absl::StrCat("killed by signal ", sig, " (", name ? name : "?", ")");
  }
  return absl::StrCat("wait status ", wait_status);
}

}  // namespace ulysses::agent
