// ulyssesctl resume: resume a cancelled or failed job from its latest committed checkpoint.
// Stub until the control plane lands: declares the options and help, then
// reports "not available yet" (exit 2).
#include <memory>
#include <string>
#include <vector>

#include "client/commands.h"

namespace ulysses::client {
namespace {

struct ResumeOptions {
  std::string job;
};

}  // namespace

void AddResumeCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<ResumeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "resume", "Resume a cancelled or failed job from its latest committed checkpoint");
  cmd->add_option("job", opts->job, "Job name or id")->required();
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl resume tiny-demo\n"
      "Needs the coordinator (--coordinator or $ULYSSES_COORDINATOR).");
  cmd->callback([&ctx, opts] { NotAvailable(ctx, "resume"); });
}

}  // namespace ulysses::client
