#include "client/cli.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "common/contract/cli11.h"

namespace ulysses::client {

bool LoadSpecForVerb(CliContext& ctx, const std::string& file,
                     const spec::ParseOptions& parse_options, OutputFormat fallback,
                     OutputFormat* format, spec::JobSpec* job) {
  absl::StatusOr<OutputFormat> parsed_format = ParseOutputFormat(ctx.output, fallback);
  if (!parsed_format.ok()) {
    PrintErrorLines(ctx, "", parsed_format.status().message());
    ctx.exit_code = contract::kExitBadInput;
    return false;
  }
  absl::StatusOr<spec::JobSpec> loaded = spec::LoadJobSpecFile(file, parse_options);
  if (!loaded.ok()) {
    PrintErrorLines(ctx, file, loaded.status().message());
    ctx.exit_code = contract::kExitBadInput;
    return false;
  }
  *format = *parsed_format;
  *job = *std::move(loaded);
  return true;
}

void PrintErrorLines(CliContext& ctx, const std::string& prefix, absl::string_view message) {
  for (absl::string_view line : absl::StrSplit(message, '\n')) {
    if (line.empty()) {
      continue;
    }
    const std::string head = prefix + ": ";
    if (prefix.empty() || line.substr(0, head.size()) == head) {
      *ctx.err << line << "\n";
    } else {
      *ctx.err << head << line << "\n";
    }
  }
}

int RunCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CliContext ctx;
  ctx.out = &out;
  ctx.err = &err;

  CLI::App app{"ulyssesctl: validate, plan and run long-context training jobs on Ulysses"};
  app.name("ulyssesctl");
  app.require_subcommand(1);
  app.fallthrough();  // Global options may follow the verb.
  app.add_option("--coordinator", ctx.coordinator,
                 "Coordinator address host:port (default: $ULYSSES_COORDINATOR, else the "
                 "context's server, else 127.0.0.1:50051)");
  app.add_option("--config", ctx.config,
                 "Client config file (default: $ULYSSES_CONFIG, else "
                 "~/.config/ulysses/config.yaml)");
  app.add_option("--context", ctx.context,
                 "Config context to use (default: the config's current-context)");
  app.add_option("-o,--output", ctx.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  app.footer(
      "Examples:\n"
      "  ulyssesctl validate -f configs/jobs/tiny-demo.yaml\n"
      "  ulyssesctl plan -f configs/jobs/llama3-8b-1m.yaml\n"
      "  ulyssesctl submit -f job.yaml --coordinator coord:50051\n"
      "  ulyssesctl get -o json\n"
      "  ulyssesctl config set-context prod --server coord:50051 --ca ca.pem --token-file tok\n"
      "Credentials: the context's token (or $ULYSSES_TOKEN) is sent on every call; with a\n"
      "context `ca` the connection is TLS (see `ulyssesctl config --help`).\n"
      "Exit codes: 0 ok; 2 bad input (usage, spec, or a request the coordinator refused as\n"
      "invalid); 1 an unreachable coordinator, a server error, or a watched job that ended\n"
      "FAILED or CANCELLED.");

  AddValidateCommand(app, ctx);
  AddPlanCommand(app, ctx);
  AddSubmitCommand(app, ctx);
  AddGetCommand(app, ctx);
  AddDescribeCommand(app, ctx);
  AddWatchCommand(app, ctx);
  AddTopCommand(app, ctx);
  AddLogsCommand(app, ctx);
  AddCancelCommand(app, ctx);
  AddResumeCommand(app, ctx);
  AddConfigCommand(app, ctx);
  AddAdminCommand(app, ctx);
  AddPreflightCommand(app, ctx);

  // Name an unknown verb instead of CLI11's "A subcommand is required".
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--coordinator" || arg == "-o" || arg == "--output" || arg == "--config" ||
        arg == "--context") {
      ++i;  // skip the option's value
      continue;
    }
    if (arg.empty() || arg[0] == '-') {
      continue;
    }
    const CLI::App& const_app = app;
    const auto named = [&arg](const CLI::App* sub) { return sub->check_name(arg); };
    if (const_app.get_subcommands(named).empty()) {
      std::string verbs;
      for (const CLI::App* sub : const_app.get_subcommands([](const CLI::App*) { return true; })) {
        verbs += (verbs.empty() ? "" : ", ") + sub->get_name();
      }
      err << "ulyssesctl: unknown verb '" << arg << "' (use one of: " << verbs << ")\n";
      return contract::kExitBadInput;
    }
    break;
  }

  try {
    // CLI11 takes a mutable argv; copy so callers may pass string literals.
    std::vector<std::string> args(argv + 1, argv + argc);
    std::reverse(args.begin(), args.end());
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return contract::ExitCodeForParseError(app, e, out, err);
  } catch (const std::exception& e) {
    err << "ulyssesctl: " << e.what() << "\n";
    return contract::kExitFailure;
  }
  return ctx.exit_code;
}

}  // namespace ulysses::client
