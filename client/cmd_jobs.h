// ulyssesctl verbs that talk to the coordinator: submit, get jobs|job|workers,
// describe job, watch, top, logs, cancel, resume.
//
// Each Cmd* function returns the process exit code and writes results to `out`,
// errors to `err` as one line ("error: CODE: message"; an unreachable coordinator is
// named by address). Exit codes: 0 ok; 1 server/connection error, rejected spec, or
// (watch) the job ended FAILED or CANCELLED.
#ifndef ULYSSES_CLIENT_CMD_JOBS_H_
#define ULYSSES_CLIENT_CMD_JOBS_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cli.h"
#include "client/grpc_client.h"

namespace ulysses::client {

// Output formats of get/describe: "table" (default), "json", "yaml".
int CmdSubmit(JobClient& client, const std::string& file, const std::vector<std::string>& sets,
              const std::string& output, std::ostream& out, std::ostream& err,
              bool allow_duplicate_name = false);
// `filter`: ListJobsRequest's states, name, labels and tenant (`get jobs --state ...`).
int CmdGetJobs(JobClient& client, const std::string& output, std::ostream& out, std::ostream& err,
               const ulysses::v1::ListJobsRequest& filter = {});
int CmdGetJob(JobClient& client, const std::string& id, const std::string& output,
              std::ostream& out, std::ostream& err);
int CmdDescribeJob(JobClient& client, const std::string& id, const std::string& output,
                   std::ostream& out, std::ostream& err);
int CmdGetWorkers(JobClient& client, const std::string& output, std::ostream& out,
                  std::ostream& err);
// Follows the job until it ends; survives a coordinator restart (retries UNAVAILABLE
// for up to `reconnect_window`). `tty` selects the redrawn view.
// `json`: one JSON event object per line instead of the view.
int CmdWatch(JobClient& client, const std::string& id, bool tty, bool json, absl::Duration timeout,
             absl::Duration reconnect_window, std::ostream& out, std::ostream& err);
// `top`: the jobs not yet ended (`all`: every job) with their live figures (job_view.h
// TopTable). `tty`: clear the screen and redraw every `interval` until interrupted; otherwise
// (or `once`) print once. `output` json or yaml: one TopJson array, once.
int CmdTop(JobClient& client, absl::Duration interval, bool once, bool all, bool tty,
           const std::string& output, std::ostream& out, std::ostream& err);
int CmdLogs(JobClient& client, const std::string& id, int tail, bool follow, std::ostream& out,
            std::ostream& err);
int CmdCancel(JobClient& client, const std::string& id, const std::string& reason,
              std::ostream& out, std::ostream& err);
int CmdResume(JobClient& client, const std::string& id, std::ostream& out, std::ostream& err);

// The client of the coordinator the flags, environment and config name; on a bad
// config or credentials prints why, sets exit 2 and returns nullopt.
std::optional<JobClient> ClientFor(CliContext& ctx);

// The subcommand registrations (AddSubmitCommand, AddGetCommand, ...) are declared
// in client/commands.h and defined in cmd_jobs.cc on top of the functions above.

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_CMD_JOBS_H_
