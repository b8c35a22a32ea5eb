// ulyssesctl get: list jobs, or show one job's status.
// Stub until the control plane lands: declares the options and help, then
// reports "not available yet" (exit 2).
#include <memory>
#include <string>
#include <vector>

#include "client/commands.h"

namespace ulysses::client {
namespace {

struct GetOptions {
  std::string job;
};

}  // namespace

void AddGetCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<GetOptions>();
  CLI::App* cmd = app.add_subcommand("get", "List jobs, or show one job's status");
  cmd->add_option("job", opts->job, "Job name or id (all jobs when omitted)");
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl get\n"
      "  ulyssesctl get tiny-demo -o json\n"
      "Needs the coordinator (--coordinator or $ULYSSES_COORDINATOR).");
  cmd->callback([&ctx, opts] { NotAvailable(ctx, "get"); });
}

}  // namespace ulysses::client
