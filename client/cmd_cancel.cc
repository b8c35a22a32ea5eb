// ulyssesctl cancel: cancel a job (ranks stop after committing a checkpoint).
// Stub until the control plane lands: declares the options and help, then
// reports "not available yet" (exit 2).
#include <memory>
#include <string>
#include <vector>

#include "client/commands.h"

namespace ulysses::client {
namespace {

struct CancelOptions {
  std::string job;
};

}  // namespace

void AddCancelCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<CancelOptions>();
  CLI::App* cmd =
      app.add_subcommand("cancel", "Cancel a job (ranks stop after committing a checkpoint)");
  cmd->add_option("job", opts->job, "Job name or id")->required();
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl cancel tiny-demo\n"
      "Needs the coordinator (--coordinator or $ULYSSES_COORDINATOR).");
  cmd->callback([&ctx, opts] { NotAvailable(ctx, "cancel"); });
}

}  // namespace ulysses::client
