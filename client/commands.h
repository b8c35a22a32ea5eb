// One function per ulyssesctl verb: each adds its subcommand (options, help,
// examples footer) to the app and, when run, sets ctx.exit_code. The offline verbs
// live in client/cmd_validate.cc and client/cmd_plan.cc, `config` in client/cmd_config.cc,
// and every verb that calls the coordinator in client/cmd_jobs.cc.
#ifndef ULYSSES_CLIENT_COMMANDS_H_
#define ULYSSES_CLIENT_COMMANDS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/string_view.h"
#include "client/cli.h"
#include "client/output.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_spec_parser.h"

namespace ulysses::client {

void AddValidateCommand(CLI::App& app, CliContext& ctx);
void AddPlanCommand(CLI::App& app, CliContext& ctx);
void AddSubmitCommand(CLI::App& app, CliContext& ctx);
void AddGetCommand(CLI::App& app, CliContext& ctx);
void AddDescribeCommand(CLI::App& app, CliContext& ctx);
void AddWatchCommand(CLI::App& app, CliContext& ctx);
void AddTopCommand(CLI::App& app, CliContext& ctx);
void AddLogsCommand(CLI::App& app, CliContext& ctx);
void AddCancelCommand(CLI::App& app, CliContext& ctx);
void AddResumeCommand(CLI::App& app, CliContext& ctx);
void AddConfigCommand(CLI::App& app, CliContext& ctx);
void AddAdminCommand(CLI::App& app, CliContext& ctx);      // client/cmd_admin.cc
void AddPreflightCommand(CLI::App& app, CliContext& ctx);  // client/cmd_preflight.cc

// Prints every line of a multi-line error to ctx.err as "<prefix>: <line>"
// (no prefix when the line already starts with it).
void PrintErrorLines(CliContext& ctx, const std::string& prefix, absl::string_view message);

// The shared front of the offline verbs: parses -o (default `fallback`) and loads + validates
// the spec file. On error prints it (file-prefixed lines), sets contract::kExitBadInput and
// returns false.
bool LoadSpecForVerb(CliContext& ctx, const std::string& file,
                     const spec::ParseOptions& parse_options, OutputFormat fallback,
                     OutputFormat* format, spec::JobSpec* job);

// --device-type and --gpu-memory (plan, validate, submit; client/cmd_plan.cc).
void AddDeviceFlags(CLI::App* cmd, std::string* device_type, std::string* gpu_memory);

// The memory check of validate and submit: with neither flag given nothing is checked;
// --gpu-memory alone checks against a GPU of that size (h100's reserve). A stage that does
// not fit (client/plan.h CheckFits) is refused with its bytes and fix unless `force`
// (then it is a warning). On refusal prints the lines, sets contract::kExitBadInput and
// returns false.
bool CheckDeviceFit(CliContext& ctx, const std::string& file, const spec::JobSpec& job,
                    const std::string& device_type, const std::string& gpu_memory, bool force);

// plan and the memory check plan the model the engine will load: with spec.model.init_from,
// the shape read from its config.json by the engine's reader (spec::ResolveInitFrom). An
// unreadable or disagreeing config.json is an error: prints it, sets contract::kExitBadInput
// and returns false. `job` is unchanged without init_from.
bool ResolveInitFromForVerb(CliContext& ctx, const std::string& file, spec::JobSpec* job);

}  // namespace ulysses::client

#endif  // ULYSSES_CLIENT_COMMANDS_H_
