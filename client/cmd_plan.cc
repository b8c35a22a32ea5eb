// ulyssesctl plan -f FILE [--set ...]: the offline per-stage plan (client/plan.h).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/output.h"
#include "client/plan.h"
#include "common/spec/job_spec_parser.h"

namespace ulysses::client {
namespace {

struct PlanOptions {
  std::string file;
  std::vector<std::string> overrides;
};

Table PlanTable(const std::vector<StagePlan>& plans) {
  Table table({"stage", "seq_len", "steps", "sp", "dp", "world", "tokens/rank", "kv_heads",
               "a2a/layer", "a2a_bytes", "activations", "model_state"});
  auto bytes = [](double v) { return v > 0 ? FormatBytes(v) : std::string("?"); };
  for (size_t i = 0; i < plans.size(); ++i) {
    const StagePlan& p = plans[i];
    table.AddRow({absl::StrCat(i), absl::StrCat(p.seq_len), absl::StrCat(p.steps),
                  absl::StrCat(p.sp), absl::StrCat(p.dp), absl::StrCat(p.world),
                  absl::StrCat(p.tokens_per_rank), absl::StrCat(p.kv_heads_exchanged),
                  p.sp == 1 ? "0" : (p.a2a_elements > 0 ? FormatCount(p.a2a_elements) : "?"),
                  p.sp == 1 ? "0" : bytes(p.a2a_bytes), bytes(p.activation_bytes),
                  bytes(p.model_state_bytes)});
  }
  return table;
}

// Machine-readable plan: exact numbers, descriptive keys (0 = unknown shape).
nlohmann::ordered_json PlanJson(const std::vector<StagePlan>& plans) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < plans.size(); ++i) {
    const StagePlan& p = plans[i];
    rows.push_back({{"stage", i},
                    {"seq_len", p.seq_len},
                    {"steps", p.steps},
                    {"sp_degree", p.sp},
                    {"dp_degree", p.dp},
                    {"world_size", p.world},
                    {"tokens_per_rank", p.tokens_per_rank},
                    {"kv_heads_exchanged", p.kv_heads_exchanged},
                    {"a2a_elements_per_layer_per_rank", static_cast<int64_t>(p.a2a_elements)},
                    {"a2a_bytes_per_layer_per_rank", static_cast<int64_t>(p.a2a_bytes)},
                    {"activation_bytes_per_rank", static_cast<int64_t>(p.activation_bytes)},
                    {"model_state_bytes_per_rank", static_cast<int64_t>(p.model_state_bytes)}});
  }
  return rows;
}

void RunPlan(CliContext& ctx, const PlanOptions& opts) {
  spec::ParseOptions parse_options;
  parse_options.overrides = opts.overrides;
  OutputFormat format;
  spec::JobSpec job;
  if (!LoadSpecForVerb(ctx, opts.file, parse_options, OutputFormat::kTable, &format, &job)) return;
  const std::vector<StagePlan> plans = PlanJob(job);
  switch (format) {
    case OutputFormat::kTable: {
      const spec::ModelSpec& m = job.model;
      *ctx.out << "job " << job.metadata.name << ": " << FormatCount(ParameterCount(m))
               << " parameters, " << m.num_hidden_layers << " layers, " << m.num_attention_heads
               << "q/" << m.num_key_value_heads << "kv heads of dim " << m.head_dim() << ", "
               << m.dtype << "\n";
      PlanTable(plans).Print(*ctx.out);
      *ctx.out
          << "tokens/rank = N/P; kv_heads = kv heads after replication for the exchange (Hkv');\n"
             "a2a/layer = forward all-to-all elements per layer per rank, "
             "(2*Hq + 2*Hkv')*D*N/P (0 at SP 1: nothing to exchange);\n"
             "activations, model_state = rough per-rank estimates (docs/JOBSPEC.md, Plan)\n";
      break;
    }
    case OutputFormat::kJson:
      *ctx.out << PlanJson(plans).dump(2) << "\n";
      break;
    case OutputFormat::kYaml:
      *ctx.out << JsonToYaml(PlanJson(plans));
      break;
  }
  ctx.exit_code = contract::kExitOk;
}

}  // namespace

void AddPlanCommand(CLI::App& app, CliContext& ctx) {
  auto opts = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Show the per-stage plan: ranks, tokens per rank, all-to-all volume, memory");
  cmd->add_option("-f,--file", opts->file, "TrainJob YAML file")->required();
  cmd->add_option("--set", opts->overrides, "Override a field: spec.path=value (repeatable)")
      ->allow_extra_args(false);
  cmd->footer(
      "Examples:\n"
      "  ulyssesctl plan -f configs/jobs/llama3-8b-1m.yaml\n"
      "  ulyssesctl plan -f job.yaml --set spec.stages[3].sp_degree=16 -o json\n"
      "Works offline: nothing is sent to the coordinator.");
  cmd->callback([&ctx, opts] { RunPlan(ctx, *opts); });
}

}  // namespace ulysses::client
