// ulyssesctl describe: show a job in detail: spec, stages, attempts, checkpoints, events.
// Stub until the control plane lands: declares the options and help, then
// reports "not available yet" (exit 2).
#include <memory>
#include <string>
#include <vector>

#include "client/commands.h"

namespace ulysses::client {
namespace {

struct DescribeOptions {
  std::string job;
};

}  // namespace

void AddDescribeCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<DescribeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "describe", "Show a job in detail: spec, stages, attempts, checkpoints, events");
  cmd->add_option("job", opts->job, "Job name or id")->required();
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl describe tiny-demo\n"
      "  ulyssesctl describe tiny-demo -o yaml\n"
      "Needs the coordinator (--coordinator or $ULYSSES_COORDINATOR).");
  cmd->callback([&ctx, opts] { NotAvailable(ctx, "describe"); });
}

}  // namespace ulysses::client
