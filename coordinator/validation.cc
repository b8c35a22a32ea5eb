#include "coordinator/validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "google/protobuf/util/time_util.h"

namespace ulysses::coordinator {
namespace {

using google::protobuf::util::TimeUtil;

constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

absl::Status Invalid(absl::string_view field, absl::string_view value, absl::string_view problem,
                     absl::string_view fix) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " ", problem, " (", fix, ")"));
}

// A string as shown in a message: quoted and escaped when short, else only its size.
std::string Shown(absl::string_view text) {
  if (text.size() > 64) return absl::StrCat(text.size(), " bytes");
  return absl::StrCat("'", absl::CHexEscape(text), "'");
}

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }

// Every character is alphanumeric or one of `extra`.
bool OnlyAlnumAnd(absl::string_view text, absl::string_view extra) {
  for (char c : text) {
    if (!IsAlnum(c) && extra.find(c) == absl::string_view::npos) return false;
  }
  return true;
}

// DNS-1123 subdomain: dot-separated labels of [a-z0-9-], each starting and ending
// with a letter or digit (the length is checked by the caller).
bool IsDns1123Subdomain(absl::string_view name) {
  if (name.empty()) return false;
  char prev = '.';
  for (char c : name) {
    if (c == '.') {
      if (!IsLowerAlnum(prev)) return false;
    } else if (c == '-') {
      if (prev == '.') return false;
    } else if (!IsLowerAlnum(c)) {
      return false;
    }
    prev = c;
  }
  return IsLowerAlnum(prev);
}

absl::Status CheckLength(absl::string_view field, absl::string_view text, size_t max,
                         absl::string_view fix) {
  if (text.size() <= max) return absl::OkStatus();
  return Invalid(field, absl::StrCat(text.size(), " bytes"), absl::StrCat("is longer than ", max),
                 fix);
}

absl::Status CheckNoControl(absl::string_view field, absl::string_view text,
                            absl::string_view fix) {
  for (char c : text) {
    if (IsControl(static_cast<unsigned char>(c))) {
      return Invalid(field, Shown(text), "contains control characters", fix);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInt(absl::string_view field, int64_t value, int64_t min, int64_t max,
                      absl::string_view fix) {
  if (value >= min && value <= max) return absl::OkStatus();
  if (max == kNoMax)
    return Invalid(field, absl::StrCat(value), absl::StrCat("must be >= ", min), fix);
  return Invalid(field, absl::StrCat(value), absl::StrCat("is out of range [", min, ", ", max, "]"),
                 fix);
}

// NaN and infinities are refused whatever the range.
absl::Status CheckNumber(absl::string_view field, double value, double min, double max,
                         absl::string_view fix) {
  if (std::isfinite(value) && value >= min && value <= max) return absl::OkStatus();
  const std::string rule = std::isinf(max)
                               ? absl::StrCat("is not a finite number >= ", min)
                               : absl::StrCat("is not a finite number in [", min, ", ", max, "]");
  return Invalid(field, absl::StrCat(value), rule, fix);
}

absl::Status CheckTimestamp(absl::string_view field, const google::protobuf::Timestamp& ts) {
  if (ts.seconds() >= TimeUtil::kTimestampMinSeconds &&
      ts.seconds() <= TimeUtil::kTimestampMaxSeconds && ts.nanos() >= 0 &&
      ts.nanos() <= 999999999) {
    return absl::OkStatus();
  }
  return Invalid(field, absl::StrCat("{seconds: ", ts.seconds(), ", nanos: ", ts.nanos(), "}"),
                 "is not a valid timestamp",
                 "years 1..9999, nanos in [0, 999999999]; leave it unset for now");
}

absl::Status CheckJobId(absl::string_view field, absl::string_view id) {
  constexpr char kFix[] = "use a job id from SubmitJob or ListJobs, e.g. job-000001";
  if (id.empty()) return Invalid(field, "''", "is empty", kFix);
  RETURN_IF_ERROR(CheckLength(field, id, kMaxJobIdBytes, kFix));
  if (!OnlyAlnumAnd(id, "._-")) {
    return Invalid(field, Shown(id), "has characters other than [A-Za-z0-9._-]", kFix);
  }
  return absl::OkStatus();
}

// `stages` empty: the job is unknown here and the stage bound is left to fencing.
absl::Status CheckWorkRef(const std::string& field, const v1::WorkRef& ref,
                          absl::Span<const StageRecord> stages) {
  constexpr char kFix[] = "send the ref of the assignment unchanged";
  RETURN_IF_ERROR(CheckJobId(field + ".job_id", ref.job_id()));
  RETURN_IF_ERROR(CheckInt(field + ".generation", ref.generation(), 1, kNoMax, kFix));
  RETURN_IF_ERROR(CheckInt(field + ".rank", ref.rank(), 0, kMaxRank - 1, kFix));
  RETURN_IF_ERROR(CheckInt(field + ".stage", ref.stage(), 0, kNoMax, kFix));
  if (!stages.empty() && static_cast<size_t>(ref.stage()) >= stages.size()) {
    return Invalid(field + ".stage", absl::StrCat(ref.stage()),
                   absl::StrCat("is not a stage of ", ref.job_id(), " (it has ", stages.size(),
                                ": 0..", stages.size() - 1, ")"),
                   kFix);
  }
  return absl::OkStatus();
}

// The stage `ref` names, or nullptr when the job is unknown (CheckWorkRef passed).
const StageRecord* StageOf(const v1::WorkRef& ref, absl::Span<const StageRecord> stages) {
  return stages.empty() ? nullptr : &stages[static_cast<size_t>(ref.stage())];
}

// A shared type's own stage field must repeat its ref's.
absl::Status CheckSameStage(const std::string& field, int32_t stage, const v1::WorkRef& ref) {
  if (stage == ref.stage()) return absl::OkStatus();
  return Invalid(field, absl::StrCat(stage), absl::StrCat("is not the ref's stage ", ref.stage()),
                 "report the stage of the assignment");
}

absl::Status CheckRunningWork(const std::string& field, const v1::RunningWork& running) {
  RETURN_IF_ERROR(CheckWorkRef(field + ".ref", running.ref(), {}));
  RETURN_IF_ERROR(
      CheckInt(field + ".slot", running.slot(), 0, kMaxCapacity - 1, "send the rank's slot"));
  return CheckInt(field + ".pid", running.pid(), 0, kNoMax, "send the child's pid, or 0");
}

// A list of running ranks (RegisterRequest, Heartbeat): at most `slots`, each on its own slot.
absl::Status CheckRunningRanks(const std::string& field,
                               const google::protobuf::RepeatedPtrField<v1::RunningWork>& ranks,
                               int slots) {
  if (ranks.size() > slots) {
    return Invalid(field, absl::StrCat(ranks.size(), " entries"),
                   absl::StrCat("is more than the worker's ", slots, " slots"),
                   "report each running rank once");
  }
  std::set<int> seen;
  for (int i = 0; i < ranks.size(); ++i) {
    const std::string name = absl::StrCat(field, "[", i, "]");
    RETURN_IF_ERROR(CheckRunningWork(name, ranks[i]));
    if (ranks[i].slot() >= slots) {
      return Invalid(name + ".slot", absl::StrCat(ranks[i].slot()),
                     absl::StrCat("is not one of the worker's ", slots, " slots"),
                     "report the slot the coordinator assigned");
    }
    if (!seen.insert(ranks[i].slot()).second) {
      return Invalid(name + ".slot", absl::StrCat(ranks[i].slot()), "is reported twice",
                     "report each slot's rank once");
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// JobService

absl::Status ValidateSubmitJobRequest(const v1::SubmitJobRequest& request) {
  if (request.overrides_size() > kMaxOverrides) {
    return Invalid("overrides", absl::StrCat(request.overrides_size(), " entries"),
                   absl::StrCat("are more than ", kMaxOverrides),
                   "put the values in the spec document instead");
  }
  for (int i = 0; i < request.overrides_size(); ++i) {
    const std::string field = absl::StrCat("overrides[", i, "]");
    RETURN_IF_ERROR(CheckLength(field, request.overrides(i), kMaxOverrideBytes,
                                "an override is one spec.path=value; put long values in the spec"));
    RETURN_IF_ERROR(
        CheckNoControl(field, request.overrides(i), "write spec.path=value on one line"));
  }
  constexpr char kRequestIdFix[] =
      "use at most 128 of [A-Za-z0-9._-], e.g. a UUID, fresh per submission and reused on retry";
  RETURN_IF_ERROR(
      CheckLength("request_id", request.request_id(), kMaxRequestIdBytes, kRequestIdFix));
  if (!OnlyAlnumAnd(request.request_id(), "._-")) {
    return Invalid("request_id", Shown(request.request_id()),
                   "has characters other than [A-Za-z0-9._-]", kRequestIdFix);
  }
  return absl::OkStatus();
}

absl::Status ValidateListWorkersRequest(const v1::ListWorkersRequest& request) {
  if (request.page_size() < 0) {
    return Invalid("page_size", absl::StrCat(request.page_size()), "is negative",
                   "use 0 for the default or a positive page size");
  }
  constexpr char kFix[] = "pass next_page_token from the previous ListWorkers response, or omit it";
  RETURN_IF_ERROR(CheckLength("page_token", request.page_token(), kMaxWorkerPageTokenBytes, kFix));
  return CheckNoControl("page_token", request.page_token(), kFix);
}

absl::Status ValidateGetJobRequest(const v1::GetJobRequest& request) {
  return CheckJobId("job_id", request.job_id());
}

absl::Status ValidateListJobsRequest(const v1::ListJobsRequest& request) {
  if (request.states_size() > kMaxStateFilters) {
    return Invalid("states", absl::StrCat(request.states_size(), " entries"),
                   absl::StrCat("are more than ", kMaxStateFilters),
                   "list each state at most once, or none for every state");
  }
  for (int i = 0; i < request.states_size(); ++i) {
    const int state = request.states(i);
    if (!v1::JobState_IsValid(state) || state == v1::JOB_STATE_UNSPECIFIED) {
      return Invalid(absl::StrCat("states[", i, "]"), absl::StrCat(state), "is not a job state",
                     "use JOB_STATE_PENDING .. JOB_STATE_CANCELLED");
    }
  }
  RETURN_IF_ERROR(CheckLength("name", request.name(), 253, "use a job's metadata.name"));
  RETURN_IF_ERROR(CheckLength("tenant", request.tenant(), 128, "use a tenant's name"));
  if (request.labels_size() > 16) {
    return Invalid("labels", absl::StrCat(request.labels_size(), " entries"), "are more than 16",
                   "filter by at most 16 labels");
  }
  for (int i = 0; i < request.labels_size(); ++i) {
    const std::string field = absl::StrCat("labels[", i, "]");
    RETURN_IF_ERROR(CheckLength(field, request.labels(i), 317, "use key=value"));
    const size_t eq = request.labels(i).find('=');
    if (eq == std::string::npos || eq == 0) {
      return Invalid(field, absl::StrCat("\"", request.labels(i), "\""), "is not key=value",
                     "use e.g. team=research");
    }
  }
  return CheckLength("page_token", request.page_token(), kMaxPageTokenBytes,
                     "pass next_page_token from the previous ListJobs response, or omit it");
}

absl::Status ValidateCancelJobRequest(const v1::CancelJobRequest& request) {
  RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  constexpr char kFix[] = "give a one-line reason of at most 1 KiB, or none";
  RETURN_IF_ERROR(CheckLength("reason", request.reason(), kMaxReasonBytes, kFix));
  return CheckNoControl("reason", request.reason(), kFix);
}

absl::Status ValidateResumeJobRequest(const v1::ResumeJobRequest& request) {
  return CheckJobId("job_id", request.job_id());
}

absl::Status ValidateWatchJobRequest(const v1::WatchJobRequest& request) {
  return CheckJobId("job_id", request.job_id());
}

absl::Status ValidateGetJobLogsRequest(const v1::GetJobLogsRequest& request) {
  RETURN_IF_ERROR(CheckJobId("job_id", request.job_id()));
  return CheckInt("tail_lines", request.tail_lines(), -1, kNoMax,
                  "use 0 for the last 100 lines, N for the last N, -1 for the whole buffer");
}

// ---------------------------------------------------------------------------
// WorkerService

absl::Status ValidateRegisterRequest(const v1::RegisterRequest& request) {
  constexpr char kNameFix[] =
      "use at most 253 lowercase letters, digits, '-' and '.', starting and ending with a "
      "letter or digit, e.g. node3-gpu5";
  if (request.name().empty()) {
    return Invalid("name", "''", "is empty", "give every worker a unique, stable name");
  }
  RETURN_IF_ERROR(CheckLength("name", request.name(), kMaxNameBytes, kNameFix));
  if (!IsDns1123Subdomain(request.name())) {
    return Invalid("name", Shown(request.name()), "is not a DNS-1123 name", kNameFix);
  }
  constexpr char kLabelFix[] = "use at most 253 of [A-Za-z0-9._-], or leave it empty";
  RETURN_IF_ERROR(CheckLength("node_label", request.node_label(), kMaxNameBytes, kLabelFix));
  if (!OnlyAlnumAnd(request.node_label(), "._-")) {
    return Invalid("node_label", Shown(request.node_label()),
                   "has characters other than [A-Za-z0-9._-]", kLabelFix);
  }
  constexpr char kDeviceFix[] = "use cpu or cuda:N";
  RETURN_IF_ERROR(CheckLength("device", request.device(), kMaxDeviceBytes, kDeviceFix));
  if (!OnlyAlnumAnd(request.device(), ":._-")) {
    return Invalid("device", Shown(request.device()), "has characters other than [A-Za-z0-9:._-]",
                   kDeviceFix);
  }
  constexpr char kHostFix[] =
      "the address other ranks reach this worker on: a host name or IP, e.g. its pod IP";
  if (request.host().empty()) return Invalid("host", "''", "is empty", kHostFix);
  RETURN_IF_ERROR(CheckLength("host", request.host(), kMaxNameBytes, kHostFix));
  if (!OnlyAlnumAnd(request.host(), ".:-_[]%")) {
    return Invalid("host", Shown(request.host()),
                   "has characters other than [A-Za-z0-9.:_%-] and brackets", kHostFix);
  }
  RETURN_IF_ERROR(CheckInt("capacity", request.capacity(), 0, kMaxCapacity,
                           "ranks it can run at once; 0 means 1"));
  if (!v1::Fabric_IsValid(request.fabric())) {
    return Invalid("fabric", absl::StrCat(static_cast<int>(request.fabric())),
                   "is not a known fabric",
                   "report FABRIC_SOCKETS, FABRIC_EFA, FABRIC_TCPXO or FABRIC_IB (or leave it "
                   "unset)");
  }
  constexpr char kDevicesFix[] =
      "one entry per slot: cpu, or cuda:N with each GPU once (NCCL runs one rank per GPU)";
  if (request.devices_size() > kMaxCapacity) {
    return Invalid("devices", absl::StrCat(request.devices_size(), " entries"),
                   absl::StrCat("is more than ", kMaxCapacity), kDevicesFix);
  }
  std::set<std::string> gpus;
  for (int i = 0; i < request.devices_size(); ++i) {
    const std::string field = absl::StrCat("devices[", i, "]");
    const std::string& d = request.devices(i);
    if (d.empty()) return Invalid(field, "''", "is empty", kDevicesFix);
    RETURN_IF_ERROR(CheckLength(field, d, kMaxDeviceBytes, kDevicesFix));
    if (!OnlyAlnumAnd(d, ":._-")) {
      return Invalid(field, Shown(d), "has characters other than [A-Za-z0-9:._-]", kDevicesFix);
    }
    if (d != "cpu" && !gpus.insert(d).second) {
      return Invalid(field, Shown(d), "is listed twice", kDevicesFix);
    }
  }
  if (request.devices_size() > 0 && request.capacity() != 0 &&
      request.capacity() != request.devices_size()) {
    return Invalid("capacity", absl::StrCat(request.capacity()),
                   absl::StrCat("differs from the ", request.devices_size(), " devices"),
                   "send capacity = the number of devices (one slot each), or 0");
  }
  const int slots =
      request.devices_size() > 0 ? request.devices_size() : std::max<int>(1, request.capacity());
  constexpr char kVersionFix[] = "a short one-line version string";
  RETURN_IF_ERROR(
      CheckLength("agent_version", request.agent_version(), kMaxVersionBytes, kVersionFix));
  RETURN_IF_ERROR(CheckNoControl("agent_version", request.agent_version(), kVersionFix));
  if (request.has_running()) RETURN_IF_ERROR(CheckRunningWork("running", request.running()));
  return CheckRunningRanks("running_ranks", request.running_ranks(), slots);
}

absl::Status ValidateSessionHello(const v1::SessionHello& hello) {
  constexpr char kFix[] = "send the worker_id from RegisterResponse";
  if (hello.worker_id().empty()) return Invalid("hello.worker_id", "''", "is empty", kFix);
  RETURN_IF_ERROR(CheckLength("hello.worker_id", hello.worker_id(), kMaxNameBytes + 2, kFix));
  return CheckNoControl("hello.worker_id", hello.worker_id(), kFix);
}

// ---------------------------------------------------------------------------
// Session messages

absl::Status ValidateHeartbeat(const v1::Heartbeat& heartbeat) {
  if (heartbeat.has_sent_at()) {
    RETURN_IF_ERROR(CheckTimestamp("heartbeat.sent_at", heartbeat.sent_at()));
  }
  if (heartbeat.has_running()) {
    RETURN_IF_ERROR(CheckRunningWork("heartbeat.running", heartbeat.running()));
  }
  return CheckRunningRanks("heartbeat.running_ranks", heartbeat.running_ranks(), kMaxCapacity);
}

absl::Status ValidateAttemptStarted(const v1::AttemptStarted& started,
                                    absl::Span<const StageRecord> stages) {
  RETURN_IF_ERROR(CheckWorkRef("started.ref", started.ref(), stages));
  return CheckInt("started.pid", started.pid(), 0, kNoMax, "send the child's pid");
}

namespace {

// The optional timing figures of a step (types.proto StepProgress 7..11).
absl::Status ValidateStepFigures(const v1::StepProgress& p, const StageRecord* stage) {
  struct Seconds {
    const char* field;
    bool has;
    double value;
  };
  for (const Seconds& s :
       {Seconds{"progress.progress.step_seconds", p.has_step_seconds(), p.step_seconds()},
        Seconds{"progress.progress.median_step_seconds", p.has_median_step_seconds(),
                p.median_step_seconds()},
        Seconds{"progress.progress.slowest_step_seconds", p.has_slowest_step_seconds(),
                p.slowest_step_seconds()}}) {
    if (s.has) {
      RETURN_IF_ERROR(CheckNumber(s.field, s.value, 0, kInf,
                                  "report the step's wall seconds, or leave the field unset"));
    }
  }
  if (p.has_mfu()) {
    RETURN_IF_ERROR(CheckNumber("progress.progress.mfu", p.mfu(), 0, kInf,
                                "report model FLOP/s over world x peak FLOP/s, or leave it unset "
                                "when the peak is unknown"));
  }
  if (p.has_slowest_rank() != p.has_slowest_step_seconds()) {
    return Invalid("progress.progress.slowest_rank",
                   p.has_slowest_rank() ? absl::StrCat(p.slowest_rank()) : "unset",
                   absl::StrCat("but slowest_step_seconds is ",
                                p.has_slowest_step_seconds() ? "set" : "unset"),
                   "set both, or neither");
  }
  if (p.has_slowest_rank()) {
    const int64_t max_rank = stage != nullptr ? stage->world() - 1 : kMaxRank - 1;
    RETURN_IF_ERROR(CheckInt("progress.progress.slowest_rank", p.slowest_rank(), 0, max_rank,
                             "a rank of the stage's group: 0 .. world size - 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateProgressReport(const v1::ProgressReport& report,
                                    absl::Span<const StageRecord> stages) {
  const v1::WorkRef& ref = report.ref();
  RETURN_IF_ERROR(CheckWorkRef("progress.ref", ref, stages));
  const v1::StepProgress& p = report.progress();
  const StageRecord* stage = StageOf(ref, stages);
  RETURN_IF_ERROR(CheckSameStage("progress.progress.stage", p.stage(), ref));
  // steps and seq_len may be left 0 (the coordinator fills the stage's); when given
  // they must be the stage's.
  if (stage != nullptr && p.steps() != 0 && p.steps() != stage->steps) {
    return Invalid("progress.progress.steps", absl::StrCat(p.steps()),
                   absl::StrCat("is not stage ", stage->index, "'s steps ", stage->steps),
                   "report the stage's steps, or 0");
  }
  RETURN_IF_ERROR(
      CheckInt("progress.progress.steps", p.steps(), 0, kNoMax, "report the stage's steps, or 0"));
  const int64_t steps = stage != nullptr ? stage->steps : p.steps() > 0 ? p.steps() : kNoMax;
  RETURN_IF_ERROR(CheckInt("progress.progress.step", p.step(), 1, steps,
                           "a step of the stage: 1 .. its steps"));
  RETURN_IF_ERROR(CheckNumber("progress.progress.loss", p.loss(), 0, kInf,
                              "report the step's mean token loss; a non-finite loss is never "
                              "stored"));
  RETURN_IF_ERROR(CheckNumber("progress.progress.tokens_per_s", p.tokens_per_s(), 0, kInf,
                              "report the step's global throughput"));
  if (stage != nullptr && p.seq_len() != 0 && p.seq_len() != stage->seq_len) {
    return Invalid("progress.progress.seq_len", absl::StrCat(p.seq_len()),
                   absl::StrCat("is not stage ", stage->index, "'s seq_len ", stage->seq_len),
                   "report the stage's seq_len, or 0");
  }
  RETURN_IF_ERROR(CheckInt("progress.progress.seq_len", p.seq_len(), 0, kNoMax,
                           "report the stage's seq_len, or 0"));
  return ValidateStepFigures(p, stage);
}

absl::Status ValidateLogBatch(const v1::LogBatch& batch, absl::Span<const StageRecord> stages) {
  // Agent lines outside any job carry no ref.
  if (!batch.ref().job_id().empty()) RETURN_IF_ERROR(CheckWorkRef("logs.ref", batch.ref(), stages));
  if (batch.lines_size() > kMaxLogLinesPerBatch) {
    return Invalid("logs.lines", absl::StrCat(batch.lines_size(), " lines"),
                   absl::StrCat("are more than ", kMaxLogLinesPerBatch, " in one batch"),
                   "send them in several batches");
  }
  for (int i = 0; i < batch.lines_size(); ++i) {
    const v1::LogLine& line = batch.lines(i);
    const std::string field = absl::StrCat("logs.lines[", i, "]");
    switch (line.stream()) {
      case v1::LOG_STREAM_UNSPECIFIED:
      case v1::LOG_STREAM_STDOUT:
      case v1::LOG_STREAM_STDERR:
      case v1::LOG_STREAM_AGENT:
        break;
      default:  // COORDINATOR lines are the coordinator's own; other values are unknown.
        return Invalid(field + ".stream", absl::StrCat(line.stream()),
                       "is not a worker's log stream",
                       "use LOG_STREAM_STDOUT, LOG_STREAM_STDERR or LOG_STREAM_AGENT");
    }
    if (line.has_time()) RETURN_IF_ERROR(CheckTimestamp(field + ".time", line.time()));
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpointCommitted(const v1::CheckpointCommitted& committed,
                                         absl::Span<const StageRecord> stages) {
  const v1::WorkRef& ref = committed.ref();
  RETURN_IF_ERROR(CheckWorkRef("checkpoint.ref", ref, stages));
  const v1::Checkpoint& c = committed.checkpoint();
  RETURN_IF_ERROR(CheckSameStage("checkpoint.checkpoint.stage", c.stage(), ref));
  const StageRecord* stage = StageOf(ref, stages);
  RETURN_IF_ERROR(CheckInt("checkpoint.checkpoint.step", c.step(), 0,
                           stage != nullptr ? stage->steps : kNoMax,
                           "the optimizer step the checkpoint holds: 0 .. the stage's steps"));
  constexpr char kPathFix[] = "the committed checkpoint's directory, at most 4096 bytes";
  if (c.path().empty()) return Invalid("checkpoint.checkpoint.path", "''", "is empty", kPathFix);
  RETURN_IF_ERROR(CheckLength("checkpoint.checkpoint.path", c.path(), kMaxPathBytes, kPathFix));
  RETURN_IF_ERROR(CheckNoControl("checkpoint.checkpoint.path", c.path(), kPathFix));
  RETURN_IF_ERROR(CheckInt("checkpoint.checkpoint.bytes", c.bytes(), -1, kNoMax,
                           "the size on disk, or -1 when unknown"));
  RETURN_IF_ERROR(CheckNumber("checkpoint.checkpoint.seconds", c.seconds(), 0, kInf,
                              "the save's wall time in seconds"));
  if (!c.has_blocked_seconds()) return absl::OkStatus();
  return CheckNumber("checkpoint.checkpoint.blocked_seconds", c.blocked_seconds(), 0, kInf,
                     "the seconds training waited for the save, or leave it unset");
}

absl::Status ValidateEvalReport(const v1::EvalReport& report,
                                absl::Span<const StageRecord> stages) {
  const v1::WorkRef& ref = report.ref();
  RETURN_IF_ERROR(CheckWorkRef("eval.ref", ref, stages));
  const v1::EvalResult& e = report.result();
  RETURN_IF_ERROR(CheckSameStage("eval.result.stage", e.stage(), ref));
  RETURN_IF_ERROR(
      CheckInt("eval.result.seq_len", e.seq_len(), 1, kNoMax, "the sequence length evaluated at"));
  RETURN_IF_ERROR(CheckNumber("eval.result.loss", e.loss(), 0, kInf,
                              "the mean validation token loss; a non-finite loss is never stored"));
  const int64_t max_step = ref.stage() >= 0 && ref.stage() < static_cast<int>(stages.size())
                               ? stages[ref.stage()].steps
                               : kNoMax;
  RETURN_IF_ERROR(CheckInt("eval.result.step", e.step(), 0, max_step,
                           "the steps of the stage done when the evaluation ran (0 when unknown)"));
  return CheckNumber("eval.result.accuracy", e.accuracy(), 0, 1,
                     "a fraction of correct answers, or 0 when not measured");
}

absl::Status ValidatePreemptionNotice(const v1::PreemptionNotice& notice,
                                      absl::Span<const StageRecord> stages) {
  return CheckWorkRef("preempting.ref", notice.ref(), stages);
}

absl::Status ValidateAttemptExited(const v1::AttemptExited& exited,
                                   absl::Span<const StageRecord> stages) {
  RETURN_IF_ERROR(CheckWorkRef("exited.ref", exited.ref(), stages));
  RETURN_IF_ERROR(CheckInt("exited.exit_code", exited.exit_code(), 0, kMaxExitCode,
                           "the child's exit status, or 128 + signal when it was killed"));
  return CheckInt("exited.signal", exited.signal(), 0, kMaxSignal,
                  "the signal that killed the child, or 0");
}

absl::Status ValidateWorkerMessage(const v1::WorkerMessage& m,
                                   absl::Span<const StageRecord> stages) {
  switch (m.kind_case()) {
    case v1::WorkerMessage::kHeartbeat:
      return ValidateHeartbeat(m.heartbeat());
    case v1::WorkerMessage::kStarted:
      return ValidateAttemptStarted(m.started(), stages);
    case v1::WorkerMessage::kProgress:
      return ValidateProgressReport(m.progress(), stages);
    case v1::WorkerMessage::kLogs:
      return ValidateLogBatch(m.logs(), stages);
    case v1::WorkerMessage::kCheckpoint:
      return ValidateCheckpointCommitted(m.checkpoint(), stages);
    case v1::WorkerMessage::kEval:
      return ValidateEvalReport(m.eval(), stages);
    case v1::WorkerMessage::kPreempting:
      return ValidatePreemptionNotice(m.preempting(), stages);
    case v1::WorkerMessage::kExited:
      return ValidateAttemptExited(m.exited(), stages);
    case v1::WorkerMessage::kHello:
    case v1::WorkerMessage::KIND_NOT_SET:
      break;  // Out of place on an open session: the coordinator answers that itself.
  }
  return absl::OkStatus();
}

const v1::WorkRef* WorkRefOf(const v1::WorkerMessage& m) {
  switch (m.kind_case()) {
    case v1::WorkerMessage::kStarted:
      return &m.started().ref();
    case v1::WorkerMessage::kProgress:
      return &m.progress().ref();
    case v1::WorkerMessage::kLogs:
      return &m.logs().ref();
    case v1::WorkerMessage::kCheckpoint:
      return &m.checkpoint().ref();
    case v1::WorkerMessage::kEval:
      return &m.eval().ref();
    case v1::WorkerMessage::kPreempting:
      return &m.preempting().ref();
    case v1::WorkerMessage::kExited:
      return &m.exited().ref();
    case v1::WorkerMessage::kHeartbeat:
    case v1::WorkerMessage::kHello:
    case v1::WorkerMessage::KIND_NOT_SET:
      break;
  }
  return nullptr;
}

std::string InvalidReason(const v1::WorkerMessage& m) {
  switch (m.kind_case()) {
    case v1::WorkerMessage::kHeartbeat:
      return "invalid_heartbeat";
    case v1::WorkerMessage::kStarted:
      return "invalid_started";
    case v1::WorkerMessage::kProgress:
      return "invalid_progress";
    case v1::WorkerMessage::kLogs:
      return "invalid_logs";
    case v1::WorkerMessage::kCheckpoint:
      return "invalid_checkpoint";
    case v1::WorkerMessage::kEval:
      return "invalid_eval";
    case v1::WorkerMessage::kPreempting:
      return "invalid_preempting";
    case v1::WorkerMessage::kExited:
      return "invalid_exited";
    case v1::WorkerMessage::kHello:
    case v1::WorkerMessage::KIND_NOT_SET:
      break;
  }
  return "unexpected_kind";
}

std::string TruncateText(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  // The marker is at most 40 bytes (" [truncated 18446744073709551615 bytes]").
  constexpr size_t kMarkerRoom = 40;
  size_t keep = max_bytes > kMarkerRoom ? max_bytes - kMarkerRoom : 0;
  // Never cut inside a UTF-8 sequence: back up over continuation bytes (10xxxxxx).
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(text.substr(0, keep), " [truncated ", text.size() - keep, " bytes]");
}

std::string EscapeControl(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    // C1 controls U+0080..U+009F are 0xC2 0x80..0x9F in UTF-8.
    const bool c1 = c == 0xC2 && i + 1 < text.size() &&
                    (static_cast<unsigned char>(text[i + 1]) & 0xE0) == 0x80;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if ((c < 0x20 && c != '\t') || c == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else if (c1) {
      absl::StrAppend(&out, "\\u00",
                      absl::Hex(static_cast<unsigned char>(text[++i]), absl::kZeroPad2));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace ulysses::coordinator
