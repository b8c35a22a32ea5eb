#include "client/cmd_jobs.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/job_view.h"
#include "client/output.h"
#include "common/contract/exit.h"
#include "common/spec/job_spec_parser.h"

namespace ulysses::client {
namespace {

namespace v1 = ::ulysses::v1;

bool WantJson(const std::string& output) { return output == "json" || output == "yaml"; }

// Prints a JSON value as JSON or (for -o yaml) YAML.
void PrintStructured(const nlohmann::json& value, const std::string& output, std::ostream& out) {
  if (output == "yaml") {
    out << JsonToYaml(nlohmann::ordered_json::parse(value.dump()));
  } else {
    out << value.dump(2) << "\n";
  }
}

// Prints the error; the exit code says whether the request was refused as bad input (2)
// or failed otherwise (1: unreachable coordinator, server error).
int RpcError(const absl::Status& status, const JobClient& client, std::ostream& err) {
  err << FormatRpcError(status, client.connection()) << "\n";
  return contract::ExitCodeFor(status);
}

std::string LogLineText(const v1::LogLine& line) {
  const char* stream = "agent";
  switch (line.stream()) {
    case v1::LOG_STREAM_STDOUT:
      stream = "stdout";
      break;
    case v1::LOG_STREAM_STDERR:
      stream = "stderr";
      break;
    case v1::LOG_STREAM_COORDINATOR:
      stream = "coordinator";
      break;
    default:
      break;
  }
  std::string who = line.worker_id().empty() ? std::string(stream)
                                             : absl::StrCat(line.worker_id(), " r", line.rank(),
                                                            " g", line.generation(), " ", stream);
  return absl::StrCat("[", who, "] ", line.text());
}

}  // namespace

int CmdSubmit(JobClient& client, const std::string& file, const std::vector<std::string>& sets,
              const std::string& output, std::ostream& out, std::ostream& err,
              bool allow_duplicate_name) {
  spec::ParseOptions options;
  options.overrides = sets;
  auto local = spec::LoadJobSpecFile(file, options);
  if (!local.ok()) {
    err << "error: " << file << " is not a valid TrainJob:\n" << local.status().message() << "\n";
    return contract::kExitBadInput;
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  auto response = client.Submit(text.str(), sets, "", allow_duplicate_name);
  if (!response.ok()) return RpcError(response.status(), client, err);
  // Accepted, but a stage can never be placed on the cluster as registered: say so now.
  for (const v1::JobCondition& c : response->job().conditions()) {
    if (c.status()) {
      err << "warning: " << response->job_id() << " is " << c.type() << ": " << c.message() << "\n";
    }
  }
  if (WantJson(output)) {
    PrintStructured(JobSummaryJson(response->job()), output, out);
  } else {
    out << response->job_id() << "\n";
  }
  return contract::kExitOk;
}

int CmdGetJobs(JobClient& client, const std::string& output, std::ostream& out, std::ostream& err,
               const v1::ListJobsRequest& filter) {
  auto jobs = client.ListJobs(filter);
  if (!jobs.ok()) return RpcError(jobs.status(), client, err);
  if (WantJson(output)) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& job : *jobs) list.push_back(JobSummaryJson(job));
    PrintStructured(list, output, out);
  } else if (jobs->empty()) {
    out << "No jobs.\n";
  } else {
    PrintJobsTable(*jobs, out);
  }
  return contract::kExitOk;
}

int CmdGetJob(JobClient& client, const std::string& id, const std::string& output,
              std::ostream& out, std::ostream& err) {
  auto job = client.GetJob(id, /*include_events=*/false, /*include_spec=*/false);
  if (!job.ok()) return RpcError(job.status(), client, err);
  if (WantJson(output)) {
    PrintStructured(JobSummaryJson(*job), output, out);
  } else {
    PrintJobsTable({*job}, out);
  }
  return contract::kExitOk;
}

int CmdDescribeJob(JobClient& client, const std::string& id, const std::string& output,
                   std::ostream& out, std::ostream& err) {
  auto job = client.GetJob(id, /*include_events=*/true, /*include_spec=*/true);
  if (!job.ok()) return RpcError(job.status(), client, err);
  if (WantJson(output)) {
    PrintStructured(JobDetailJson(*job), output, out);
  } else {
    PrintJobDescription(*job, out);
  }
  return contract::kExitOk;
}

int CmdGetWorkers(JobClient& client, const std::string& output, std::ostream& out,
                  std::ostream& err) {
  auto workers = client.ListWorkers();
  if (!workers.ok()) return RpcError(workers.status(), client, err);
  if (WantJson(output)) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& w : *workers) list.push_back(WorkerJson(w));
    PrintStructured(list, output, out);
  } else if (workers->empty()) {
    out << "No workers.\n";
  } else {
    PrintWorkersTable(*workers, out);
  }
  return contract::kExitOk;
}

int CmdWatch(JobClient& client, const std::string& id, bool tty, bool json, absl::Duration timeout,
             absl::Duration reconnect_window, std::ostream& out, std::ostream& err) {
  std::ostringstream discard;
  WatchView view(json ? discard : out, tty && !json);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Time unavailable_since = absl::InfiniteFuture();
  absl::Duration backoff = absl::Milliseconds(200);
  while (true) {
    absl::Status status = client.Watch(id, deadline - absl::Now(), [&](const v1::JobEvent& e) {
      view.OnEvent(e);
      if (json) out << JobEventJson(e).dump() << "\n" << std::flush;
      unavailable_since = absl::InfiniteFuture();
      backoff = absl::Milliseconds(200);
      return true;
    });
    if (status.ok() && view.has_snapshot() && IsTerminal(view.state())) break;
    if (view.has_snapshot() && (status.ok() || status.code() == absl::StatusCode::kUnavailable)) {
      // The stream ended early (coordinator restart): watch again, for a while.
      const absl::Time now = absl::Now();
      if (unavailable_since == absl::InfiniteFuture()) unavailable_since = now;
      if (now - unavailable_since > reconnect_window || now >= deadline) {
        return RpcError(status.ok() ? absl::UnavailableError("watch stream ended early") : status,
                        client, err);
      }
      if (!tty && !json) out << "(connection to the coordinator lost; retrying)\n" << std::flush;
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
      continue;
    }
    return RpcError(status, client, err);
  }
  const v1::JobState state = json ? view.state() : view.Finish();
  return state == v1::JOB_STATE_SUCCEEDED ? contract::kExitOk : contract::kExitFailure;
}

int CmdTop(JobClient& client, absl::Duration interval, bool once, bool all, bool tty,
           const std::string& output, std::ostream& out, std::ostream& err) {
  while (true) {
    auto jobs = client.ListJobs();
    if (!jobs.ok()) return RpcError(jobs.status(), client, err);
    const absl::Time now = absl::Now();
    if (WantJson(output)) {
      PrintStructured(TopJson(*jobs, absl::ToUnixMillis(now), all), output, out);
      out << std::flush;
      return contract::kExitOk;
    }
    std::ostringstream frame;  // One write per frame, so a redraw does not flicker.
    if (tty) {
      frame << "\033[H\033[2J"  // Cursor home, clear the screen.
            << "ulyssesctl top  " << absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone())
            << "  every " << absl::FormatDuration(interval) << " (Ctrl-C quits)\n\n";
    }
    const std::vector<std::vector<std::string>> rows =
        TopTable(*jobs, absl::ToUnixMillis(now), all);
    if (rows.size() <= 1) {
      frame << (all ? "No jobs.\n" : "No running or queued jobs.\n");
    } else {
      PrintTable(rows, frame);
    }
    out << frame.str() << std::flush;
    if (!tty || once) return contract::kExitOk;
    absl::SleepFor(interval);
  }
}

int CmdLogs(JobClient& client, const std::string& id, int tail, bool follow, std::ostream& out,
            std::ostream& err) {
  absl::Status status =
      client.Logs(id, tail, follow, follow ? absl::Hours(24 * 7) : absl::Seconds(30),
                  [&](const v1::LogLine& line) { out << LogLineText(line) << "\n"
                                                     << std::flush; });
  if (!status.ok()) return RpcError(status, client, err);
  return contract::kExitOk;
}

int CmdCancel(JobClient& client, const std::string& id, const std::string& reason,
              std::ostream& out, std::ostream& err) {
  auto job = client.Cancel(id, reason);
  if (!job.ok()) return RpcError(job.status(), client, err);
  out << job->id() << " " << JobStateName(job->state()) << "\n";
  return contract::kExitOk;
}

int CmdResume(JobClient& client, const std::string& id, std::ostream& out, std::ostream& err) {
  auto job = client.Resume(id);
  if (!job.ok()) return RpcError(job.status(), client, err);
  out << job->id() << " " << JobStateName(job->state()) << "\n";
  return contract::kExitOk;
}

std::optional<JobClient> ClientFor(CliContext& ctx) {
  ConnectionFlags flags;
  flags.config = ctx.config;
  flags.context = ctx.context;
  flags.coordinator = ctx.coordinator;
  absl::StatusOr<Connection> connection = ResolveConnection(flags);
  absl::StatusOr<JobClient> client =
      connection.ok() ? JobClient::Create(*std::move(connection)) : connection.status();
  if (!client.ok()) {
    PrintErrorLines(ctx, "error", client.status().message());
    ctx.exit_code = contract::kExitBadInput;
    return std::nullopt;
  }
  return *std::move(client);
}

namespace {

constexpr char kNeedsCoordinator[] =
    "Needs the coordinator: the current context of the config (ulyssesctl config --help),\n"
    "--context, --coordinator or $ULYSSES_COORDINATOR; token from $ULYSSES_TOKEN or the context.";

struct JobArgs {
  std::string file, reason;
  std::vector<std::string> sets;
  std::vector<std::string> words;  // Positionals: [jobs|workers|job ID|ID].
  bool follow = false;
  int tail = 100;
  double timeout_s = 7 * 24 * 3600;
  std::string device_type, gpu_memory;  // submit: memory check (CheckDeviceFit)
  bool force = false;
  bool allow_duplicate = false;             // submit
  std::vector<std::string> states, labels;  // get jobs filters
  std::string name, tenant;
};

// "job X" or "X" -> X; "" when missing.
std::string JobRefFrom(const std::vector<std::string>& words) {
  if (words.size() == 2 && words[0] == "job") return words[1];
  if (words.size() == 1 && words[0] != "job") return words[0];
  return "";
}

// The job id `words` name (an id, or a job's metadata.name: JobClient::ResolveJob); ""
// after printing why (exit code set) when there is none.
std::string JobIdFrom(JobClient& client, CliContext& ctx, const std::vector<std::string>& words,
                      const char* verb) {
  const std::string ref = JobRefFrom(words);
  if (ref.empty()) {
    *ctx.err << "error: " << verb << ": expected a job id or name\n";
    ctx.exit_code = contract::kExitBadInput;
    return "";
  }
  absl::StatusOr<std::string> id = client.ResolveJob(ref);
  if (!id.ok()) {
    ctx.exit_code = RpcError(id.status(), client, *ctx.err);
    return "";
  }
  return *id;
}

// "running" / "RUNNING" / "JOB_STATE_RUNNING" -> the state; false when it is none.
bool ParseJobState(std::string text, v1::JobState* state) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (text.rfind("JOB_STATE_", 0) != 0) text = "JOB_STATE_" + text;
  return v1::JobState_Parse(text, state) && *state != v1::JOB_STATE_UNSPECIFIED;
}

}  // namespace

void AddSubmitCommand(CLI::App& app, CliContext& ctx) {
  auto args = std::make_shared<JobArgs>();
  CLI::App* cmd = app.add_subcommand("submit", "Validate a TrainJob locally, then queue it");
  cmd->add_option("-f,--file", args->file, "TrainJob YAML file")->required();
  cmd->add_option("--set", args->sets, "Override a field: spec.path=value (repeatable)")
      ->allow_extra_args(false);
  AddDeviceFlags(cmd, &args->device_type, &args->gpu_memory);
  cmd->add_flag("--force", args->force,
                "Submit even when a stage does not fit the device memory (a warning instead)");
  cmd->add_flag("--allow-duplicate", args->allow_duplicate,
                "Queue it even when a job of the same metadata.name has not ended");
  cmd->footer(absl::StrCat(
      "Prints the job id.\nExamples:\n"
      "  ulyssesctl submit -f configs/jobs/tiny-demo.yaml\n"
      "  ulyssesctl submit -f job.yaml --set spec.stages[0].steps=5 --coordinator coord:50051\n"
      "  ulyssesctl submit -f job.yaml --device-type h100   # refuse stages that do not fit\n",
      kNeedsCoordinator));
  cmd->callback([&ctx, args] {
    if (!args->device_type.empty() || !args->gpu_memory.empty()) {
      // The memory check runs before any coordinator call (ulyssesctl plan shows the numbers).
      spec::ParseOptions options;
      options.overrides = args->sets;
      absl::StatusOr<spec::JobSpec> job = spec::LoadJobSpecFile(args->file, options);
      if (job.ok() && !CheckDeviceFit(ctx, args->file, *job, args->device_type, args->gpu_memory,
                                      args->force)) {
        return;
      }
    }
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    ctx.exit_code = CmdSubmit(*client, args->file, args->sets, ctx.output, *ctx.out, *ctx.err,
                              args->allow_duplicate);
  });
}

void AddGetCommand(CLI::App& app, CliContext& ctx) {
  auto args = std::make_shared<JobArgs>();
  CLI::App* cmd = app.add_subcommand("get", "List jobs or workers, or show one job");
  cmd->add_option("what", args->words, "jobs (default) | job ID|NAME | workers");
  cmd->add_option("--state", args->states, "get jobs: only these states (repeatable: running)");
  cmd->add_option("--name", args->name, "get jobs: only jobs of this metadata.name");
  cmd->add_option("--label", args->labels, "get jobs: only jobs with this label (key=value)");
  cmd->add_option("--tenant", args->tenant, "get jobs: only this tenant's (admins)");
  cmd->footer(
      absl::StrCat("Examples:\n"
                   "  ulyssesctl get jobs\n"
                   "  ulyssesctl get jobs --state running --label team=research\n"
                   "  ulyssesctl get job job-000001 -o json\n"
                   "  ulyssesctl get job tiny-demo      # by name\n"
                   "  ulyssesctl get workers\n",
                   kNeedsCoordinator));
  cmd->callback([&ctx, args] {
    const auto& w = args->words;
    v1::ListJobsRequest filter;
    for (const std::string& text : args->states) {
      v1::JobState state;
      if (!ParseJobState(text, &state)) {
        *ctx.err << "error: --state: \"" << text
                 << "\" is not a job state (use pending, queued, scheduling, running, "
                    "checkpointing, recovering, backoff, preempted, succeeded, failed or "
                    "cancelled)\n";
        ctx.exit_code = contract::kExitBadInput;
        return;
      }
      filter.add_states(state);
    }
    filter.set_name(args->name);
    for (const std::string& l : args->labels) filter.add_labels(l);
    filter.set_tenant(args->tenant);
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    if (w.empty() || (w.size() == 1 && w[0] == "jobs")) {
      ctx.exit_code = CmdGetJobs(*client, ctx.output, *ctx.out, *ctx.err, filter);
    } else if (w.size() == 1 && w[0] == "workers") {
      ctx.exit_code = CmdGetWorkers(*client, ctx.output, *ctx.out, *ctx.err);
    } else if (const std::string id = JobIdFrom(*client, ctx, w, "get"); !id.empty()) {
      ctx.exit_code = CmdGetJob(*client, id, ctx.output, *ctx.out, *ctx.err);
    }
  });
}

void AddDescribeCommand(CLI::App& app, CliContext& ctx) {
  auto args = std::make_shared<JobArgs>();
  CLI::App* cmd =
      app.add_subcommand("describe", "Show a job in detail: stages, attempts, checkpoints, events");
  cmd->add_option("what", args->words, "job ID|NAME")->required();
  cmd->footer(
      absl::StrCat("Examples:\n"
                   "  ulyssesctl describe job job-000001\n"
                   "  ulyssesctl describe job job-000001 -o json\n",
                   kNeedsCoordinator));
  cmd->callback([&ctx, args] {
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    const std::string id = JobIdFrom(*client, ctx, args->words, "describe");
    if (id.empty()) return;
    ctx.exit_code = CmdDescribeJob(*client, id, ctx.output, *ctx.out, *ctx.err);
  });
}

void AddWatchCommand(CLI::App& app, CliContext& ctx) {
  auto args = std::make_shared<JobArgs>();
  CLI::App* cmd = app.add_subcommand(
      "watch", "Live progress per stage (step, loss, tokens/s, ETA) until the job ends");
  cmd->add_option("what", args->words, "Job id or name")->required();
  cmd->add_option("--timeout-s", args->timeout_s, "Give up after this many seconds");
  cmd->footer(absl::StrCat(
      "Exits 0 when the job SUCCEEDED, 1 when it FAILED or was CANCELLED (or on errors).\n"
      "Plain lines when stdout is not a terminal.\nExamples:\n"
      "  ulyssesctl watch job-000001\n"
      "  ulyssesctl watch job-000001 -o json   # one JSON event per line\n",
      kNeedsCoordinator));
  cmd->callback([&ctx, args] {
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    const std::string id = JobIdFrom(*client, ctx, args->words, "watch");
    if (id.empty()) return;
    ctx.exit_code =
        CmdWatch(*client, id, isatty(STDOUT_FILENO) == 1, ctx.output == "json",
                 absl::Seconds(args->timeout_s), absl::Seconds(120), *ctx.out, *ctx.err);
  });
}

void AddTopCommand(CLI::App& app, CliContext& ctx) {
  auto interval_s = std::make_shared<double>(2.0);
  auto once = std::make_shared<bool>(false);
  auto all = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "top",
      "Live view of the jobs not yet ended: stage, step, loss, tokens/s, MFU, slowest "
      "rank, checkpoint age");
  cmd->add_option("--interval", *interval_s, "Seconds between refreshes on a terminal (0.5..3600)")
      ->check(CLI::Range(0.5, 3600.0));
  cmd->add_flag("--once", *once, "Print once and exit (also when stdout is not a terminal)");
  cmd->add_flag("-a,--all", *all, "Also the jobs that ended (with their last figures)");
  cmd->footer(absl::StrCat(
      "On a terminal the view is redrawn in place until Ctrl-C; otherwise it is printed once.\n"
      "MFU needs the workers' --peak-flops; SLOWEST is the rank with the longest step and its\n"
      "step seconds; CKPT_AGE is the time since the last committed checkpoint (the work a\n"
      "preemption would lose).\nExamples:\n"
      "  ulyssesctl top\n"
      "  ulyssesctl top --interval 5\n"
      "  ulyssesctl top -a --once   # also ended jobs, printed once\n"
      "  ulyssesctl top -o json   # one JSON array (-o yaml: YAML), once\n",
      kNeedsCoordinator));
  cmd->callback([&ctx, interval_s, once, all] {
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    ctx.exit_code = CmdTop(*client, absl::Seconds(*interval_s), *once, *all,
                           isatty(STDOUT_FILENO) == 1, ctx.output, *ctx.out, *ctx.err);
  });
}

void AddLogsCommand(CLI::App& app, CliContext& ctx) {
  auto args = std::make_shared<JobArgs>();
  CLI::App* cmd = app.add_subcommand("logs", "Log lines of a job's ranks");
  cmd->add_option("what", args->words, "Job id or name")->required();
  cmd->add_flag("-f,--follow", args->follow, "Keep streaming until the job ends");
  cmd->add_option("--tail", args->tail, "Lines from the end (-1 = all)");
  cmd->footer(absl::StrCat("Examples:\n  ulyssesctl logs job-000001 -f\n", kNeedsCoordinator));
  cmd->callback([&ctx, args] {
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    const std::string id = JobIdFrom(*client, ctx, args->words, "logs");
    if (id.empty()) return;
    ctx.exit_code = CmdLogs(*client, id, args->tail, args->follow, *ctx.out, *ctx.err);
  });
}

void AddCancelCommand(CLI::App& app, CliContext& ctx) {
  auto args = std::make_shared<JobArgs>();
  CLI::App* cmd = app.add_subcommand("cancel", "Cancel a job (it can be resumed)");
  cmd->add_option("what", args->words, "Job id or name")->required();
  cmd->add_option("--reason", args->reason, "Recorded as the job's reason");
  cmd->footer(absl::StrCat("Examples:\n  ulyssesctl cancel job-000001\n", kNeedsCoordinator));
  cmd->callback([&ctx, args] {
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    const std::string id = JobIdFrom(*client, ctx, args->words, "cancel");
    if (id.empty()) return;
    ctx.exit_code = CmdCancel(*client, id, args->reason, *ctx.out, *ctx.err);
  });
}

void AddResumeCommand(CLI::App& app, CliContext& ctx) {
  auto args = std::make_shared<JobArgs>();
  CLI::App* cmd = app.add_subcommand(
      "resume", "Requeue a FAILED or CANCELLED job from its last committed checkpoint");
  cmd->add_option("what", args->words, "Job id or name")->required();
  cmd->footer(absl::StrCat("Examples:\n  ulyssesctl resume job-000001\n", kNeedsCoordinator));
  cmd->callback([&ctx, args] {
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    const std::string id = JobIdFrom(*client, ctx, args->words, "resume");
    if (id.empty()) return;
    ctx.exit_code = CmdResume(*client, id, *ctx.out, *ctx.err);
  });
}

}  // namespace ulysses::client
