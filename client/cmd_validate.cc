// ulyssesctl validate -f FILE [--set spec.path=value ...] [--check-files]
// Prints the defaulted spec (yaml by default, json, or a per-stage table), or
// every error as "FILE: <path>: <value> <problem> (<fix>)" on stderr (exit 2); with
// --device-type/--gpu-memory also refuses a stage that does not fit (unless --force).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/output.h"
#include "common/spec/job_spec_parser.h"

namespace ulysses::client {
namespace {

struct ValidateOptions {
  std::string file;
  std::vector<std::string> overrides;
  bool check_files = false;
  std::string device_type, gpu_memory;
  bool force = false;
};

void PrintSummary(const spec::JobSpec& s, std::ostream& out) {
  const spec::ModelSpec& m = s.model;
  out << "job " << s.metadata.name << ": model "
      << (m.preset.empty() ? (m.init_from.empty() ? "custom" : m.init_from) : m.preset)
      << " (hidden " << m.hidden_size << ", " << m.num_hidden_layers << " layers, "
      << m.num_attention_heads << "q/" << m.num_key_value_heads << "kv heads, " << m.dtype
      << "), data "
      << (s.data.synthetic ? "synthetic " + s.data.synthetic->generator : s.data.train)
      << ", spec hash " << spec::SpecHash(s) << "\n";
  Table table({"stage", "seq_len", "steps", "sp", "dp", "world", "lr", "warmup"});
  for (size_t i = 0; i < s.stages.size(); ++i) {
    table.AddRow({absl::StrCat(i + 1), absl::StrCat(s.stages[i].seq_len),
                  absl::StrCat(s.stages[i].steps), absl::StrCat(s.StageSp(i)),
                  absl::StrCat(s.StageDp(i)), absl::StrCat(s.StageWorld(i)),
                  FormatNumber(s.StageLr(i)), absl::StrCat(s.StageWarmup(i))});
  }
  table.Print(out);
}

void RunValidate(CliContext& ctx, const ValidateOptions& opts) {
  spec::ParseOptions parse_options;
  parse_options.overrides = opts.overrides;
  parse_options.check_files = opts.check_files;
  OutputFormat format;
  spec::JobSpec job;
  if (!LoadSpecForVerb(ctx, opts.file, parse_options, OutputFormat::kYaml, &format, &job)) return;
  if (!CheckDeviceFit(ctx, opts.file, job, opts.device_type, opts.gpu_memory, opts.force)) return;
  switch (format) {
    case OutputFormat::kYaml:
      *ctx.out << spec::ToYaml(job);
      break;
    case OutputFormat::kJson:
      *ctx.out << JobSpecToJson(job).dump(2) << "\n";
      break;
    case OutputFormat::kTable:
      PrintSummary(job, *ctx.out);
      break;
  }
  ctx.exit_code = contract::kExitOk;
}

}  // namespace

void AddValidateCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<ValidateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "validate", "Check a TrainJob spec and print it with every default filled in");
  cmd->add_option("-f,--file", opts->file, "TrainJob YAML file")->required();
  cmd->add_option("--set", opts->overrides,
                  "Override a field before validation: spec.path=value (repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--check-files", opts->check_files,
                "Also check that the data files exist and hold one first-stage sequence");
  AddDeviceFlags(cmd, &opts->device_type, &opts->gpu_memory);
  cmd->add_flag("--force", opts->force,
                "Accept a stage that does not fit the device memory (a warning instead)");
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl validate -f configs/jobs/tiny-demo.yaml\n"
      "  ulyssesctl validate -f job.yaml --set spec.stages[1].steps=5 -o json\n"
      "  ulyssesctl validate -f job.yaml --check-files -o table\n"
      "  ulyssesctl validate -f job.yaml --device-type h100   # also check every stage fits\n"
      "Prints the defaulted spec and exits 0, or prints each error as\n"
      "  FILE: <field path>: <value> <problem> (<fix>)\n"
      "on stderr and exits 2. With --device-type or --gpu-memory, a stage whose planned\n"
      "memory per rank (ulyssesctl plan) exceeds the device is an error naming the stage,\n"
      "the bytes and the cheapest fix, unless --force.");
  cmd->callback([&ctx, opts] { RunValidate(ctx, *opts); });
}

}  // namespace ulysses::client
