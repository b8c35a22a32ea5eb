// `ulyssesctl preflight storage`: does the shared volume keep up with the job's checkpoints?
// client/storage_preflight.h measures; this prints each stage's save time against the grace.
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "client/commands.h"
#include "client/plan.h"
#include "client/storage_preflight.h"
#include "common/contract/exit.h"
#include "nlohmann/json.hpp"

namespace ulysses::client {
namespace {

struct PreflightOptions {
  std::string file;
  std::string dir;
  std::string bandwidth;   // Stated instead of measured ("176MiB/s").
  std::string limit_rate;  // Pace the probe ("50MiB/s").
  std::string bytes = "1GiB";
  int writers = 8;
  double grace_s = 900;
  std::string device_type = "h100";
  double mfu = 0.4;
};

// "176MiB/s", "1.5GB/s", "200MiB": a byte size per second.
absl::StatusOr<double> ParseRate(const std::string& text, const std::string& field) {
  absl::string_view t = text;
  absl::ConsumeSuffix(&t, "/s");
  absl::StatusOr<double> v = ParseByteSize(std::string(t), field);
  if (v.ok() && !(*v > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", text, " is not > 0"));
  }
  return v;
}

std::string Seconds(double s) { return absl::StrFormat("%.0f s", s); }

void RunPreflight(CliContext& ctx, const PreflightOptions& o) {
  OutputFormat format;
  spec::JobSpec job;
  if (!LoadSpecForVerb(ctx, o.file, {}, OutputFormat::kTable, &format, &job)) return;
  auto bad = [&](const absl::Status& s) {
    PrintErrorLines(ctx, "preflight storage", s.message());
    ctx.exit_code = contract::kExitBadInput;
  };
  if (!(o.grace_s > 0) || !std::isfinite(o.grace_s)) {
    return bad(absl::InvalidArgumentError(absl::StrCat(
        "--grace-s: ", o.grace_s, " is not > 0 (the workers' --grace-period-s, e.g. 900)")));
  }
  if (o.dir.empty() == o.bandwidth.empty()) {
    return bad(absl::InvalidArgumentError(
        "give --dir DIR (measure the volume there) or --bandwidth RATE (state it), one of them"));
  }
  absl::StatusOr<DeviceSpec> device = ResolveDevice(o.device_type, "");
  if (!device.ok()) return bad(device.status());
  device->mfu = o.mfu;
  StorageProbeResult probe;
  std::string source;
  if (!o.dir.empty()) {
    StorageProbeOptions po;
    po.dir = o.dir;
    po.writers = o.writers;
    absl::StatusOr<double> bytes = ParseByteSize(o.bytes, "--bytes");
    if (!bytes.ok()) return bad(bytes.status());
    po.bytes = *bytes;
    if (!o.limit_rate.empty()) {
      absl::StatusOr<double> limit = ParseRate(o.limit_rate, "--limit-rate");
      if (!limit.ok()) return bad(limit.status());
      po.limit_bytes_per_s = *limit;
    }
    absl::StatusOr<StorageProbeResult> r = ProbeStorage(po);
    if (!r.ok()) {
      PrintErrorLines(ctx, "preflight storage", r.status().message());
      ctx.exit_code =
          absl::IsInvalidArgument(r.status()) ? contract::kExitBadInput : contract::kExitFailure;
      return;
    }
    probe = *r;
    source = absl::StrCat("measured in ", o.dir, ": ", FormatBytes(probe.bytes), " in ",
                          probe.writers, " files", probe.direct ? " (O_DIRECT)" : "", ", ",
                          absl::StrFormat("%.2f", probe.seconds), " s",
                          o.limit_rate.empty() ? "" : absl::StrCat(", paced to ", o.limit_rate));
  } else {
    absl::StatusOr<double> rate = ParseRate(o.bandwidth, "--bandwidth");
    if (!rate.ok()) return bad(rate.status());
    probe.bytes_per_s = *rate;
    source = "stated (--bandwidth)";
  }
  const std::vector<StagePlan> plans = PlanJob(job, &*device);
  const std::vector<StageSave> saves = SaveEstimates(plans, probe.bytes_per_s, o.grace_s);
  bool all_fit = true;
  double need_rate = 0;  // The bandwidth the slowest stage needs to fit.
  for (size_t i = 0; i < saves.size(); ++i) {
    all_fit = all_fit && saves[i].fits;
    const double room = o.grace_s - saves[i].step_seconds;
    need_rate = std::max(need_rate, room > 0 ? saves[i].checkpoint_bytes / room : INFINITY);
  }
  if (format == OutputFormat::kTable) {
    std::ostream& out = *ctx.out;
    out << "bandwidth: " << FormatBytes(probe.bytes_per_s) << "/s (" << source << ")\n"
        << "grace: " << Seconds(o.grace_s) << " (--grace-s: the workers' --grace-period-s)\n";
    Table t({"STAGE", "SEQ_LEN", "WORLD", "CHECKPOINT", "SAVE", "STEP", "STEP+SAVE", "VERDICT"});
    for (size_t i = 0; i < saves.size(); ++i) {
      const StageSave& s = saves[i];
      t.AddRow({absl::StrCat(i + 1), absl::StrCat(plans[i].seq_len), absl::StrCat(plans[i].world),
                FormatBytes(s.checkpoint_bytes), Seconds(s.save_seconds), Seconds(s.step_seconds),
                Seconds(s.step_seconds + s.save_seconds), s.fits ? "FITS" : "DOES NOT FIT"});
    }
    t.Print(out);
    if (all_fit) {
      out << "verdict: FITS (every stage's step + checkpoint save ends inside the grace)\n";
    } else {
      out << "verdict: DOES NOT FIT: a preemption checkpoint would be cut off; use a volume of at "
             "least "
          << (std::isfinite(need_rate) ? FormatBytes(need_rate) + "/s"
                                       : "(no rate: the step alone exceeds the grace)")
          << " (docs/DEPLOY.md \"Storage that keeps up\") or raise --grace-period-s and "
             "terminationGracePeriodSeconds\n";
    }
  } else {
    nlohmann::ordered_json j;
    j["bandwidth_bytes_per_s"] = probe.bytes_per_s;
    j["source"] = source;
    if (!o.dir.empty()) {
      j["probe"] = {{"bytes", probe.bytes},
                    {"seconds", probe.seconds},
                    {"writers", probe.writers},
                    {"direct", probe.direct}};
    }
    j["grace_seconds"] = o.grace_s;
    j["stages"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < saves.size(); ++i) {
      j["stages"].push_back({{"stage", i + 1},
                             {"checkpoint_bytes", saves[i].checkpoint_bytes},
                             {"save_seconds", saves[i].save_seconds},
                             {"step_seconds", saves[i].step_seconds},
                             {"fits", saves[i].fits}});
    }
    j["fits"] = all_fit;
    if (std::isfinite(need_rate)) j["needed_bytes_per_s"] = need_rate;
    *ctx.out << (format == OutputFormat::kJson ? j.dump(2) + "\n" : JsonToYaml(j));
  }
  ctx.exit_code = all_fit ? contract::kExitOk : contract::kExitFailure;
}

}  // namespace

void AddPreflightCommand(CLI::App& app, CliContext& ctx) {
  CLI::App* preflight =
      app.add_subcommand("preflight", "Checks of the cluster a job will run on (offline)");
  preflight->require_subcommand(1);
  auto o = std::make_shared<PreflightOptions>();
  CLI::App* cmd = preflight->add_subcommand(
      "storage",
      "Measure the shared volume's write bandwidth with the checkpoint's pattern and say whether "
      "each stage's save fits the grace");
  cmd->add_option("-f,--file", o->file, "TrainJob YAML file")->required();
  cmd->add_option("--dir", o->dir, "Directory on the shared volume to measure (files removed)");
  cmd->add_option("--bandwidth", o->bandwidth, "State the bandwidth instead, e.g. 176MiB/s");
  cmd->add_option("--bytes", o->bytes, "Bytes the probe writes in all")->capture_default_str();
  cmd->add_option("--writers", o->writers, "Files written at once (the ranks of one node)")
      ->capture_default_str();
  cmd->add_option("--limit-rate", o->limit_rate,
                  "Pace the probe to this rate, e.g. 50MiB/s (a rate-limited writer)");
  cmd->add_option("--grace-s", o->grace_s, "The workers' --grace-period-s")->capture_default_str();
  cmd->add_option("--device-type", o->device_type, "GPU for the step time (as `plan`)")
      ->capture_default_str();
  cmd->add_option("--mfu", o->mfu, "Assumed MFU for the step time")->capture_default_str();
  cmd->footer(
      "Examples (in a worker pod, or any pod mounting the shared claim):\n"
      "  ulyssesctl preflight storage -f configs/jobs/llama3-8b-1m.yaml --dir /shared/checkpoints\n"
      "  ulyssesctl preflight storage -f job.yaml --bandwidth 176MiB/s --grace-s 900\n"
      "Exit 0: every stage fits; 1: one does not (or the probe failed); 2: bad input.");
  cmd->callback([&ctx, o] { RunPreflight(ctx, *o); });
}

}  // namespace ulysses::client
