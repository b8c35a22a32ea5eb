// ulyssesctl plan -f FILE [--set ...] [--device-type T] [--gpu-memory SIZE] [--mfu F]:
// the offline per-stage plan (client/plan.h) with a fit verdict per stage.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/output.h"
#include "client/plan.h"
#include "common/spec/init_from.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/memory_model.h"
#include "common/spec/spec_util.h"

namespace ulysses::client {
namespace {

struct PlanOptions {
  std::string file;
  std::vector<std::string> overrides;
  std::string device_type = "h100";
  std::string gpu_memory;
  std::string host_memory;
  double mfu = 0.4;
  int64_t max_seq_gpus = 0;  // --max-seq N: the longest sequence on N devices instead of the plan
};

std::string Bytes(double v) { return v > 0 ? FormatBytes(v) : std::string("0"); }

std::string Seconds(double s) {
  if (s <= 0) return "?";
  return s < 1 ? absl::StrFormat("%.0f ms", s * 1e3) : absl::StrFormat("%.1f s", s);
}

// "45 s", "12 min", "3.2 h", "2.1 days".
std::string Duration(double s) {
  if (s <= 0) return "?";
  if (s < 120) return absl::StrFormat("%.0f s", s);
  if (s < 7200) return absl::StrFormat("%.0f min", s / 60);
  if (s < 3 * 86400) return absl::StrFormat("%.1f h", s / 3600);
  return absl::StrFormat("%.1f days", s / 86400);
}

std::string GpuHours(double h) {
  if (h <= 0) return "?";
  return h < 10 ? absl::StrFormat("%.2f", h) : absl::StrFormat("%.0f", h);
}

Table LayoutTable(const std::vector<StagePlan>& plans) {
  Table table({"stage", "seq_len", "steps", "sp", "dp", "world", "tokens/rank", "kv_heads",
               "a2a/layer", "a2a_bytes", "compute/step", "a2a/step", "step_time"});
  for (size_t i = 0; i < plans.size(); ++i) {
    const StagePlan& p = plans[i];
    table.AddRow({absl::StrCat(i + 1), absl::StrCat(p.seq_len), absl::StrCat(p.steps),
                  absl::StrCat(p.sp), absl::StrCat(p.dp), absl::StrCat(p.world),
                  absl::StrCat(p.tokens_per_rank), absl::StrCat(p.kv_heads_exchanged),
                  p.sp == 1 ? "0" : (p.a2a_elements > 0 ? FormatCount(p.a2a_elements) : "?"),
                  p.sp == 1 ? "0" : Bytes(p.a2a_bytes), Seconds(p.compute_seconds),
                  p.sp == 1 ? "0" : Seconds(p.a2a_seconds), Seconds(p.step_seconds())});
  }
  return table;
}

// Each stage's RoPE (spec.model's, with stages[i].rope from that stage on).
Table RopeTable(const spec::JobSpec& job) {
  Table table({"stage", "rope_theta", "rope_scaling"});
  for (size_t i = 0; i < job.stages.size(); ++i) {
    spec::ModelShape shape = job.model;
    job.ApplyStageRope(i, &shape);
    const spec::RopeScaling& r = shape.rope_scaling;
    std::string scaling = r.rope_type;
    if (r.rope_type != spec::kRopeNone) absl::StrAppend(&scaling, " x", r.factor);
    if (r.rope_type == spec::kRopeLlama3) {
      absl::StrAppend(&scaling, " from ", r.original_max_position_embeddings);
    }
    const bool own = job.stages[i].rope.has_value();
    table.AddRow(
        {absl::StrCat(i + 1),
         absl::StrCat(spec::internal::FormatDouble(shape.rope_theta), own ? " (stage)" : ""),
         scaling});
  }
  return table;
}

void AddMemoryRow(Table& table, const std::string& name, const StagePlan& p) {
  table.AddRow({name, Bytes(p.parameter_bytes), Bytes(p.gradient_bytes), Bytes(p.optimizer_bytes),
                Bytes(p.gathered_bytes), Bytes(p.saved_activation_bytes), Bytes(p.working_bytes),
                Bytes(p.runtime_bytes), Bytes(p.total_bytes()), Bytes(p.device_bytes),
                Bytes(p.host_bytes), p.fits ? "FITS" : "DOES NOT FIT"});
}

Table MemoryHeader() {
  return Table({"stage", "params", "grads", "optimizer", "gathered", "act_saved", "act_peak",
                "runtime", "steady", "device", "host", "verdict"});
}

// Per stage: the start-up peaks next to the steady state, on the device and in host memory, the
// largest of them (what FITS is decided on) and the nodes the stage's world takes.
Table PeaksTable(const std::vector<StagePlan>& plans) {
  Table table({"stage", "init", "resume", "steady", "peak", "device", "host_init", "host_resume",
               "host_steady", "host_peak", "host_limit", "nodes", "verdict"});
  for (size_t i = 0; i < plans.size(); ++i) {
    const StagePlan& p = plans[i];
    const std::string init =
        i == 0 ? absl::StrCat(Bytes(p.init_bytes), p.init_is_import ? " (import)" : "") : "-";
    table.AddRow({absl::StrCat(i + 1), init, Bytes(p.resume_bytes), Bytes(p.total_bytes()),
                  absl::StrCat(Bytes(p.peak_bytes()), " (", p.peak_phase(), ")"),
                  Bytes(p.device_bytes), i == 0 ? Bytes(p.init_host_bytes) : "-",
                  Bytes(p.resume_host_bytes), Bytes(p.steady_host_bytes),
                  absl::StrCat(Bytes(p.host_peak_bytes()), " (", p.host_peak_phase(), ")"),
                  p.host_limit_bytes > 0 ? Bytes(p.host_limit_bytes) : "-", absl::StrCat(p.nodes),
                  p.fits ? "FITS" : "DOES NOT FIT"});
  }
  return table;
}

nlohmann::ordered_json StageJson(size_t i, const StagePlan& p) {
  return {{"stage", i + 1},
          {"seq_len", p.seq_len},
          {"steps", p.steps},
          {"sp_degree", p.sp},
          {"dp_degree", p.dp},
          {"world_size", p.world},
          {"tokens_per_rank", p.tokens_per_rank},
          {"kv_heads_exchanged", p.kv_heads_exchanged},
          {"a2a_elements_per_layer_per_rank", static_cast<int64_t>(p.a2a_elements)},
          {"a2a_bytes_per_layer_per_rank", static_cast<int64_t>(p.a2a_bytes)},
          {"parameter_bytes_per_rank", static_cast<int64_t>(p.parameter_bytes)},
          {"gradient_bytes_per_rank", static_cast<int64_t>(p.gradient_bytes)},
          {"optimizer_bytes_per_rank", static_cast<int64_t>(p.optimizer_bytes)},
          {"gathered_bytes_per_rank", static_cast<int64_t>(p.gathered_bytes)},
          {"model_state_bytes_per_rank", static_cast<int64_t>(p.model_state_bytes())},
          {"saved_activation_bytes_per_rank", static_cast<int64_t>(p.saved_activation_bytes)},
          {"working_activation_bytes_per_rank", static_cast<int64_t>(p.working_bytes)},
          {"activation_bytes_per_rank", static_cast<int64_t>(p.activation_bytes())},
          {"runtime_bytes_per_rank", static_cast<int64_t>(p.runtime_bytes)},
          {"total_bytes_per_rank", static_cast<int64_t>(p.total_bytes())},
          {"device_bytes_per_rank", static_cast<int64_t>(p.device_bytes)},
          {"host_bytes_per_rank", static_cast<int64_t>(p.host_bytes)},
          {"snapshot_host_bytes_per_rank", static_cast<int64_t>(p.snapshot_host_bytes)},
          {"checkpoint_async", p.checkpoint_async},
          {"checkpoint_mode_reason", p.checkpoint_reason},
          {"init_bytes_per_rank", static_cast<int64_t>(p.init_bytes)},
          {"init_is_import", p.init_is_import},
          {"resume_bytes_per_rank", static_cast<int64_t>(p.resume_bytes)},
          {"peak_bytes_per_rank", static_cast<int64_t>(p.peak_bytes())},
          {"peak_phase", p.peak_phase()},
          {"init_host_bytes_per_rank", static_cast<int64_t>(p.init_host_bytes)},
          {"resume_host_bytes_per_rank", static_cast<int64_t>(p.resume_host_bytes)},
          {"steady_host_bytes_per_rank", static_cast<int64_t>(p.steady_host_bytes)},
          {"host_peak_bytes_per_rank", static_cast<int64_t>(p.host_peak_bytes())},
          {"host_peak_phase", p.host_peak_phase()},
          {"host_limit_bytes_per_rank", static_cast<int64_t>(p.host_limit_bytes)},
          {"export_bytes", static_cast<int64_t>(p.export_bytes)},
          {"nodes", p.nodes},
          {"fits", p.fits},
          {"flops_per_rank_per_step", p.flops_per_rank},
          {"compute_seconds_per_step", p.compute_seconds},
          {"a2a_seconds_per_step", p.a2a_seconds},
          {"step_seconds", p.step_seconds()}};
}

// Valid fixes printed per stage that does not fit, cheapest by GPU-hours first.
constexpr size_t kFixesShown = 3;

// Rows with the verdict and, for a stage that does not fit, the fix and its re-plan.
nlohmann::ordered_json PlanJson(const spec::JobSpec& job, const std::vector<StagePlan>& plans,
                                const DeviceSpec& device) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < plans.size(); ++i) {
    nlohmann::ordered_json row = StageJson(i, plans[i]);
    row["device_type"] = device.type;
    row["mfu_assumed"] = device.mfu;
    if (plans[i].nodes > 1) row["nodes_reason"] = ExplainNodes(job, i, device).text;
    row["stage_gpu_hours"] = StageGpuHours(plans[i]);
    if (!plans[i].fits) {
      const std::vector<FitFix> fixes = FindFixes(job, i, device, kFixesShown);
      row["fix"] =
          fixes.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(fixes[0].changes);
      if (!fixes.empty()) row["fixed"] = StageJson(i, fixes[0].plan);
      nlohmann::ordered_json all = nlohmann::ordered_json::array();
      for (const FitFix& f : fixes) {
        all.push_back({{"changes", f.changes},
                       {"world_size", f.plan.world},
                       {"step_seconds", f.plan.step_seconds()},
                       {"gpu_hours", f.gpu_hours}});
      }
      row["fixes"] = std::move(all);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// Bytes one rank moves between device and host per optimizer step for its offloads, and the
// PCIe/host bandwidth that takes to hide under the step: activations out in forward and back in
// backward (2x the offloaded checkpoints), the optimizer's fp32 gradient chunk out and the
// updated chunk back.
// (memory_model.h's per-element bytes: b parameter, g = 4 for 16-bit parameters else b, o = 2g
// plus a 4-byte master for 16-bit ones; host_bytes = the offloaded optimizer P*(o+b)/W plus the
// offloaded activations.)
double OffloadBytesPerStep(const spec::JobSpec& job, const StagePlan& p) {
  if (p.host_bytes <= 0) return 0;
  const double b = static_cast<double>(spec::DtypeBytes(job.model.dtype));
  const double g = b == 2 ? 4 : b;
  const double o = 2 * g + (b == 2 ? 4 : 0);
  const double chunk =
      ParameterCount(job.model) / static_cast<double>(std::max<int64_t>(1, p.world));
  double bytes = 0, optimizer_host = 0;
  if (job.parallelism.offload_optimizer && job.parallelism.zero_stage >= 1) {
    optimizer_host = chunk * (o + b);
    bytes += chunk * (g + b);  // gradient chunk out, updated parameter chunk back
  }
  if (job.parallelism.offload_activations)
    bytes += 2 * std::max(0.0, p.host_bytes - optimizer_host);
  return bytes;
}

// The job's model and options, and the device it is planned on.
void PrintJobAndDevice(const spec::JobSpec& job, const DeviceSpec& device, std::ostream& out) {
  const spec::ModelSpec& m = job.model;
  out << "job " << job.metadata.name << ": " << FormatCount(ParameterCount(m)) << " parameters, "
      << m.num_hidden_layers << " layers, " << m.num_attention_heads << "q/"
      << m.num_key_value_heads << "kv heads of dim " << m.HeadDim() << ", " << m.dtype
      << "; zero_stage " << job.parallelism.zero_stage
      << (job.parallelism.offload_optimizer ? ", offload_optimizer" : "")
      << (job.parallelism.offload_activations ? ", offload_activations" : "")
      << (job.memory.activation_checkpointing ? ", activation_checkpointing" : "")
      << (job.memory.keep_attention_outputs ? ", keep_attention_outputs" : "")
      << (job.memory.tiled_mlp ? ", tiled_mlp" : "")
      << (job.memory.tiled_loss
              ? absl::StrCat(", tiled_loss (", job.memory.loss_tile_tokens, "-token tiles)")
              : "")
      << "\n";
  out << "device " << device.type << ": "
      << (device.memory_is_host_total ? absl::StrCat(FormatBytes(device.memory_bytes),
                                                     " of host memory shared by a stage's ranks")
                                      : absl::StrCat(FormatBytes(device.memory_bytes), " per rank"))
      << ", runtime reserve " << FormatBytes(device.reserve_bytes) << ", assumed MFU " << device.mfu
      << " of " << FormatCount(device.peak_flops_bf16) << "FLOP/s (bf16), "
      << "all-to-all " << FormatBytes(device.a2a_bytes_per_s) << "/s"
      << (device.host_is_device ? " (offload options are no-ops: the host is the device)" : "")
      << "\n";
}

// What offload puts in (pinned) host memory and the bandwidth it needs, when it is on.
void PrintOffload(const spec::JobSpec& job, const std::vector<StagePlan>& plans,
                  const DeviceSpec& device, std::ostream& out) {
  if (!device.host_is_device &&
      (job.parallelism.offload_optimizer || job.parallelism.offload_activations)) {
    // What offload puts in (pinned) host memory and the device<->host bandwidth it needs to
    // stay hidden under the planned step.
    out << "\noffload per rank (pinned host memory; device<->host traffic per step):\n";
    Table offload({"stage", "offload_optimizer", "offload_activations", "pinned_host", "moved/step",
                   "bandwidth", "host_limit"});
    for (size_t i = 0; i < plans.size(); ++i) {
      const StagePlan& p = plans[i];
      const double moved = OffloadBytesPerStep(job, p);
      const double step = p.step_seconds();
      offload.AddRow({absl::StrCat(i + 1), job.parallelism.offload_optimizer ? "yes" : "no",
                      job.parallelism.offload_activations ? "yes" : "no", Bytes(p.host_bytes),
                      Bytes(moved), step > 0 ? absl::StrCat(Bytes(moved / step), "/s") : "?",
                      p.host_limit_bytes > 0 ? Bytes(p.host_limit_bytes) : "-"});
    }
    offload.Print(out);
  }
}

// The nodes each multi-node stage takes and why; the job takes the most of them.
void PrintNodes(const spec::JobSpec& job, const std::vector<StagePlan>& plans,
                const DeviceSpec& device, std::ostream& out) {
  // The job takes the most nodes any stage takes; the stage that cannot do with fewer says why.
  int64_t most = 0;
  std::string why;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].nodes <= 1) continue;
    const NodeReason reason = ExplainNodes(job, i, device);
    out << "stage " << i + 1 << " needs " << reason.text << "\n";
    if (plans[i].nodes > most || (plans[i].nodes == most && why.empty() && !reason.fewer_fits)) {
      most = plans[i].nodes;
      why = reason.fewer_fits ? "" : absl::StrCat("stage ", i + 1, " does not fit on fewer");
    }
  }
  if (most > 1) {
    out << "job: " << most << " nodes of " << device.devices_per_node << " " << device.type
        << (why.empty() ? " (as the layout asks; every stage would fit on fewer)"
                        : absl::StrCat(" (", why, ")"))
        << "\n";
  }
}

// For each stage that does not fit: the cheapest changes that do (validated), or why none.
void PrintFixes(const spec::JobSpec& job, const std::vector<StagePlan>& plans,
                const DeviceSpec& device, std::ostream& out) {
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].fits) continue;
    const std::vector<FitFix> fixes = FindFixes(job, i, device, kFixesShown);
    if (fixes.empty()) {
      out << "stage " << i + 1 << " of " << plans.size() << " DOES NOT FIT in "
          << FormatBytes(plans[i].device_bytes)
          << " and no valid change of memory options, zero_stage or sp_degree makes it fit: "
             "use a device with more memory\n";
      continue;
    }
    out << "stage " << i + 1 << " of " << plans.size()
        << " DOES NOT FIT: changes that fit and pass validation, cheapest by GPU-hours first:\n";
    for (size_t k = 0; k < fixes.size(); ++k) {
      const FitFix& f = fixes[k];
      out << "  " << k + 1 << ". --set " << absl::StrJoin(f.changes, " --set ") << "   (world "
          << f.plan.world << ", step " << Seconds(f.plan.step_seconds()) << ", "
          << GpuHours(f.gpu_hours) << " GPU-h for the stage)\n";
    }
    Table fixed = MemoryHeader();
    AddMemoryRow(fixed, absl::StrCat(i + 1, " fixed (1.)"), fixes[0].plan);
    fixed.Print(out);
  }
}

// The job's bottom line: stages, time, GPU-hours, nodes, host memory, checkpoint disk; the
// verdict.
void PrintTotals(const spec::JobSpec& job, const std::vector<StagePlan>& plans,
                 const DeviceSpec& device, std::ostream& out) {
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].checkpoint_reason.empty()) continue;
    out << "stage " << i + 1
        << " checkpoints: " << (plans[i].checkpoint_async ? "asynchronous" : "synchronous") << " ("
        << plans[i].checkpoint_reason << ")\n";
  }
  const JobTotals t = TotalsOf(job, plans, device);
  out << "\njob " << job.metadata.name << ": " << t.stages << (t.stages == 1 ? " stage" : " stages")
      << ", " << Duration(t.seconds) << " of training, " << GpuHours(t.gpu_hours) << " "
      << device.type << (device.host_is_device ? "-hours" : " GPU-hours") << ", "
      << (device.host_is_device ? std::string("1 host")
                                : absl::StrCat(t.nodes, t.nodes == 1 ? " node" : " nodes", " (",
                                               t.max_world, " GPUs at most)"))
      << ", peak host memory per node " << Bytes(t.host_peak_per_node_bytes) << ", checkpoint disk "
      << Bytes(t.checkpoint_disk_bytes) << " (" << Bytes(t.checkpoint_bytes)
      << " per checkpoint x (keep_last " << t.keep_last << " + 1 being written))\n";
  if (t.not_fitting.empty()) {
    out << "verdict: every stage FITS\n";
  } else {
    out << "verdict: DOES NOT FIT (stage" << (t.not_fitting.size() == 1 ? " " : "s ")
        << absl::StrJoin(t.not_fitting, ", ",
                         [](std::string* o, size_t i) { absl::StrAppend(o, i + 1); })
        << "; exit " << kExitPlanDoesNotFit << ")\n";
  }
}

void PrintTable(const spec::JobSpec& job, const std::vector<StagePlan>& plans,
                const DeviceSpec& device, std::ostream& out) {
  PrintJobAndDevice(job, device, out);
  LayoutTable(plans).Print(out);
  if (job.HasStageRope()) {
    out << "\nRoPE per stage (stages[i].rope applies from its stage on):\n";
    RopeTable(job).Print(out);
  }
  out << "\nmemory per rank:\n";
  Table memory = MemoryHeader();
  for (size_t i = 0; i < plans.size(); ++i) AddMemoryRow(memory, absl::StrCat(i + 1), plans[i]);
  memory.Print(out);
  PrintOffload(job, plans, device, out);
  out << "\npeaks per rank (init/import: stage 1 from nothing; resume: from a checkpoint):\n";
  PeaksTable(plans).Print(out);
  PrintNodes(job, plans, device, out);
  PrintFixes(job, plans, device, out);
  PrintTotals(job, plans, device, out);
  out << "\ntokens/rank = N/P; kv_heads = kv heads after replication for the exchange (Hkv');\n"
         "a2a/layer = forward all-to-all elements per layer per rank, (2*Hq + 2*Hkv')*D*N/P;\n"
         "step_time = model FLOPs (6*params*tokens + attention, recompute included) / (peak * "
         "MFU) + all-to-all bytes / bandwidth;\n"
         "act_saved = held from forward to backward, act_peak = one layer's backward or the "
         "loss; host = offloaded; formulas in docs/JOBSPEC.md, Plan;\n"
         "init/resume = a rank's peak while it makes, imports or loads its state (before the "
         "first step); peak = the largest of init, resume and steady, the one checked;\n"
         "host_* = host memory per rank (steady: offloaded state + a checkpoint save's "
         "snapshot or copies); host_limit = a node's host memory per GPU\n";
}

void RunMaxSeq(CliContext& ctx, const spec::JobSpec& job, const DeviceSpec& device, int64_t gpus,
               OutputFormat format) {
  absl::StatusOr<MaxSeqResult> r = MaxSequence(job, device, gpus);
  if (!r.ok()) {
    PrintErrorLines(ctx, "", r.status().message());
    ctx.exit_code = contract::kExitBadInput;
    return;
  }
  const double moved = OffloadBytesPerStep(job, r->at_max);
  const double step = r->at_max.step_seconds();
  const double bandwidth = step > 0 ? moved / step : 0;
  if (format == OutputFormat::kTable) {
    std::ostream& out = *ctx.out;
    out << "longest sequence on " << gpus << " " << device.type << " (sp " << gpus
        << ", dp 1; zero_stage " << job.parallelism.zero_stage
        << (job.parallelism.offload_optimizer ? ", offload_optimizer" : "")
        << (job.parallelism.offload_activations ? ", offload_activations" : "")
        << (job.memory.activation_checkpointing ? ", activation_checkpointing" : "")
        << (job.memory.tiled_mlp ? ", tiled_mlp" : "")
        << (job.memory.tiled_loss ? ", tiled_loss" : "") << "): " << r->max_seq_len << " tokens\n";
    out << "limit: " << r->limit << "\n";
    Table memory = MemoryHeader();
    if (r->max_seq_len > 0) AddMemoryRow(memory, absl::StrCat(r->max_seq_len), r->at_max);
    if (r->over.seq_len > 0) AddMemoryRow(memory, absl::StrCat(r->over.seq_len), r->over);
    memory.Print(out);
    if (r->max_seq_len > 0) {
      out << "host per rank at " << r->max_seq_len << ": " << Bytes(r->at_max.host_peak_bytes())
          << " (pinned offload " << Bytes(r->at_max.host_bytes) << "); device<->host "
          << Bytes(moved) << " per step = " << Bytes(bandwidth) << "/s over a " << Seconds(step)
          << " step\n";
    }
  } else {
    nlohmann::ordered_json j;
    j["gpus"] = gpus;
    j["device_type"] = device.type;
    j["max_seq_len"] = r->max_seq_len;
    j["limit"] = r->limit;
    if (r->max_seq_len > 0) j["at_max"] = StageJson(0, r->at_max);
    if (r->over.seq_len > 0) j["over"] = StageJson(0, r->over);
    j["offload_bytes_per_step"] = moved;
    j["offload_bytes_per_s"] = bandwidth;
    if (format == OutputFormat::kJson) {
      *ctx.out << j.dump(2) << "\n";
    } else {
      *ctx.out << JsonToYaml(j);
    }
  }
  ctx.exit_code = r->max_seq_len > 0 ? contract::kExitOk : kExitPlanDoesNotFit;
}

void RunPlan(CliContext& ctx, const PlanOptions& opts) {
  spec::ParseOptions parse_options;
  parse_options.overrides = opts.overrides;
  OutputFormat format;
  spec::JobSpec job;
  if (!LoadSpecForVerb(ctx, opts.file, parse_options, OutputFormat::kTable, &format, &job)) return;
  if (!ResolveInitFromForVerb(ctx, opts.file, &job)) return;
  absl::StatusOr<DeviceSpec> device = ResolveDevice(opts.device_type, opts.gpu_memory);
  if (!device.ok()) {
    PrintErrorLines(ctx, "", device.status().message());
    ctx.exit_code = contract::kExitBadInput;
    return;
  }
  if (!(opts.mfu > 0 && opts.mfu <= 1)) {
    *ctx.err << "--mfu: " << opts.mfu << " is outside (0, 1] (use e.g. 0.4)\n";
    ctx.exit_code = contract::kExitBadInput;
    return;
  }
  device->mfu = opts.mfu;
  if (!opts.host_memory.empty()) {
    const absl::Status host = SetHostMemory(opts.host_memory, &*device);
    if (!host.ok()) {
      PrintErrorLines(ctx, "", host.message());
      ctx.exit_code = contract::kExitBadInput;
      return;
    }
  }
  if (opts.max_seq_gpus != 0) {
    RunMaxSeq(ctx, job, *device, opts.max_seq_gpus, format);
    return;
  }
  const std::vector<StagePlan> plans = PlanJob(job, &*device);
  switch (format) {
    case OutputFormat::kTable:
      PrintTable(job, plans, *device, *ctx.out);
      break;
    case OutputFormat::kJson:
      *ctx.out << PlanJson(job, plans, *device).dump(2) << "\n";
      break;
    case OutputFormat::kYaml:
      *ctx.out << JsonToYaml(PlanJson(job, plans, *device));
      break;
  }
  const bool fits =
      std::all_of(plans.begin(), plans.end(), [](const StagePlan& p) { return p.fits; });
  ctx.exit_code = fits ? contract::kExitOk : kExitPlanDoesNotFit;
}

}  // namespace

void AddDeviceFlags(CLI::App* cmd, std::string* device_type, std::string* gpu_memory) {
  cmd->add_option("--device-type", *device_type,
                  "h100 (80 GiB) | h200 (141 GB) | a100-80g (80 GiB) | cpu (this host's memory "
                  "shared by the ranks)");
  cmd->add_option("--gpu-memory", *gpu_memory,
                  "Memory of one device, e.g. 80GiB, 141GB, 512MiB (overrides --device-type's)");
}

bool ResolveInitFromForVerb(CliContext& ctx, const std::string& file, spec::JobSpec* job) {
  absl::StatusOr<spec::ModelSpec> model = spec::ResolveInitFrom(job->model);
  if (!model.ok()) {
    PrintErrorLines(ctx, file,
                    absl::StrCat(spec::fields::PathOf(&spec::ModelSpec::init_from), ": ",
                                 model.status().message(),
                                 " (the plan needs the shape the engine will load: run where "
                                 "the model directory is readable, or give the shape)"));
    ctx.exit_code = contract::kExitBadInput;
    return false;
  }
  job->model = *std::move(model);
  return true;
}

bool CheckDeviceFit(CliContext& ctx, const std::string& file, const spec::JobSpec& given,
                    const std::string& device_type, const std::string& gpu_memory, bool force) {
  if (device_type.empty() && gpu_memory.empty()) return true;
  spec::JobSpec job = given;
  if (!ResolveInitFromForVerb(ctx, file, &job)) return false;
  absl::StatusOr<DeviceSpec> device =
      ResolveDevice(device_type.empty() ? "h100" : device_type, gpu_memory);
  if (!device.ok()) {
    PrintErrorLines(ctx, "", device.status().message());
    ctx.exit_code = contract::kExitBadInput;
    return false;
  }
  const absl::Status fits = CheckFits(job, *device);
  if (fits.ok()) return true;
  if (force) {
    PrintErrorLines(ctx, absl::StrCat(file, ": warning (--force)"), fits.message());
    return true;
  }
  PrintErrorLines(ctx, file, fits.message());
  ctx.exit_code = contract::kExitBadInput;
  return false;
}

void AddPlanCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Show the per-stage plan: ranks, all-to-all volume, memory per rank, fit, step time");
  cmd->add_option("-f,--file", opts->file, "TrainJob YAML file")->required();
  cmd->add_option("--set", opts->overrides, "Override a field: spec.path=value (repeatable)")
      ->allow_extra_args(false);
  AddDeviceFlags(cmd, &opts->device_type, &opts->gpu_memory);
  cmd->add_option("--mfu", opts->mfu, "Assumed model FLOPs utilisation for the step time")
      ->default_val(0.4);
  cmd->add_option("--max-seq", opts->max_seq_gpus,
                  "Instead of the plan: the longest sequence the job's model and memory options "
                  "train at on N GPUs of --device-type (one stage, sp N)");
  cmd->add_option("--host-memory", opts->host_memory,
                  "Host memory of one node, e.g. 2TiB (GPUs: shared by its 8 GPUs; default 2 TiB "
                  "for h100/h200, 1 TiB for a100-80g; cpu: this host's)");
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl plan -f configs/jobs/llama3-8b-1m.yaml\n"
      "  ulyssesctl plan -f job.yaml --device-type h200 -o json\n"
      "  ulyssesctl plan -f job.yaml --gpu-memory 40GiB --set spec.stages[3].sp_degree=16\n"
      "  ulyssesctl plan -f job.yaml --device-type cpu --host-memory 64GiB\n"
      "Works offline: nothing is sent to the coordinator. The device defaults to h100\n"
      "(--device-type cpu plans a CPU run). With model.init_from the shape is read from its\n"
      "config.json as the engine reads it. A stage that does not fit gets the valid changes that\n"
      "make it fit, cheapest by GPU-hours first. Exit: 0 every stage fits, 3 a stage does not\n"
      "fit (the plan is printed in full), 2 bad input.");
  cmd->callback([&ctx, opts] { RunPlan(ctx, *opts); });
}

}  // namespace ulysses::client
