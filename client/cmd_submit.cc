// ulyssesctl submit: submit a TrainJob to the coordinator.
// Stub until the control plane lands: declares the options and help, then
// reports "not available yet" (exit 2).
#include <memory>
#include <string>
#include <vector>

#include "client/commands.h"

namespace ulysses::client {
namespace {

struct SubmitOptions {
  std::string file;
  std::vector<std::string> overrides;
};

}  // namespace

void AddSubmitCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<SubmitOptions>();
  CLI::App* cmd = app.add_subcommand("submit", "Submit a TrainJob to the coordinator");
  cmd->add_option("-f,--file", opts->file, "TrainJob YAML file")->required();
  cmd->add_option("--set", opts->overrides, "Override a field: spec.path=value (repeatable)")
      ->allow_extra_args(false);
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl submit -f configs/jobs/tiny-demo.yaml\n"
      "  ulyssesctl submit -f job.yaml --set spec.stages[0].steps=5 --coordinator coord:50051\n"
      "Needs the coordinator (--coordinator or $ULYSSES_COORDINATOR).");
  cmd->callback([&ctx, opts] { NotAvailable(ctx, "submit"); });
}

}  // namespace ulysses::client
