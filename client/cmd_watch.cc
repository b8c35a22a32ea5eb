// ulyssesctl watch: stream a job's progress (steps, loss, checkpoints) until it ends.
// Stub until the control plane lands: declares the options and help, then
// reports "not available yet" (exit 2).
#include <memory>
#include <string>
#include <vector>

#include "client/commands.h"

namespace ulysses::client {
namespace {

struct WatchOptions {
  std::string job;
};

}  // namespace

void AddWatchCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<WatchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "watch", "Stream a job's progress (steps, loss, checkpoints) until it ends");
  cmd->add_option("job", opts->job, "Job name or id")->required();
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl watch tiny-demo\n"
      "  ulyssesctl watch tiny-demo -o json   # one JSON event per line\n"
      "Needs the coordinator (--coordinator or $ULYSSES_COORDINATOR).");
  cmd->callback([&ctx, opts] { NotAvailable(ctx, "watch"); });
}

}  // namespace ulysses::client
