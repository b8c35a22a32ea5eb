// ulyssesctl logs: print the logs of a job's ranks.
// Stub until the control plane lands: declares the options and help, then
// reports "not available yet" (exit 2).
#include <memory>
#include <string>
#include <vector>

#include "client/commands.h"

namespace ulysses::client {
namespace {

struct LogsOptions {
  std::string job;
  int rank = -1;
  bool follow = false;
};

}  // namespace

void AddLogsCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<LogsOptions>();
  CLI::App* cmd = app.add_subcommand("logs", "Print the logs of a job's ranks");
  cmd->add_option("job", opts->job, "Job name or id")->required();
  cmd->add_option("--rank", opts->rank, "Only this rank (default: all ranks)");
  cmd->add_flag("-F,--follow", opts->follow, "Keep streaming new lines");
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl logs tiny-demo\n"
      "  ulyssesctl logs tiny-demo --rank 0 --follow\n"
      "Needs the coordinator (--coordinator or $ULYSSES_COORDINATOR).");
  cmd->callback([&ctx, opts] { NotAvailable(ctx, "logs"); });
}

}  // namespace ulysses::client
