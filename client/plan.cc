#include "client/plan.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/output.h"
#include "common/spec/gpu_peaks.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/memory_model.h"
#include "common/spec/model_math.h"
#include "common/spec/model_shape.h"

namespace ulysses::client {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// GPU runtime reserve: CUDA context and kernels (~0.5 GiB), NCCL buffers (~1 GiB) and the
// caching allocator's fragmentation slack (~1.5 GiB). Not measured here: a stated margin.
constexpr double kGpuReserveBytes = 3 * kGiB;
// CPU process baseline per rank: libtorch, Gloo and the binary before any tensor of the
// job (measured: bench/plan_vs_rss.sh, docs/BENCHMARKS.md "Planner vs measured RSS").
constexpr double kCpuBaselineBytes = 180 * kMiB;
// glibc malloc's resident-but-free heap on top of the live activation bytes on cpu: peak RSS
// of the tiny preset at sp 4 was 580 MB by default and 430 MB with MALLOC_MMAP_THRESHOLD_=131072
// (large blocks returned on free) at 8K, where the formula gives 472 MB of live bytes; a factor
// of 1.4 on activations fits 512/2K/8K (docs/BENCHMARKS.md "Planner vs measured RSS"). ZeRO's
// per-layer gathered buffers are short-lived the same way and get the same factor (ZeRO-3 of a
// 160M-parameter model at sp 4 measured 0.83 of plan without it, docs/BENCHMARKS.md).
constexpr double kCpuTransientOverhead = 1.4;

double HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

double PeakFlops(const DeviceSpec& d, const std::string& dtype) {
  if (dtype == "bfloat16" || dtype == "float16") return d.peak_flops_bf16;
  if (dtype == "float64") return d.peak_flops_fp64;
  return d.peak_flops_fp32;
}

spec::ModelShape Shape(const spec::ModelSpec& m) { return static_cast<const spec::ModelShape&>(m); }

// Hardware FLOPs per token: the model FLOPs (common/spec/model_math.h, the MFU convention)
// plus what the memory options recompute.
double FlopsPerToken(const spec::JobSpec& s, int64_t seq_len) {
  spec::RecomputeOptions recompute;
  recompute.activation_checkpointing = s.memory.activation_checkpointing;
  recompute.keep_attention_outputs = s.memory.keep_attention_outputs;
  recompute.tiled_mlp = s.memory.tiled_mlp;
  recompute.tiled_loss = s.memory.tiled_loss;
  return spec::ModelFlopsPerToken(s.model, seq_len) +
         spec::RecomputeFlopsPerToken(s.model, seq_len, recompute);
}

}  // namespace

absl::StatusOr<double> ParseByteSize(const std::string& text, const std::string& field) {
  const std::string fix = "use a size such as 80GiB, 141GB or 512MiB";
  auto bad = [&](const std::string& problem) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", text, "' ", problem, " (", fix, ")"));
  };
  std::string t(absl::StripAsciiWhitespace(text));
  if (t.empty()) return bad("is empty");
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) return bad("does not start with a number");
  const std::string number = t.substr(0, i);
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) {
    return bad("is not a number");
  }
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(i)));
  double scale = 0;
  const std::pair<const char*, double> units[] = {
      {"", 1},     {"b", 1},    {"kib", 1024.0}, {"mib", kMiB}, {"gib", kGiB}, {"tib", kGiB * 1024},
      {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9},     {"tb", 1e12}};
  for (const auto& [name, factor] : units) {
    if (unit == name) scale = factor;
  }
  if (scale == 0) return bad(absl::StrCat("has an unknown unit '", unit, "'"));
  const double bytes = value * scale;
  if (bytes < kMiB) return bad("is below 1 MiB");
  if (bytes > 1e15) return bad("is above 1 PB");
  return bytes;
}

std::vector<std::string> DeviceTypes() { return {"h100", "h200", "a100-80g", "cpu"}; }

absl::StatusOr<DeviceSpec> ResolveDevice(const std::string& type, const std::string& memory) {
  DeviceSpec d;
  d.type = type;
  if (type == "h100" || type == "h200") {
    // H100 SXM 80 GB and H200 141 GB share the Hopper peaks (dense, no sparsity).
    d.memory_bytes = type == "h100" ? 80 * kGiB : 141e9;
    d.host_memory_per_rank_bytes = 2048 * kGiB / 8;  // DGX/HGX H100 and H200: 2 TiB, 8 GPUs
    d.devices_per_node = 8;
    d.peak_flops_bf16 = spec::GpuPeakNamed(type == "h100" ? "H100 SXM" : "H200").bf16_dense_flops;
    d.peak_flops_fp32 = 494.5e12;  // TF32
    d.peak_flops_fp64 = 67e12;
    d.a2a_bytes_per_s = 150e9;  // NVLink 4 within a node, effective all-to-all
  } else if (type == "a100-80g") {
    d.memory_bytes = 80 * kGiB;
    d.host_memory_per_rank_bytes = 1024 * kGiB / 8;  // DGX A100: 1 TiB (2 TiB option), 8 GPUs
    d.devices_per_node = 8;
    d.peak_flops_bf16 = spec::GpuPeakNamed("A100").bf16_dense_flops;
    d.peak_flops_fp32 = 156e12;  // TF32
    d.peak_flops_fp64 = 19.5e12;
    d.a2a_bytes_per_s = 100e9;  // NVLink 3
  } else if (type == "cpu") {
    // Every rank is a process on this host: they share its memory and cores. Peak: 32 fp32
    // FLOPs per cycle per core (two AVX2 FMA units) at an assumed 2.5 GHz.
    d.host_is_device = true;
    d.host_memory_bytes = HostMemoryBytes();
    d.memory_bytes = d.host_memory_bytes;
    d.memory_is_host_total = true;
    const double cores = std::max(1u, std::thread::hardware_concurrency());
    d.peak_flops_fp32 = cores * 32 * 2.5e9;
    d.peak_flops_bf16 = d.peak_flops_fp32;
    d.peak_flops_fp64 = d.peak_flops_fp32 / 2;
    d.a2a_bytes_per_s = 2e9;  // Gloo over loopback
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--device-type: '", type,
                                                   "' is not a known device (use one of ",
                                                   absl::StrJoin(DeviceTypes(), ", "), ")"));
  }
  d.reserve_bytes = d.host_is_device ? kCpuBaselineBytes : kGpuReserveBytes;
  d.transient_overhead = d.host_is_device ? kCpuTransientOverhead : 1.0;
  if (!memory.empty()) {
    absl::StatusOr<double> bytes = ParseByteSize(memory, "--gpu-memory");
    if (!bytes.ok()) return bytes.status();
    d.memory_bytes = *bytes;
    d.memory_is_host_total = false;
  }
  if (d.memory_bytes <= d.reserve_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory: ", FormatBytes(d.memory_bytes), " is not more than the ", d.type,
        " runtime reserve of ", FormatBytes(d.reserve_bytes), " (give the device's memory)"));
  }
  return d;
}

std::string StagePlan::peak_phase() const {
  if (init_bytes > resume_bytes && init_bytes > total_bytes()) {
    return init_is_import ? "import" : "init";
  }
  return resume_bytes > total_bytes() ? "resume" : "steady";
}

std::string StagePlan::host_peak_phase() const {
  if (init_host_bytes > resume_host_bytes && init_host_bytes > steady_host_bytes) {
    return init_is_import ? "import" : "init";
  }
  return resume_host_bytes > steady_host_bytes ? "resume" : "steady";
}

double ParameterCount(const spec::ModelSpec& m) { return spec::CountParameters(Shape(m)).total; }

namespace {

// What the memory model needs of the job's state for one stage's world.
spec::ModelStateInputs StateInputs(const spec::JobSpec& s, const spec::ParameterCounts& counts,
                                   const StagePlan& p, const DeviceSpec* device) {
  spec::ModelStateInputs in;
  in.params = counts;
  in.dtype = s.model.dtype;
  in.zero_stage = s.parallelism.zero_stage;
  in.world = p.world;
  in.offload_optimizer =
      s.parallelism.offload_optimizer && !(device != nullptr && device->host_is_device);
  in.activation_checkpointing = s.memory.activation_checkpointing;
  return in;
}

// A stage's layout: its sequence, degrees, the tokens a rank holds and the device it runs on.
StagePlan StageLayout(const spec::JobSpec& s, size_t i, const DeviceSpec* device) {
  StagePlan p;
  p.seq_len = s.stages[i].seq_len;
  p.steps = s.stages[i].steps;
  p.sp = std::max<int64_t>(1, s.StageSp(i));
  p.dp = std::max<int64_t>(1, s.StageDp(i));
  p.world = p.sp * p.dp;
  p.tokens_per_rank = p.seq_len / p.sp;
  p.micro_batch = std::max<int64_t>(1, s.optimizer.micro_batch_size);
  p.kv_heads_exchanged = spec::UlyssesKvHeadsExchanged(s.model.num_key_value_heads, p.sp);
  if (device != nullptr) {
    p.runtime_bytes = device->reserve_bytes;
    p.device_bytes = device->memory_is_host_total
                         ? device->memory_bytes / static_cast<double>(p.world)
                         : device->memory_bytes;
    p.nodes = (p.world + device->devices_per_node - 1) / device->devices_per_node;
    if (!device->host_is_device) p.host_limit_bytes = device->host_memory_per_rank_bytes;
  }
  return p;
}

// A rank's device and host memory in steady state (common/spec/memory_model.h), and the
// checkpoint mode that memory allows. Fills p's byte figures and checkpoint choice.
void PlanSteadyMemory(const spec::JobSpec& s, const spec::ParameterCounts& counts,
                      const DeviceSpec* device, StagePlan& p) {
  const spec::ModelSpec& m = s.model;
  const bool host_is_device = device != nullptr && device->host_is_device;
  // q, k, v in (scatter heads) and the attention output back: (2 Hq + 2 Hkv') D N/P.
  // SP 1 holds the whole sequence and exchanges nothing.
  p.a2a_elements =
      p.sp == 1 ? 0
                : static_cast<double>(2 * m.num_attention_heads + 2 * p.kv_heads_exchanged) *
                      static_cast<double>(m.HeadDim()) * static_cast<double>(p.tokens_per_rank) *
                      static_cast<double>(p.micro_batch);
  p.a2a_bytes = p.a2a_elements * static_cast<double>(spec::DtypeBytes(m.dtype));
  const spec::ModelStateBytes state = spec::ModelStatePerRank(StateInputs(s, counts, p, device));
  p.parameter_bytes = state.parameters;
  p.gradient_bytes = state.gradients;
  p.optimizer_bytes = state.optimizer;
  spec::ActivationInputs ai;
  ai.shape = Shape(s.model);
  ai.dtype = s.model.dtype;
  ai.tokens = p.tokens_per_rank * p.micro_batch;
  ai.sp = p.sp;
  ai.kv_heads_exchanged = p.kv_heads_exchanged;
  ai.activation_checkpointing = s.memory.activation_checkpointing;
  ai.keep_attention_outputs = s.memory.keep_attention_outputs;
  ai.tiled_mlp = s.memory.tiled_mlp;
  ai.tiled_loss = s.memory.tiled_loss;
  ai.loss_tile_tokens = s.memory.loss_tile_tokens;
  ai.offload_activations = s.parallelism.offload_activations && !host_is_device;
  const spec::ActivationBytes act = spec::ActivationBytesPerRank(ai);
  const double overhead = device != nullptr ? device->transient_overhead : 1.0;
  p.gathered_bytes = state.gathered * overhead;  // allocated and freed per layer
  p.saved_activation_bytes = act.saved * overhead;
  p.working_bytes = act.working * overhead;
  p.host_bytes = state.host_optimizer + act.host;
  p.snapshot_host_bytes =
      spec::SnapshotBytesPerRank(counts, m.dtype, p.world, s.parallelism.zero_stage);
  // The host memory left to a rank's snapshot after what the job keeps there (unknown
  // without a device: the engine then decides from the memory it finds).
  double host_per_rank = 0;
  if (device != nullptr) {
    host_per_rank =
        device->host_memory_per_rank_bytes > 0
            ? device->host_memory_per_rank_bytes - p.host_bytes
            : device->host_memory_bytes / static_cast<double>(p.world) - p.total_bytes();
    host_per_rank = std::max(host_per_rank, 1.0);
  }
  const spec::CheckpointModeChoice mode =
      spec::ChooseCheckpointMode(s.checkpoint.async, p.snapshot_host_bytes, host_per_rank);
  p.checkpoint_async = mode.async;
  p.checkpoint_reason = mode.reason;
  // A save holds in host memory the asynchronous snapshot, or (synchronous) the copies of
  // what the device holds (the parameter chunk, device-resident optimizer state).
  p.steady_host_bytes =
      p.host_bytes + (p.checkpoint_async
                          ? p.snapshot_host_bytes
                          : (host_is_device ? 0 : p.parameter_bytes + p.optimizer_bytes));
}

// Start-up peaks (spec::StartupPerRank): resume, export, and for the first stage init or
// import. On cpu the host is the device: the two add up.
void PlanStartupMemory(const spec::JobSpec& s, const spec::ParameterCounts& counts,
                       const DeviceSpec* device, bool first_stage, StagePlan& p) {
  const bool host_is_device = device != nullptr && device->host_is_device;
  const spec::StartupBytes start = spec::StartupPerRank(StateInputs(s, counts, p, device));
  auto device_side = [&](double device_part, double host_part) {
    return (host_is_device ? device_part + host_part : device_part) + p.runtime_bytes;
  };
  auto host_side = [&](double host_part) { return host_is_device ? 0.0 : host_part; };
  p.resume_bytes = device_side(start.resume_device, start.resume_host);
  p.resume_host_bytes = host_side(start.resume_host);
  p.export_bytes = start.export_host + (host_is_device ? p.runtime_bytes : 0);
  if (first_stage) {
    p.init_is_import = !s.model.init_from.empty();
    p.init_bytes = p.init_is_import ? device_side(start.import_device, start.import_host)
                                    : device_side(start.init_device, start.init_host);
    p.init_host_bytes = host_side(p.init_is_import ? start.import_host : start.init_host);
  }
}

// A step's compute and all-to-all seconds on `device` at its assumed MFU.
void PlanStepTime(const spec::JobSpec& s, const DeviceSpec& device, StagePlan& p) {
  const double tokens = static_cast<double>(p.seq_len) *
                        static_cast<double>(s.optimizer.grad_accum_steps) *
                        static_cast<double>(p.micro_batch);
  p.flops_per_rank = FlopsPerToken(s, p.seq_len) * tokens / static_cast<double>(p.sp);
  // On cpu the ranks share the host's cores.
  const double peak = PeakFlops(device, s.model.dtype) /
                      (device.host_is_device ? static_cast<double>(p.world) : 1.0);
  p.compute_seconds = p.flops_per_rank / (peak * device.mfu);
  // Forward and backward (and the recomputed forward) exchange a2a_bytes per layer,
  // of which (P-1)/P leaves the rank.
  const double passes = s.memory.activation_checkpointing ? 3 : 2;
  const double sent = p.a2a_bytes * static_cast<double>(p.sp - 1) / static_cast<double>(p.sp) *
                      static_cast<double>(s.model.num_hidden_layers) * passes *
                      static_cast<double>(s.optimizer.grad_accum_steps);
  p.a2a_seconds = sent / device.a2a_bytes_per_s;
}

}  // namespace

std::vector<StagePlan> PlanJob(const spec::JobSpec& s, const DeviceSpec* device) {
  const spec::ModelSpec& m = s.model;
  const bool shape_known = m.hidden_size > 0 && m.num_attention_heads > 0 &&
                           m.num_key_value_heads > 0 && m.vocab_size > 0;
  const spec::ParameterCounts counts =
      shape_known ? spec::CountParameters(Shape(m)) : spec::ParameterCounts{};
  std::vector<StagePlan> plans;
  for (size_t i = 0; i < s.stages.size(); ++i) {
    StagePlan p = StageLayout(s, i, device);
    if (shape_known) {
      PlanSteadyMemory(s, counts, device, p);
      PlanStartupMemory(s, counts, device, i == 0, p);
      if (device != nullptr) PlanStepTime(s, *device, p);
    }
    p.fits = device == nullptr ||
             (p.peak_bytes() <= p.device_bytes &&
              (p.host_limit_bytes <= 0 || p.host_peak_bytes() <= p.host_limit_bytes));
    plans.push_back(p);
  }
  return plans;
}

namespace {

using spec::fields::PathOf;

// "spec.memory.tiled_mlp=true": the --set text of a field (path from the field list).
template <class S, class T, class V>
std::string Set(T S::*field, const V& value) {
  return absl::StrCat(PathOf(field), "=", value);
}

// One way to change a spec, with its place in the cost order.
struct Edit {
  int cost = 0;  // position in the cost order (lower is cheaper)
  std::string text;
  std::function<void(spec::JobSpec&)> apply;
};

// The edits that could lower stage `i`'s memory, cheapest first; edits of one kind
// (zero stages, sp values, loss tiles) share a `group` so a combination takes at most one.
struct EditGroup {
  std::vector<Edit> options;
};

std::vector<EditGroup> CandidateEdits(const spec::JobSpec& s, size_t i, const DeviceSpec& dev) {
  std::vector<EditGroup> groups;
  int cost = 0;
  // Micro-batches of one sequence, accumulated: the same global batch and the same math
  // (docs/DATA.md), activations for one sequence at a time.
  if (s.optimizer.micro_batch_size > 1) {
    const int64_t accum = s.optimizer.grad_accum_steps * s.optimizer.micro_batch_size;
    groups.push_back({{{cost,
                        absl::StrCat(PathOf(&spec::OptimizerSpec::micro_batch_size), "=1 --set ",
                                     PathOf(&spec::OptimizerSpec::grad_accum_steps), "=", accum),
                        [accum](spec::JobSpec& j) {
                          j.optimizer.micro_batch_size = 1;
                          j.optimizer.grad_accum_steps = accum;
                        }}}});
  }
  if (!s.memory.activation_checkpointing) {
    groups.push_back({{{cost, Set(&spec::MemorySpec::activation_checkpointing, "true"),
                        [](spec::JobSpec& j) { j.memory.activation_checkpointing = true; }}}});
  }
  // Kept attention outputs trade memory for the attention forward's recompute: giving them up
  // costs as little as checkpointing does.
  if (s.memory.keep_attention_outputs) {
    groups.push_back({{{cost, Set(&spec::MemorySpec::keep_attention_outputs, "false"),
                        [](spec::JobSpec& j) { j.memory.keep_attention_outputs = false; }}}});
  }
  ++cost;
  if (!s.memory.tiled_mlp) {
    groups.push_back({{{cost, Set(&spec::MemorySpec::tiled_mlp, "true"),
                        [](spec::JobSpec& j) { j.memory.tiled_mlp = true; }}}});
  }
  ++cost;
  {
    EditGroup loss;
    if (!s.memory.tiled_loss) {
      const int64_t tile = std::min<int64_t>(s.memory.loss_tile_tokens, 4096);
      loss.options.push_back(
          {cost, Set(&spec::MemorySpec::tiled_loss, "true"), [tile](spec::JobSpec& j) {
             j.memory.tiled_loss = true;
             j.memory.loss_tile_tokens = tile;
           }});
    } else {
      for (int64_t tile = s.memory.loss_tile_tokens / 2; tile >= 1024; tile /= 2) {
        loss.options.push_back({cost, Set(&spec::MemorySpec::loss_tile_tokens, tile),
                                [tile](spec::JobSpec& j) { j.memory.loss_tile_tokens = tile; }});
      }
    }
    if (!loss.options.empty()) groups.push_back(loss);
  }
  ++cost;
  {
    EditGroup zero;
    for (int64_t z = s.parallelism.zero_stage + 1; z <= 3; ++z) {
      zero.options.push_back({cost, Set(&spec::ParallelismSpec::zero_stage, z),
                              [z](spec::JobSpec& j) { j.parallelism.zero_stage = z; }});
    }
    if (!zero.options.empty()) groups.push_back(zero);
  }
  ++cost;
  // Offload only moves bytes off a GPU; on cpu the host is the device.
  if (!dev.host_is_device && !s.parallelism.offload_optimizer) {
    groups.push_back({{{cost, Set(&spec::ParallelismSpec::offload_optimizer, "true"),
                        [](spec::JobSpec& j) { j.parallelism.offload_optimizer = true; }}}});
  }
  ++cost;
  if (!dev.host_is_device && !s.parallelism.offload_activations) {
    groups.push_back({{{cost, Set(&spec::ParallelismSpec::offload_activations, "true"),
                        [](spec::JobSpec& j) { j.parallelism.offload_activations = true; }}}});
  }
  ++cost;
  {
    EditGroup sp;
    const int64_t hq = s.model.num_attention_heads, hkv = s.model.num_key_value_heads;
    for (int64_t p = s.StageSp(i) + 1; p <= hq; ++p) {
      if (!spec::CheckUlyssesHeads(hq, hkv, p).ok()) continue;
      sp.options.push_back({cost, absl::StrCat(PathOf(&spec::StageSpec::sp_degree, i), "=", p),
                            [i, p](spec::JobSpec& j) { j.stages[i].sp_degree = p; }});
    }
    if (!sp.options.empty()) groups.push_back(sp);
  }
  return groups;
}

}  // namespace

double StageGpuHours(const StagePlan& p) {
  return static_cast<double>(p.world) * static_cast<double>(p.steps) * p.step_seconds() / 3600;
}

std::vector<FitFix> FindFixes(const spec::JobSpec& s, size_t stage, const DeviceSpec& device,
                              size_t max) {
  const std::vector<EditGroup> groups = CandidateEdits(s, stage, device);
  // Every combination of at most one option per group (an odometer over -1..options-1 per
  // group, -1: group not used) that fits and validates.
  struct Found {
    std::vector<int> pick;
    std::tuple<size_t, int, int, int> key;  // edits, most expensive edit, sum of costs, options
    FitFix fix;
  };
  std::vector<Found> found;
  std::set<std::vector<int>> fitting;
  std::vector<int> pick(groups.size(), -1);
  while (true) {
    std::vector<const Edit*> edits;
    int max_cost = -1, sum_cost = 0, option_sum = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (pick[g] < 0) continue;
      const Edit& e = groups[g].options[pick[g]];
      edits.push_back(&e);
      max_cost = std::max(max_cost, e.cost);
      sum_cost += e.cost;
      option_sum += pick[g];
    }
    if (!edits.empty()) {
      spec::JobSpec trial = s;
      for (const Edit* e : edits) e->apply(trial);
      const StagePlan plan = PlanJob(trial, &device)[stage];
      // A fix the validator would refuse (zero_stage 3 without checkpointing, an sp that does
      // not divide seq_len, ...) is no fix.
      if (plan.fits && spec::ValidateJobSpec(trial).ok()) {
        Found f;
        f.pick = pick;
        f.key = {edits.size(), max_cost, sum_cost, option_sum};
        f.fix.found = true;
        for (const Edit* e : edits) f.fix.changes.push_back(e->text);
        f.fix.fixed = std::move(trial);
        f.fix.plan = plan;
        f.fix.gpu_hours = StageGpuHours(plan);
        fitting.insert(pick);
        found.push_back(std::move(f));
      }
    }
    size_t g = 0;
    for (; g < groups.size(); ++g) {
      if (++pick[g] < static_cast<int>(groups[g].options.size())) break;
      pick[g] = -1;
    }
    if (g == groups.size()) break;
  }
  // Minimal: no edit of it can be left out (the combination without it does not fit or is
  // refused).
  std::vector<const Found*> minimal;
  for (const Found& f : found) {
    bool reducible = false;
    for (size_t g = 0; g < f.pick.size() && !reducible; ++g) {
      if (f.pick[g] < 0) continue;
      std::vector<int> fewer = f.pick;
      fewer[g] = -1;
      reducible = fitting.count(fewer) > 0;
    }
    if (!reducible) minimal.push_back(&f);
  }
  auto cheaper = [](const Found* a, const Found* b) {
    const double ha = a->fix.gpu_hours, hb = b->fix.gpu_hours;
    if (std::abs(ha - hb) > 1e-9 * std::max(ha, hb)) return ha < hb;
    if (a->fix.plan.world != b->fix.plan.world) return a->fix.plan.world < b->fix.plan.world;
    return a->key < b->key;
  };
  std::sort(minimal.begin(), minimal.end(), cheaper);
  std::vector<FitFix> fixes;
  for (size_t i = 0; i < minimal.size() && i < max; ++i) fixes.push_back(minimal[i]->fix);
  return fixes;
}

FitFix FindFix(const spec::JobSpec& s, size_t stage, const DeviceSpec& device) {
  std::vector<FitFix> fixes = FindFixes(s, stage, device, 1);
  return fixes.empty() ? FitFix{} : std::move(fixes.front());
}

JobTotals TotalsOf(const spec::JobSpec& s, const std::vector<StagePlan>& plans,
                   const DeviceSpec& device) {
  JobTotals t;
  t.stages = static_cast<int64_t>(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    const StagePlan& p = plans[i];
    t.seconds += static_cast<double>(p.steps) * p.step_seconds();
    t.gpu_hours += StageGpuHours(p);
    t.nodes = std::max(t.nodes, p.nodes);
    t.max_world = std::max(t.max_world, p.world);
    const double per_node =
        device.host_is_device
            ? p.peak_bytes() * static_cast<double>(p.world)
            : p.host_peak_bytes() * static_cast<double>(std::min(
                                        p.world, std::max<int64_t>(1, device.devices_per_node)));
    t.host_peak_per_node_bytes = std::max(t.host_peak_per_node_bytes, per_node);
    if (!p.fits) t.not_fitting.push_back(i);
  }
  const spec::ModelSpec& m = s.model;
  if (m.hidden_size > 0 && m.num_attention_heads > 0 && m.num_key_value_heads > 0 &&
      m.vocab_size > 0) {
    t.checkpoint_bytes = spec::CheckpointStateBytes(spec::CountParameters(Shape(m)), m.dtype);
  }
  t.keep_last = std::max<int64_t>(1, s.checkpoint.keep_last);
  t.checkpoint_disk_bytes = t.checkpoint_bytes * static_cast<double>(t.keep_last + 1);
  return t;
}

absl::Status SetHostMemory(const std::string& text, DeviceSpec* d) {
  absl::StatusOr<double> bytes = ParseByteSize(text, "--host-memory");
  if (!bytes.ok()) return bytes.status();
  if (d->host_is_device) {
    if (d->memory_is_host_total) d->memory_bytes = *bytes;
    d->host_memory_bytes = *bytes;
    if (d->memory_bytes <= d->reserve_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("--host-memory: ", FormatBytes(*bytes),
                                                     " is not more than the cpu "
                                                     "process baseline of ",
                                                     FormatBytes(d->reserve_bytes)));
    }
  } else {
    d->host_memory_per_rank_bytes = *bytes / static_cast<double>(d->devices_per_node);
  }
  return absl::OkStatus();
}

NodeReason ExplainNodes(const spec::JobSpec& s, size_t stage, const DeviceSpec& device) {
  NodeReason r;
  const StagePlan p = PlanJob(s, &device)[stage];
  r.nodes = p.nodes;
  if (p.nodes <= 1) return r;
  const int64_t per_node = device.devices_per_node;
  const std::string have = absl::StrCat(p.nodes, " nodes of ", per_node, " ", device.type,
                                        " (world ", p.world, " = sp ", p.sp, " x dp ", p.dp, ")");
  // One node fewer: the largest world that fits it, keeping sp (fewer DP replicas) when possible,
  // else keeping dp (a smaller SP group).
  const int64_t fewer = (p.nodes - 1) * per_node;
  spec::JobSpec trial = s;
  int64_t sp = p.sp, dp = p.dp;
  if (p.sp <= fewer) {
    dp = fewer / p.sp;
  } else {
    dp = 1;
    sp = 0;
    for (int64_t c = fewer; c >= 1; --c) {
      if (spec::CheckUlyssesHeads(s.model.num_attention_heads, s.model.num_key_value_heads, c)
              .ok() &&
          p.seq_len % c == 0) {
        sp = c;
        break;
      }
    }
  }
  if (sp < 1 || dp < 1) {
    r.text = absl::StrCat(have, ": no layout of ", fewer, " ranks is possible");
    return r;
  }
  trial.stages[stage].sp_degree = sp;
  trial.stages[stage].dp_degree = dp;
  const StagePlan q = PlanJob(trial, &device)[stage];
  r.fewer_fits = q.fits;
  const bool device_short = q.peak_bytes() > q.device_bytes;
  r.text = absl::StrCat(
      have, ": on ", p.nodes - 1, p.nodes - 1 == 1 ? " node" : " nodes", " (sp ", sp, " x dp ", dp,
      ") a rank would need ",
      device_short
          ? absl::StrCat(FormatBytes(q.peak_bytes()), " (", q.peak_phase(), ") of the ",
                         FormatBytes(q.device_bytes), " of one ", device.type)
          : absl::StrCat(FormatBytes(q.host_peak_bytes()), " of host memory (", q.host_peak_phase(),
                         ") of the ", FormatBytes(q.host_limit_bytes), " per GPU of a node"),
      q.fits ? " (it fits: the stage could use fewer nodes)" : ": it does not fit");
  return r;
}

absl::Status CheckFits(const spec::JobSpec& s, const DeviceSpec& device) {
  const std::vector<StagePlan> plans = PlanJob(s, &device);
  std::vector<std::string> lines;
  for (size_t i = 0; i < plans.size(); ++i) {
    const StagePlan& p = plans[i];
    if (p.fits) continue;
    const FitFix fix = FindFix(s, i, device);
    const bool host_short = p.peak_bytes() <= p.device_bytes;
    lines.push_back(absl::StrCat(
        PathOf(&spec::JobSpec::stages), "[", i, "]: seq_len ", p.seq_len, " at sp ", p.sp,
        " needs ",
        host_short
            ? absl::StrCat(FormatBytes(p.host_peak_bytes()), " of host memory per rank (",
                           p.host_peak_phase(), "), more than the ",
                           FormatBytes(p.host_limit_bytes), " per ", device.type, " of a node (")
            : absl::StrCat(FormatBytes(p.peak_bytes()), " per rank at ", p.peak_phase(),
                           " (steady ", FormatBytes(p.total_bytes()), ": model state ",
                           FormatBytes(p.model_state_bytes()), ", activations ",
                           FormatBytes(p.activation_bytes()), ", runtime ",
                           FormatBytes(p.runtime_bytes), "; init ", FormatBytes(p.init_bytes),
                           ", resume ", FormatBytes(p.resume_bytes), "), more than the ",
                           FormatBytes(p.device_bytes), " of one ", device.type, " rank ("),
        fix.found ? absl::StrCat("fix: --set ", absl::StrJoin(fix.changes, " --set "), " needs ",
                                 FormatBytes(fix.plan.peak_bytes()))
                  : "no change of memory options or sp_degree makes it fit: use more memory",
        "; or --force to skip this check)"));
  }
  if (lines.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrJoin(lines, "\n"));
}

absl::StatusOr<MaxSeqResult> MaxSequence(const spec::JobSpec& s, const DeviceSpec& device,
                                         int64_t gpus) {
  if (gpus < 1 || gpus > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-seq: ", gpus, " GPUs is outside [1, 4096] (use e.g. --max-seq 8)"));
  }
  const int64_t heads = s.model.num_attention_heads;
  if (heads > 0 && (gpus > heads || heads % gpus != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-seq: sp ", gpus, " must divide the model's ", heads,
        " attention heads (Ulysses splits heads over the sp ranks; use a divisor of ", heads, ")"));
  }
  spec::JobSpec trial = s;
  trial.stages.resize(1);
  trial.stages[0].steps = std::max<int64_t>(1, trial.stages[0].steps);
  trial.stages[0].sp_degree = gpus;
  trial.stages[0].dp_degree = 1;
  trial.parallelism.sp_degree = gpus;
  trial.parallelism.dp_degree = 1;
  trial.optimizer.micro_batch_size = 1;
  const int64_t unit = 1024 * gpus;
  auto plan_at = [&](int64_t n) {
    trial.stages[0].seq_len = n;
    return PlanJob(trial, &device)[0];
  };
  MaxSeqResult r;
  r.gpus = gpus;
  constexpr int64_t kLimitUnits = int64_t{1} << 16;  // 64M tokens per GPU
  int64_t good = 0, bad = 0;
  for (int64_t k = 1; k <= kLimitUnits; k *= 2) {
    StagePlan p = plan_at(k * unit);
    if (!p.fits) {
      bad = k;
      r.over = p;
      break;
    }
    good = k;
    r.at_max = p;
  }
  if (bad == 0) {
    r.max_seq_len = good * unit;
    r.limit = "none below 64M tokens per GPU";
    return r;
  }
  while (bad - good > 1) {
    const int64_t mid = (good + bad) / 2;
    StagePlan p = plan_at(mid * unit);
    if (p.fits) {
      good = mid;
      r.at_max = p;
    } else {
      bad = mid;
      r.over = p;
    }
  }
  r.max_seq_len = good * unit;
  const StagePlan& o = r.over;
  if (o.host_limit_bytes > 0 && o.host_peak_bytes() > o.host_limit_bytes) {
    r.limit =
        absl::StrCat("host memory: ", o.host_peak_phase(), " ",
                     absl::StrFormat("%.1f GiB", o.host_peak_bytes() / (1 << 30)), " of ",
                     absl::StrFormat("%.1f GiB", o.host_limit_bytes / (1 << 30)), " per rank");
    return r;
  }
  const std::vector<std::pair<std::string, double>> terms = {
      {"params", o.parameter_bytes},
      {"grads", o.gradient_bytes},
      {"optimizer", o.optimizer_bytes},
      {"gathered", o.gathered_bytes},
      {"act_saved", o.saved_activation_bytes},
      {"act_peak", o.working_bytes},
      {"runtime", o.runtime_bytes}};
  const auto largest = std::max_element(
      terms.begin(), terms.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  r.limit =
      absl::StrCat("device memory at ", o.seq_len, ": peak (", o.peak_phase(), ") ",
                   absl::StrFormat("%.1f GiB", o.peak_bytes() / (1 << 30)), " > ",
                   absl::StrFormat("%.1f GiB", o.device_bytes / (1 << 30)), "; largest term ",
                   largest->first, " ", absl::StrFormat("%.1f GiB", largest->second / (1 << 30)));
  return r;
}

}  // namespace ulysses::client
