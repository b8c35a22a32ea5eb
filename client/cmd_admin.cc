// ulyssesctl admin: operator verbs that need an admin token.
//   admin backup --to FILE   the coordinator's store (BackupState), written atomically
//                            (docs/OPERATIONS.md "Backup and restore").
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cmd_jobs.h"
#include "client/commands.h"
#include "common/contract/exit.h"

namespace ulysses::client {

void AddAdminCommand(CLI::App& app, CliContext& ctx) {
  CLI::App* admin = app.add_subcommand("admin", "Operator commands (admin token)");
  admin->require_subcommand(1);
  auto to = std::make_shared<std::string>();
  auto timeout_s = std::make_shared<double>(600);
  CLI::App* backup = admin->add_subcommand(
      "backup", "Write a consistent copy of the coordinator's state (SQLite) to --to");
  backup->add_option("--to", *to, "Backup file to write (replaced atomically)")->required();
  backup->add_option("--timeout-s", *timeout_s, "Give up after this long (default 600)")
      ->check(CLI::Range(1.0, 86400.0));
  backup->footer(
      "Examples:\n  ulyssesctl admin backup --to coordinator-$(date -u +%Y%m%dT%H%M%SZ).db\n"
      "Restore (coordinator stopped): ulysses-coordinator restore --from FILE --state-dir DIR");
  backup->callback([&ctx, to, timeout_s] {
    std::optional<JobClient> client = ClientFor(ctx);
    if (!client) return;
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::BackupStateChunk> done = client->Backup(*to, absl::Seconds(*timeout_s));
    if (!done.ok()) {
      *ctx.err << FormatRpcError(done.status(), client->connection()) << "\n";
      ctx.exit_code =
          absl::IsInvalidArgument(done.status()) ? contract::kExitBadInput : contract::kExitFailure;
      return;
    }
    *ctx.out << absl::StrFormat("%s: %d bytes, schema version %d, %d jobs, %.2f s\n", *to,
                                done->total_bytes(), done->schema_version(), done->jobs(),
                                absl::ToDoubleSeconds(absl::Now() - start));
    ctx.exit_code = contract::kExitOk;
  });
}

}  // namespace ulysses::client
