#include "client/cmd_jobs.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/job_view.h"
#include "common/spec/job_spec_parser.h"

namespace ulysses::client {
namespace {

namespace v1 = ::ulysses::v1;

bool WantJson(const std::string& output) { return output == "json"; }

int RpcError(const absl::Status& status, const JobClient& client, std::ostream& err) {
  err << FormatRpcError(status, client.address()) << "\n";
  return 1;
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
              const std::string& output, std::ostream& out, std::ostream& err) {
  spec::ParseOptions options;
  options.overrides = sets;
  auto local = spec::LoadJobSpecFile(file, options);
  if (!local.ok()) {
    err << "error: " << file << " is not a valid TrainJob:\n" << local.status().message() << "\n";
    return 1;
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  auto response = client.Submit(text.str(), sets);
  if (!response.ok()) return RpcError(response.status(), client, err);
  if (WantJson(output)) {
    out << JobSummaryJson(response->job()).dump(2) << "\n";
  } else {
    out << response->job_id() << "\n";
  }
  return 0;
}

int CmdGetJobs(JobClient& client, const std::string& output, std::ostream& out, std::ostream& err) {
  auto jobs = client.ListJobs();
  if (!jobs.ok()) return RpcError(jobs.status(), client, err);
  if (WantJson(output)) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& job : *jobs) list.push_back(JobSummaryJson(job));
    out << list.dump(2) << "\n";
  } else if (jobs->empty()) {
    out << "No jobs.\n";
  } else {
    PrintJobsTable(*jobs, out);
  }
  return 0;
}

int CmdGetJob(JobClient& client, const std::string& id, const std::string& output,
              std::ostream& out, std::ostream& err) {
  auto job = client.GetJob(id, /*include_events=*/false, /*include_spec=*/false);
  if (!job.ok()) return RpcError(job.status(), client, err);
  if (WantJson(output)) {
    out << JobSummaryJson(*job).dump(2) << "\n";
  } else {
    PrintJobsTable({*job}, out);
  }
  return 0;
}

int CmdDescribeJob(JobClient& client, const std::string& id, const std::string& output,
                   std::ostream& out, std::ostream& err) {
  auto job = client.GetJob(id, /*include_events=*/true, /*include_spec=*/false);
  if (!job.ok()) return RpcError(job.status(), client, err);
  if (WantJson(output)) {
    out << JobDetailJson(*job).dump(2) << "\n";
  } else {
    PrintJobDescription(*job, out);
  }
  return 0;
}

int CmdGetWorkers(JobClient& client, const std::string& output, std::ostream& out,
                  std::ostream& err) {
  auto workers = client.ListWorkers();
  if (!workers.ok()) return RpcError(workers.status(), client, err);
  if (WantJson(output)) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& w : *workers) list.push_back(WorkerJson(w));
    out << list.dump(2) << "\n";
  } else if (workers->empty()) {
    out << "No workers.\n";
  } else {
    PrintWorkersTable(*workers, out);
  }
  return 0;
}

int CmdWatch(JobClient& client, const std::string& id, bool tty, absl::Duration timeout,
             absl::Duration reconnect_window, std::ostream& out, std::ostream& err) {
  WatchView view(out, tty);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Time unavailable_since = absl::InfiniteFuture();
  absl::Duration backoff = absl::Milliseconds(200);
  while (true) {
    absl::Status status = client.Watch(id, deadline - absl::Now(), [&](const v1::JobEvent& e) {
      view.OnEvent(e);
      unavailable_since = absl::InfiniteFuture();
      backoff = absl::Milliseconds(200);
      return true;
    });
    if (status.ok() && view.has_snapshot() && IsTerminal(view.state())) break;
    if (status.ok() || status.code() == absl::StatusCode::kUnavailable) {
      // The stream ended early (coordinator restart): watch again, for a while.
      const absl::Time now = absl::Now();
      if (unavailable_since == absl::InfiniteFuture()) unavailable_since = now;
      if (now - unavailable_since > reconnect_window || now >= deadline) {
        return RpcError(status.ok() ? absl::UnavailableError("watch stream ended early") : status,
                        client, err);
      }
      if (!tty) out << "(connection to the coordinator lost; retrying)\n" << std::flush;
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
      continue;
    }
    return RpcError(status, client, err);
  }
  const v1::JobState state = view.Finish();
  return state == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}

int CmdLogs(JobClient& client, const std::string& id, int tail, bool follow, std::ostream& out,
            std::ostream& err) {
  absl::Status status =
      client.Logs(id, tail, follow, follow ? absl::Hours(24 * 7) : absl::Seconds(30),
                  [&](const v1::LogLine& line) { out << LogLineText(line) << "\n"
                                                     << std::flush; });
  if (!status.ok()) return RpcError(status, client, err);
  return 0;
}

int CmdCancel(JobClient& client, const std::string& id, const std::string& reason,
              std::ostream& out, std::ostream& err) {
  auto job = client.Cancel(id, reason);
  if (!job.ok()) return RpcError(job.status(), client, err);
  out << job->id() << " " << JobStateName(job->state()) << "\n";
  return 0;
}

int CmdResume(JobClient& client, const std::string& id, std::ostream& out, std::ostream& err) {
  auto job = client.Resume(id);
  if (!job.ok()) return RpcError(job.status(), client, err);
  out << job->id() << " " << JobStateName(job->state()) << "\n";
  return 0;
}

void AddJobCommands(CLI::App& app, const std::string* coordinator, const std::string* output,
                    int* exit_code) {
  // Shared storage for the verbs' arguments; lives as long as the app.
  struct Args {
    std::string file, id, reason;
    std::vector<std::string> sets;
    bool follow = false;
    int tail = 100;
    double timeout_s = 7 * 24 * 3600;
  };
  auto args = std::make_shared<Args>();
  auto client = [coordinator] { return JobClient(ResolveCoordinator(*coordinator)); };

  CLI::App* submit = app.add_subcommand("submit", "Validate a TrainJob locally and queue it");
  submit->add_option("-f,--file", args->file, "TrainJob YAML")->required();
  submit->add_option("--set", args->sets, "Override spec.path=value (repeatable)");
  submit->callback([=] {
    JobClient c = client();
    *exit_code = CmdSubmit(c, args->file, args->sets, *output, std::cout, std::cerr);
  });

  CLI::App* get = app.add_subcommand("get", "List jobs or workers, or show one job");
  get->require_subcommand(1);
  get->add_subcommand("jobs", "List jobs")->callback([=] {
    JobClient c = client();
    *exit_code = CmdGetJobs(c, *output, std::cout, std::cerr);
  });
  CLI::App* get_job = get->add_subcommand("job", "Show one job");
  get_job->add_option("id", args->id, "Job id")->required();
  get_job->callback([=] {
    JobClient c = client();
    *exit_code = CmdGetJob(c, args->id, *output, std::cout, std::cerr);
  });
  get->add_subcommand("workers", "List workers")->callback([=] {
    JobClient c = client();
    *exit_code = CmdGetWorkers(c, *output, std::cout, std::cerr);
  });

  CLI::App* describe = app.add_subcommand("describe", "Stages, attempts, events of a job");
  describe->require_subcommand(1);
  CLI::App* describe_job = describe->add_subcommand("job", "Describe one job");
  describe_job->add_option("id", args->id, "Job id")->required();
  describe_job->callback([=] {
    JobClient c = client();
    *exit_code = CmdDescribeJob(c, args->id, *output, std::cout, std::cerr);
  });

  CLI::App* watch = app.add_subcommand("watch", "Live progress until the job ends");
  watch->add_option("id", args->id, "Job id")->required();
  watch->add_option("--timeout-s", args->timeout_s, "Give up after this long");
  watch->callback([=] {
    JobClient c = client();
    *exit_code = CmdWatch(c, args->id, isatty(STDOUT_FILENO) == 1, absl::Seconds(args->timeout_s),
                          absl::Seconds(120), std::cout, std::cerr);
  });

  CLI::App* logs = app.add_subcommand("logs", "Log lines of a job's ranks");
  logs->add_option("id", args->id, "Job id")->required();
  logs->add_flag("-f,--follow", args->follow, "Keep streaming until the job ends");
  logs->add_option("--tail", args->tail, "Lines from the end (-1 = all)");
  logs->callback([=] {
    JobClient c = client();
    *exit_code = CmdLogs(c, args->id, args->tail, args->follow, std::cout, std::cerr);
  });

  CLI::App* cancel = app.add_subcommand("cancel", "Cancel a job (resumable)");
  cancel->add_option("id", args->id, "Job id")->required();
  cancel->add_option("--reason", args->reason, "Recorded as the job's reason");
  cancel->callback([=] {
    JobClient c = client();
    *exit_code = CmdCancel(c, args->id, args->reason, std::cout, std::cerr);
  });

  CLI::App* resume = app.add_subcommand("resume", "Requeue a FAILED or CANCELLED job");
  resume->add_option("id", args->id, "Job id")->required();
  resume->callback([=] {
    JobClient c = client();
    *exit_code = CmdResume(c, args->id, std::cout, std::cerr);
  });
}

}  // namespace ulysses::client
