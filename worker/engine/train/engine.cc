#include "worker/engine/train/engine.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "common/stop.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/data/sharding.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"
// Ulysses attention lands on branch `parallel`; until it is merged the engine builds
// and rejects training with a clear error.
#if __has_include("worker/engine/parallel/ulysses_attention.h")
#include "worker/engine/parallel/ulysses_attention.h"
#define ULYSSES_ENGINE_HAVE_ULYSSES_ATTENTION 1
#endif
#include "worker/engine/train/optimizer.h"

namespace ulysses::engine::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using model::LlamaConfig;
using model::LlamaForCausalLM;

// Runs fn, turning libtorch exceptions into a Status with context.
template <typename Fn>
absl::Status Guard(const std::string& context, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  }
}

void EmitEvent(const json& event) { std::cout << event.dump() << "\n" << std::flush; }

// Peak resident set of this process (VmHWM), bytes.
int64_t PeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

absl::StatusOr<spec::JobSpec> LoadSpec(const std::string& path,
                                       const std::vector<std::string>& overrides) {
  spec::ParseOptions opts;
  opts.overrides = overrides;
  return spec::LoadJobSpecFile(path, opts);
}

// Model shape from the spec, filling unset shape fields from init_from's config.json.
absl::StatusOr<LlamaConfig> ResolveModelConfig(const spec::JobSpec& spec,
                                               const std::string& init_from) {
  spec::ModelSpec m = spec.model;
  if (!init_from.empty() && m.hidden_size == 0) {
    ASSIGN_OR_RETURN(spec::ModelSpec hf, ReadHfConfig(init_from));
    hf.dtype = m.dtype;
    hf.init_from = init_from;
    m = hf;
  }
  return LlamaConfig::FromSpec(m);
}

json ConfigJson(const LlamaConfig& c) {
  return json{{"vocab_size", c.vocab_size},
              {"hidden_size", c.hidden_size},
              {"intermediate_size", c.intermediate_size},
              {"num_hidden_layers", c.num_hidden_layers},
              {"num_attention_heads", c.num_attention_heads},
              {"num_key_value_heads", c.num_key_value_heads},
              {"rope_theta", c.rope_theta},
              {"rms_norm_eps", c.rms_norm_eps},
              {"tie_word_embeddings", c.tie_word_embeddings}};
}

absl::StatusOr<LlamaConfig> ConfigFromJson(const json& j) {
  try {
    LlamaConfig c;
    c.vocab_size = j.at("vocab_size");
    c.hidden_size = j.at("hidden_size");
    c.intermediate_size = j.at("intermediate_size");
    c.num_hidden_layers = j.at("num_hidden_layers");
    c.num_attention_heads = j.at("num_attention_heads");
    c.num_key_value_heads = j.at("num_key_value_heads");
    c.rope_theta = j.at("rope_theta");
    c.rms_norm_eps = j.at("rms_norm_eps");
    c.tie_word_embeddings = j.at("tie_word_embeddings");
    RETURN_IF_ERROR(c.Validate());
    return c;
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint extra.model_config: ", e.what()));
  }
}

absl::Status CheckShape(const std::string& name, const std::string& source,
                        const torch::Tensor& have, const torch::Tensor& want) {
  if (have.sizes() == want.sizes()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": tensor ", name, " has shape ", c10::str(have.sizes()), " but the model needs ",
      c10::str(want.sizes()), " (model shape in the spec does not match)"));
}

// Copies named tensors into the model's parameters; every parameter must be present.
absl::Status LoadParams(LlamaForCausalLM& model, const std::map<std::string, torch::Tensor>& named,
                        const std::string& source) {
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    auto it = named.find(item.key());
    if (it == named.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor ", item.key(), " is missing"));
    }
    RETURN_IF_ERROR(CheckShape(item.key(), source, it->second, item.value()));
    item.value().copy_(it->second);
  }
  return absl::OkStatus();
}

// Model weights of a checkpoint by HF name ("model/<hf name>" entries).
constexpr char kModelPrefix[] = "model/";
std::map<std::string, torch::Tensor> ModelTensors(const CheckpointState& state) {
  std::map<std::string, torch::Tensor> out;
  const std::string prefix = kModelPrefix;
  for (const auto& t : state.tensors) {
    if (t.name.rfind(prefix, 0) == 0) out[t.name.substr(prefix.size())] = t.tensor;
  }
  return out;
}

// The latest committed checkpoint under root, or nullopt when there is none.
absl::StatusOr<std::optional<std::string>> FindLatest(const std::string& root) {
  absl::StatusOr<std::string> latest = LatestCommittedCheckpoint(root);
  if (latest.ok()) return std::optional<std::string>(*latest);
  if (latest.status().code() == absl::StatusCode::kNotFound) return std::optional<std::string>();
  return latest.status();
}

NamedParams Params(LlamaForCausalLM& model) {
  NamedParams out;
  for (auto& item : model->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// One process's engine state for a given (sp, dp) layout.
struct Engine {
  spec::JobSpec spec;
  LlamaConfig config;
  torch::Dtype dtype = torch::kFloat;
  torch::Device device{torch::kCPU};
  ProcessGroups groups;
  int64_t sp = 1, dp = 1;
  LlamaForCausalLM model{nullptr};
  model::AttentionFn attention;
};

absl::StatusOr<std::unique_ptr<Engine>> BuildEngine(const spec::JobSpec& spec,
                                                    const LlamaConfig& config, int64_t sp,
                                                    int64_t dp, int rank, int world,
                                                    const std::string& master_addr, int master_port,
                                                    const std::string& device) {
  auto e = std::make_unique<Engine>();
  e->spec = spec;
  e->config = config;
  e->sp = sp;
  e->dp = dp;
  if (sp * dp != world) {
    return absl::InvalidArgumentError(absl::StrCat("--world-size: ", world, " != sp_degree ", sp,
                                                   " x dp_degree ", dp, " of this stage"));
  }
#ifdef ULYSSES_ENGINE_HAVE_ULYSSES_ATTENTION
  RETURN_IF_ERROR(CheckUlyssesHeads(config.num_attention_heads, config.num_key_value_heads, sp));
#else
  return absl::UnimplementedError(
      "this build has no Ulysses attention (merge branch parallel into this build)");
#endif
  ASSIGN_OR_RETURN(e->dtype, model::ParseDtype(spec.model.dtype));
  if (spec.memory.attention_block_size <= 0) {
    return absl::InvalidArgumentError("spec.memory.attention_block_size: must be > 0");
  }
  RETURN_IF_ERROR(Guard("device", [&] {
    e->device = torch::Device(device);
    return absl::OkStatus();
  }));
  CommConfig comm;
  comm.backend = e->device.is_cuda() ? "nccl" : "gloo";
  comm.master_addr = master_addr;
  comm.master_port = master_port;
  comm.rank = rank;
  comm.world_size = world;
  comm.sp_size = static_cast<int>(sp);
  comm.device = device;
  ASSIGN_OR_RETURN(e->groups, CreateProcessGroups(comm));

  model::MemoryOptions mem;
  mem.activation_checkpointing = spec.memory.activation_checkpointing;
  mem.tiled_mlp = spec.memory.tiled_mlp;
  mem.tiled_loss = spec.memory.tiled_loss;
  mem.loss_tile_tokens = spec.memory.loss_tile_tokens;
  RETURN_IF_ERROR(Guard("building the model", [&] {
    e->model = LlamaForCausalLM(config, mem);
    e->model->InitWeights(spec.seed);
    e->model->to(e->device, e->dtype);
    return absl::OkStatus();
  }));
#ifdef ULYSSES_ENGINE_HAVE_ULYSSES_ATTENTION
  Communicator* sp_comm = e->groups.sp.get();
  AttentionOptions attn_opts;
  attn_opts.block_size = spec.memory.attention_block_size;
  e->attention = [sp_comm, attn_opts](const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v) {
    return UlyssesAttention(q, k, v, sp_comm, attn_opts);
  };
#endif
  return e;
}

absl::StatusOr<std::vector<NamedTensor>> ReadHfWeights(const std::string& dir) {
  return LoadHfWeights(dir);
}

struct Counters {
  int64_t global_step = 0;
  int64_t adam_steps = 0;
};

absl::StatusOr<std::string> Commit(Engine& e, AdamW& adam, const std::string& root, int stage,
                                   int64_t step_in_stage, const Counters& c, bool complete,
                                   int64_t steps_total) {
  auto t0 = std::chrono::steady_clock::now();
  CheckpointState state;
  state.stage = stage;
  state.step_in_stage = step_in_stage;
  state.global_step = c.global_step;
  state.stage_complete = complete;
  state.spec_hash = spec::SpecHash(e.spec);
  for (auto& [name, t] : Params(e.model)) {
    state.tensors.push_back({kModelPrefix + name, t.detach().cpu()});
  }
  for (auto& [name, t] : adam.StateTensors()) state.tensors.push_back({name, t.cpu()});
  state.extra = json{{"adam_steps", adam.step_count()},
                     {"seed", e.spec.seed},
                     {"sp_degree", e.sp},
                     {"dp_degree", e.dp},
                     {"model_config", ConfigJson(e.config)},
                     {"dtype", e.spec.model.dtype}};
  Communicator* world = e.groups.world.get();
  ASSIGN_OR_RETURN(std::string path, SaveCheckpoint(root, state, world->rank(), world->size(),
                                                    e.spec.checkpoint.keep_last,
                                                    [world] { return world->Barrier(); }));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (world->rank() == 0) {
    absl::StatusOr<int64_t> bytes_or = CheckpointBytes(path);
    const int64_t bytes = bytes_or.ok() ? *bytes_or : -1;
    EmitEvent(json{{"event", "checkpoint"},
                   {"stage", stage},
                   {"step", step_in_stage},
                   {"path", path},
                   {"bytes", bytes},
                   {"seconds", secs}});
  }
  return path;
}

// Global sums over `world` of (loss_sum, tokens, correct, acc_tokens) for eval.
absl::StatusOr<EvalResult> Evaluate(Engine& e, int64_t seq_len) {
  ASSIGN_OR_RETURN(auto val, OpenDataset(e.spec, Split::kValidation, e.config.vocab_size));
  int64_t n = val->NumSequences(seq_len);
  if (n < 0) n = e.spec.data.synthetic ? e.spec.data.synthetic->validation_sequences : 0;
  if (n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.data.validation: no validation window of seq_len ", seq_len,
                     " (the file is too short; give a longer file or a shorter seq_len)"));
  }
  double loss_sum = 0;
  int64_t tokens = 0, correct = 0, acc_tokens = 0;
  torch::NoGradGuard no_grad;
  for (int64_t i = e.groups.dp_rank; i < n; i += e.dp) {
    ASSIGN_OR_RETURN(Sample sample, val->Get(i, seq_len));
    ASSIGN_OR_RETURN(LocalShard shard, ShardSamples({sample}, e.groups.sp_rank, e.sp));
    RETURN_IF_ERROR(Guard("eval forward", [&] {
      torch::Tensor ids = shard.input_ids.to(e.device), labels = shard.labels.to(e.device);
      model::LossOutput out = e.model->Loss(ids, shard.position_ids.to(e.device), labels,
                                            e.attention, labels.ne(model::kIgnoreIndex));
      loss_sum += out.loss_sum.item<double>();
      tokens += out.tokens;
      correct += out.correct;
      acc_tokens += out.accuracy_tokens;
      return absl::OkStatus();
    }));
  }
  std::vector<torch::Tensor> sums = {
      torch::tensor({loss_sum, static_cast<double>(tokens), static_cast<double>(correct),
                     static_cast<double>(acc_tokens)},
                    torch::kDouble)
          .to(e.device)};
  RETURN_IF_ERROR(e.groups.world->AllReduceSum(sums));
  torch::Tensor s = sums[0].cpu();
  EvalResult r;
  r.tokens = static_cast<int64_t>(std::llround(s[1].item<double>()));
  r.loss = s[0].item<double>() / std::max<double>(1.0, s[1].item<double>());
  // Accuracy is reported when the data scores a subset (needle) or always for synthetic data.
  r.has_accuracy = e.spec.data.synthetic.has_value() && s[3].item<double>() > 0;
  r.accuracy = s[2].item<double>() / std::max<double>(1.0, s[3].item<double>());
  return r;
}

void AppendMetrics(const std::string& out_dir, const json& line) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  std::ofstream f(fs::path(out_dir) / "metrics.jsonl", std::ios::app);
  f << line.dump() << "\n";
}

// Restores model + optimizer from a checkpoint state.
absl::Status Restore(Engine& e, AdamW& adam, const CheckpointState& state,
                     const std::string& path) {
  std::map<std::string, torch::Tensor> named = ModelTensors(state);
  RETURN_IF_ERROR(LoadParams(e.model, named, absl::StrCat("checkpoint ", path)));
  for (const auto& t : state.tensors) named[t.name] = t.tensor;
  int64_t adam_steps = 0;
  if (state.extra.contains("adam_steps")) adam_steps = state.extra["adam_steps"].get<int64_t>();
  return adam.LoadState(Params(e.model), named, adam_steps);
}

absl::StatusOr<RankOutcome> RunRankImpl(const RankOptions& o) {
  ASSIGN_OR_RETURN(spec::JobSpec spec, LoadSpec(o.job_file, o.overrides));
  if (o.stage < 0 || o.stage >= static_cast<int>(spec.stages.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stage: ", o.stage, " is out of range (job has ", spec.stages.size(), " stages)"));
  }
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out: required");
  const spec::StageSpec& stage = spec.stages[o.stage];
  const int64_t sp = spec.StageSp(o.stage), dp = spec.StageDp(o.stage);
  if (stage.seq_len % sp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.stages[", o.stage, "].seq_len: ", stage.seq_len,
                     " is not divisible by sp_degree ", sp, " (use a multiple of ", sp, ")"));
  }
  InstallStopSignalHandlers();
  const std::string root = CheckpointRoot(spec, o.out_dir);
  const std::string hash = spec::SpecHash(spec);

  // Decide where we start before touching the network (bad input fails fast on every rank).
  std::optional<CheckpointState> resume;
  std::string resume_path;
  ASSIGN_OR_RETURN(std::optional<std::string> latest, FindLatest(root));
  if (latest) {
    ASSIGN_OR_RETURN(CheckpointState st, LoadCheckpoint(*latest, hash));
    if (st.stage > o.stage || (st.stage == o.stage && st.stage_complete)) {
      if (o.rank == 0) EmitEvent(json{{"event", "done"}, {"stage", o.stage}});
      return RankOutcome{};
    }
    if (st.stage < o.stage && !(st.stage == o.stage - 1 && st.stage_complete)) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", *latest, " is stage ", st.stage, " step ", st.step_in_stage,
                       " (complete=", st.stage_complete, "); run stage ", st.stage, " first"));
    }
    resume = std::move(st);
    resume_path = *latest;
  } else if (o.stage > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--stage ", o.stage, ": no committed checkpoint under ", root, " (run stage 0 first)"));
  }

  LlamaConfig config;
  if (resume && resume->extra.contains("model_config")) {
    ASSIGN_OR_RETURN(config, ConfigFromJson(resume->extra["model_config"]));
  } else {
    ASSIGN_OR_RETURN(config, ResolveModelConfig(spec, spec.model.init_from));
  }
  ASSIGN_OR_RETURN(auto train_data, OpenDataset(spec, Split::kTrain, config.vocab_size));
  // Fail fast on a data file too short for one sequence.
  RETURN_IF_ERROR(train_data->Get(0, stage.seq_len).status());

  ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                   BuildEngine(spec, config, sp, dp, o.rank, o.world_size, o.master_addr,
                               o.master_port, o.device));
  AdamWConfig acfg;
  acfg.beta1 = spec.optimizer.beta1;
  acfg.beta2 = spec.optimizer.beta2;
  acfg.eps = spec.optimizer.eps;
  acfg.weight_decay = spec.optimizer.weight_decay;
  AdamW adam(acfg);
  Counters counters;
  int64_t start_step = 0;
  if (resume) {
    RETURN_IF_ERROR(Restore(*e, adam, *resume, resume_path));
    counters.global_step = resume->global_step;
    if (resume->stage == o.stage) start_step = resume->step_in_stage;
  } else if (!spec.model.init_from.empty()) {
    ASSIGN_OR_RETURN(auto weights, ReadHfWeights(spec.model.init_from));
    std::map<std::string, torch::Tensor> named;
    for (auto& t : weights) named[t.name] = t.tensor;
    RETURN_IF_ERROR(LoadParams(e->model, named, absl::StrCat("init_from ", spec.model.init_from)));
  }

  const int64_t steps = stage.steps;
  const int64_t ga = std::max<int64_t>(1, spec.optimizer.grad_accum_steps);
  const double peak = spec.StageLr(o.stage);
  const int64_t warmup = spec.StageWarmup(o.stage);
  const bool rank0 = o.rank == 0;
  NamedParams params = Params(e->model);
  Communicator& world = *e->groups.world;

  for (int64_t step = start_step; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    for (auto& [name, p] : params) {
      if (p.grad().defined()) p.grad().zero_();
    }
    double local_loss = 0;
    int64_t local_tokens = 0;
    for (int64_t micro = 0; micro < ga; ++micro) {
      const int64_t index = TrainSequenceIndex(step, micro, e->groups.dp_rank, dp, ga);
      ASSIGN_OR_RETURN(Sample sample, train_data->Get(index, stage.seq_len));
      ASSIGN_OR_RETURN(LocalShard shard, ShardSamples({sample}, e->groups.sp_rank, sp));
      RETURN_IF_ERROR(Guard(absl::StrCat("step ", step, " micro ", micro), [&] {
        model::LossOutput out =
            e->model->Loss(shard.input_ids.to(e->device), shard.position_ids.to(e->device),
                           shard.labels.to(e->device), e->attention);
        out.loss_sum.backward();
        local_loss += out.loss_sum.item<double>();
        local_tokens += out.tokens;
        return absl::OkStatus();
      }));
    }
    // Sum grads + (loss, tokens) over the world; then scale grads by 1/max(tokens, 1).
    std::vector<torch::Tensor> reduce;
    for (auto& [name, p] : params) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      reduce.push_back(p.grad());
    }
    reduce.push_back(torch::tensor({local_loss, static_cast<double>(local_tokens)}, torch::kDouble)
                         .to(e->device));
    RETURN_IF_ERROR(world.AllReduceSum(reduce));
    torch::Tensor stats = reduce.back().cpu();
    const double total_tokens = stats[1].item<double>();
    const double loss = stats[0].item<double>() / std::max(1.0, total_tokens);
    double grad_norm = 0;
    const double lr = ScheduledLr(spec.optimizer.schedule, peak, spec.optimizer.min_lr_ratio,
                                  warmup, steps, step);
    RETURN_IF_ERROR(Guard("optimizer step", [&] {
      {
        torch::NoGradGuard no_grad;
        for (auto& [name, p] : params) p.grad().div_(std::max(1.0, total_tokens));
      }
      grad_norm = ClipGradNorm(params, spec.optimizer.grad_clip);
      adam.Step(params, lr);
      return absl::OkStatus();
    }));
    ++counters.global_step;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens_per_s = static_cast<double>(stage.seq_len * ga * dp) / std::max(secs, 1e-9);
    if (rank0) {
      EmitEvent(json{{"event", "step"},
                     {"stage", o.stage},
                     {"step", step + 1},
                     {"steps", steps},
                     {"loss", loss},
                     {"tokens_per_s", tokens_per_s},
                     {"seq_len", stage.seq_len}});
      AppendMetrics(o.out_dir, json{{"step", counters.global_step},
                                    {"stage", o.stage},
                                    {"step_in_stage", step + 1},
                                    {"seq_len", stage.seq_len},
                                    {"sp_degree", sp},
                                    {"dp_degree", dp},
                                    {"loss", loss},
                                    {"grad_norm", grad_norm},
                                    {"lr", lr},
                                    {"tokens", static_cast<int64_t>(total_tokens)},
                                    {"tokens_per_s", tokens_per_s},
                                    {"step_seconds", secs},
                                    {"peak_rss_bytes", PeakRssBytes()}});
    }
    // Agree on a stop across all ranks.
    torch::Tensor stop = torch::tensor({StopRequested() ? 1.0f : 0.0f}).to(e->device);
    RETURN_IF_ERROR(world.AllReduceMax(stop));
    const bool stopping = stop.cpu().item<float>() > 0;
    const bool last = step + 1 == steps;
    const bool periodic =
        spec.checkpoint.every_steps > 0 && (step + 1) % spec.checkpoint.every_steps == 0;
    if (stopping && !last) {
      RETURN_IF_ERROR(Commit(*e, adam, root, o.stage, step + 1, counters, false, steps).status());
      return RankOutcome{true};
    }
    if (periodic && !last) {
      RETURN_IF_ERROR(Commit(*e, adam, root, o.stage, step + 1, counters, false, steps).status());
    }
  }

  ASSIGN_OR_RETURN(EvalResult ev, Evaluate(*e, stage.seq_len));
  if (rank0) {
    json event{
        {"event", "eval"}, {"stage", o.stage}, {"seq_len", stage.seq_len}, {"loss", ev.loss}};
    json metric{
        {"stage", o.stage}, {"seq_len", stage.seq_len}, {"loss", ev.loss}, {"tokens", ev.tokens}};
    if (ev.has_accuracy) {
      event["accuracy"] = ev.accuracy;
      metric["accuracy"] = ev.accuracy;
    }
    EmitEvent(event);
    AppendMetrics(o.out_dir, json{{"eval", metric}});
  }
  RETURN_IF_ERROR(Commit(*e, adam, root, o.stage, steps, counters, true, steps).status());
  if (rank0) {
    EmitEvent(json{{"event", "done"}, {"stage", o.stage}, {"peak_rss_bytes", PeakRssBytes()}});
  }
  return RankOutcome{};
}

absl::StatusOr<EvalResult> RunEvalRankImpl(const EvalOptions& o) {
  ASSIGN_OR_RETURN(spec::JobSpec spec, LoadSpec(o.job_file, o.overrides));
  if (!o.checkpoint.empty() && !o.init_from.empty()) {
    return absl::InvalidArgumentError("eval: give --checkpoint or --init-from, not both");
  }
  const int64_t seq_len = o.seq_len > 0 ? o.seq_len : spec.stages.back().seq_len;
  if (seq_len % o.world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq-len: ", seq_len, " is not divisible by --nproc ", o.world_size));
  }
  std::optional<CheckpointState> state;
  LlamaConfig config;
  if (!o.checkpoint.empty()) {
    ASSIGN_OR_RETURN(CheckpointState st, LoadCheckpoint(o.checkpoint, ""));
    if (!st.extra.contains("model_config")) {
      return absl::DataLossError(absl::StrCat("checkpoint ", o.checkpoint, ": no model_config"));
    }
    ASSIGN_OR_RETURN(config, ConfigFromJson(st.extra["model_config"]));
    state = std::move(st);
  } else {
    std::string init = o.init_from.empty() ? spec.model.init_from : o.init_from;
    if (!init.empty()) spec.model.init_from = init;
    ASSIGN_OR_RETURN(config, ResolveModelConfig(spec, init));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                   BuildEngine(spec, config, o.world_size, 1, o.rank, o.world_size, o.master_addr,
                               o.master_port, o.device));
  if (state) {
    RETURN_IF_ERROR(
        LoadParams(e->model, ModelTensors(*state), absl::StrCat("checkpoint ", o.checkpoint)));
  } else if (!spec.model.init_from.empty()) {
    ASSIGN_OR_RETURN(auto weights, ReadHfWeights(spec.model.init_from));
    std::map<std::string, torch::Tensor> named;
    for (auto& t : weights) named[t.name] = t.tensor;
    RETURN_IF_ERROR(LoadParams(e->model, named, absl::StrCat("init_from ", spec.model.init_from)));
  }
  return Evaluate(*e, seq_len);
}

}  // namespace

std::string CheckpointRoot(const spec::JobSpec& spec, const std::string& out_dir) {
  return spec.checkpoint.dir.empty() ? (fs::path(out_dir) / "checkpoints").string()
                                     : spec.checkpoint.dir;
}

absl::StatusOr<int> FirstStageToRun(const spec::JobSpec& spec, const std::string& out_dir) {
  ASSIGN_OR_RETURN(std::optional<std::string> latest, FindLatest(CheckpointRoot(spec, out_dir)));
  if (!latest) return 0;
  ASSIGN_OR_RETURN(CheckpointState st, LoadCheckpoint(*latest, spec::SpecHash(spec)));
  return static_cast<int>(st.stage + (st.stage_complete ? 1 : 0));
}

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

absl::StatusOr<RankOutcome> RunRank(const RankOptions& options) {
  absl::StatusOr<RankOutcome> result;
  absl::Status s = Guard("ulysses-train rank", [&] {
    result = RunRankImpl(options);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return result;
}

absl::StatusOr<EvalResult> RunEvalRank(const EvalOptions& options) {
  absl::StatusOr<EvalResult> result;
  absl::Status s = Guard("ulysses-train eval", [&] {
    result = RunEvalRankImpl(options);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return result;
}

absl::Status ExportCheckpoint(const std::string& checkpoint_dir, const std::string& hf_out) {
  return Guard("ulysses-train export", [&]() -> absl::Status {
    std::error_code ec;
    if (fs::exists(hf_out, ec) && !fs::is_empty(hf_out, ec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("--hf-out: ", hf_out, " exists and is not empty (choose a new directory)"));
    }
    ASSIGN_OR_RETURN(CheckpointState st, LoadCheckpoint(checkpoint_dir, ""));
    if (!st.extra.contains("model_config")) {
      return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint_dir, ": no model_config"));
    }
    ASSIGN_OR_RETURN(LlamaConfig config, ConfigFromJson(st.extra["model_config"]));
    spec::ModelSpec m;
    m.vocab_size = config.vocab_size;
    m.hidden_size = config.hidden_size;
    m.intermediate_size = config.intermediate_size;
    m.num_hidden_layers = config.num_hidden_layers;
    m.num_attention_heads = config.num_attention_heads;
    m.num_key_value_heads = config.num_key_value_heads;
    m.rope_theta = config.rope_theta;
    m.rms_norm_eps = config.rms_norm_eps;
    m.tie_word_embeddings = config.tie_word_embeddings;
    std::vector<NamedTensor> weights;
    for (auto& [name, t] : ModelTensors(st)) weights.push_back({name, t});
    return WriteHfDirectory(hf_out, m, weights);
  });
}

}  // namespace ulysses::engine::train
