// Training-step throughput, MFU and peak memory of the Ulysses engine (one rank, one device), and
// the longest sequence a model shape trains at. The same Trainer step ulysses-train runs: random
// token ids, bf16 (or any dtype) parameters with fp32 masters, AdamW, the spec's memory options.
//
//   engine_bench --device cuda:0 --shape llama3-1b|llama3-8b|tiny (spec presets) --dtype bfloat16
//       --seq 8192,32768,131072
//       [--steps 3] [--warmup 1] [--ac] [--tiled-mlp] [--tiled-loss] [--loss-tile 8192]
//       [--offload-activations] [--fuse-gate-up] [--no-fused-rms-norm] [--keep-attention]
//       [--max-seq START] [--max-seq-limit N] [--max-seq-step-budget SECONDS]
//       [--profile-seq 32768 --profile-trace FILE]
//
// Prints one JSON object per line: {"kind":"step", seq_len, tokens_per_s, mfu, step_seconds,
// peak_allocated_bytes, ...} per --seq length; {"kind":"fit", seq_len, fits} per --max-seq trial
// and {"kind":"max_seq", ...} at the end; {"kind":"profile", trace} when profiling. A step line's
// attention_forwards_per_step counts the attention forward kernels a timed step ran: layers with
// no checkpointing or with --keep-attention (kept outputs replayed), twice that with --ac alone.
// MFU = step FLOPs / (step seconds x peak), step FLOPs = tokens x spec::ModelFlopsPerToken
// (common/spec/model_math.h: 6 N + 6 L d s, N the layers' parameters plus the lm_head matmul;
// recomputation not counted; the convention of the engine's progress line, the
// ulysses_rank_mfu_ratio metric, ulyssesctl plan and hf_bench.py), peak = --peak-tflops (989 for
// an H100 SXM's dense bf16).
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/spec/model_math.h"
#include "common/spec/model_shape.h"
#include "worker/engine/attention/attention.h"
#include "worker/engine/attention/kept_attention.h"
#include "worker/engine/parallel/parallelize.h"
#include "worker/engine/torch_compat.h"
#include "worker/engine/train/device_memory.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/train_step.h"

#if defined(ULYSSES_TORCH_CUDA) && ULYSSES_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/autograd/profiler_kineto.h>
#define ULYSSES_BENCH_PROFILER 1
#endif

namespace ulysses::engine::train {
namespace {

using json = nlohmann::json;

struct Args {
  std::string device = "cuda:0";
  std::string shape = "llama3.2-1b";
  std::string dtype = "bfloat16";
  std::vector<int64_t> seqs;
  int steps = 3, warmup = 1;
  bool ac = false, tiled_mlp = false, tiled_loss = false;
  bool offload_activations = false, fuse_gate_up = false, fused_rms_norm = true;
  bool keep_attention = false;
  int64_t loss_tile = 8192, mlp_tile = 0;
  int64_t max_seq = 0, max_seq_limit = 4 << 20;
  double max_seq_step_budget = 120;
  int64_t profile_seq = 0;
  std::string profile_trace;
  double peak_tflops = 989;
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "engine_bench: " << why << "\n(see the header of bench/gpu/engine_bench.cc)\n";
  std::exit(2);
}

int64_t ParseInt(const std::string& flag, const std::string& v) {
  int64_t x = 0;
  if (!absl::SimpleAtoi(v, &x)) Usage(flag + ": '" + v + "' is not an integer");
  return x;
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(f + " needs a value");
      return argv[++i];
    };
    if (f == "--device")
      a.device = value();
    else if (f == "--shape")
      a.shape = value();
    else if (f == "--dtype")
      a.dtype = value();
    else if (f == "--seq") {
      for (auto p : absl::StrSplit(value(), ',')) a.seqs.push_back(ParseInt(f, std::string(p)));
    } else if (f == "--steps")
      a.steps = static_cast<int>(ParseInt(f, value()));
    else if (f == "--warmup")
      a.warmup = static_cast<int>(ParseInt(f, value()));
    else if (f == "--ac")
      a.ac = true;
    else if (f == "--tiled-mlp")
      a.tiled_mlp = true;
    else if (f == "--tiled-loss")
      a.tiled_loss = true;
    else if (f == "--offload-activations")
      a.offload_activations = true;
    else if (f == "--fuse-gate-up")
      a.fuse_gate_up = true;
    else if (f == "--fused-rms-norm")  // the default (MemoryOptions)
      a.fused_rms_norm = true;
    else if (f == "--no-fused-rms-norm")
      a.fused_rms_norm = false;
    else if (f == "--keep-attention")  // MemoryOptions::keep_attention_outputs (needs --ac)
      a.keep_attention = true;
    else if (f == "--loss-tile")
      a.loss_tile = ParseInt(f, value());
    else if (f == "--mlp-tile")
      a.mlp_tile = ParseInt(f, value());
    else if (f == "--max-seq")
      a.max_seq = ParseInt(f, value());
    else if (f == "--max-seq-limit")
      a.max_seq_limit = ParseInt(f, value());
    else if (f == "--max-seq-step-budget")
      a.max_seq_step_budget = ParseInt(f, value());
    else if (f == "--profile-seq")
      a.profile_seq = ParseInt(f, value());
    else if (f == "--profile-trace")
      a.profile_trace = value();
    else if (f == "--peak-tflops")
      a.peak_tflops = static_cast<double>(ParseInt(f, value()));
    else
      Usage("unknown flag " + f);
  }
  if (a.keep_attention && !a.ac) Usage("--keep-attention needs --ac");
  return a;
}

// --shape: a spec.model preset (common/spec/model_shape.h), or the Hugging Face names the
// GPU runs have used for the two Llama presets.
model::LlamaConfig Shape(const std::string& name) {
  spec::ModelSpec m;
  m.preset = name == "llama3.2-1b" ? "llama3-1b" : name == "llama3.1-8b" ? "llama3-8b" : name;
  const absl::Status s = spec::ApplyModelPreset(m);
  if (!s.ok()) Usage("--shape: " + std::string(s.message()) + " (or llama3.2-1b, llama3.1-8b)");
  return static_cast<const model::LlamaConfig&>(m);
}

void Sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

class Bench {
 public:
  explicit Bench(const Args& a) : args_(a), config_(Shape(a.shape)) {
    ParallelConfig pc;
    pc.device = a.device;
    rt_ = Unwrap(Parallelize(pc));
    model::MemoryOptions mem;
    mem.activation_checkpointing = a.ac;
    mem.tiled_mlp = a.tiled_mlp;
    mem.mlp_tile_tokens = a.mlp_tile;
    mem.tiled_loss = a.tiled_loss;
    mem.offload_activations = a.offload_activations;
    mem.fuse_gate_up = a.fuse_gate_up;
    mem.fused_rms_norm = a.fused_rms_norm;
    mem.keep_attention_outputs = a.keep_attention;
    mem.loss_tile_tokens = a.loss_tile;
    const torch::Dtype dtype = Unwrap(model::ParseDtype(a.dtype));
    model_ = Unwrap(BuildModel(config_, mem, 1234, rt_.device, dtype));
    attention_ = UlyssesAttentionFn(rt_.groups.sp.get(), AttentionOptions{});
    adam_ = std::make_unique<AdamW>(AdamWConfig{});
    trainer_ = std::make_unique<Trainer>(model_, attention_, rt_.groups.world.get(), adam_.get(),
                                         1.0, rt_.device);
  }

  // One optimizer step on random tokens of length s; returns seconds, or a negative value when
  // the step ran out of device memory.
  double Step(int64_t s, int64_t step) {
    torch::Tensor ids = torch::randint(config_.vocab_size, {1, s + 1}, torch::kLong);
    LocalShard shard;
    shard.input_ids = ids.narrow(1, 0, s);       // [1, s]
    shard.labels = ids.narrow(1, 1, s).clone();  // [1, s]
    shard.position_ids = torch::arange(s, torch::kLong);
    Sync(rt_.device);
    auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<StepStats> st = trainer_->Step({shard}, 1e-5, step);
    Sync(rt_.device);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok()) {
      if (st.status().code() == absl::StatusCode::kResourceExhausted) {
        EmptyDeviceCache(rt_.device);
        return -1;
      }
      std::cerr << "engine_bench: step failed: " << st.status() << "\n";
      std::exit(1);
    }
    return secs;
  }

  double StepFlops(int64_t s) const {
    return static_cast<double>(s) * spec::ModelFlopsPerToken(config_, s);  // model_math.h
  }

  json Common(int64_t s) const {
    return json{{"seq_len", s},
                {"shape", args_.shape},
                {"dtype", args_.dtype},
                {"device", args_.device},
                {"activation_checkpointing", args_.ac},
                {"tiled_mlp", args_.tiled_mlp},
                {"tiled_loss", args_.tiled_loss},
                {"offload_activations", args_.offload_activations},
                {"fuse_gate_up", args_.fuse_gate_up},
                {"fused_rms_norm", args_.fused_rms_norm},
                {"keep_attention_outputs", args_.keep_attention},
                {"sdpa_backend", Backend()}};
  }

  std::string Backend() const {
    auto opts = torch::TensorOptions().device(rt_.device).dtype(model_->HeadWeight().dtype());
    const int64_t d = config_.HeadDim();
    torch::Tensor q = torch::zeros({1, 128, config_.num_attention_heads, d}, opts);
    torch::Tensor k = torch::zeros({1, 128, config_.num_key_value_heads, d}, opts);
    return SdpaBackendFor(q, k, k);
  }

  // Throughput at s: warmup steps, then the mean of `steps` timed steps.
  json Measure(int64_t s) {
    ResetPeakDeviceMemory(rt_.device);
    for (int i = 0; i < args_.warmup; ++i) {
      if (Step(s, i) < 0) return Oom(s);
    }
    double total = 0;
    const int64_t forwards_before = CausalAttentionForwardRuns();
    for (int i = 0; i < args_.steps; ++i) {
      const double t = Step(s, args_.warmup + i);
      if (t < 0) return Oom(s);
      total += t;
    }
    const double secs = total / args_.steps;
    DeviceMemory mem = ReadDeviceMemory(rt_.device);
    json j = Common(s);
    j["kind"] = "step";
    j["fits"] = true;
    j["step_seconds"] = secs;
    j["tokens_per_s"] = s / secs;
    j["tflops"] = StepFlops(s) / secs / 1e12;
    const std::optional<double> mfu = spec::Mfu(spec::ModelFlopsPerToken(config_, s), s / secs,
                                                /*devices=*/1, args_.peak_tflops * 1e12);
    j["mfu"] = mfu ? json(*mfu) : json(nullptr);
    j["peak_allocated_bytes"] = mem.peak_allocated;
    j["peak_reserved_bytes"] = mem.peak_reserved;
    j["attention_forwards_per_step"] =
        static_cast<double>(CausalAttentionForwardRuns() - forwards_before) / args_.steps;
    return j;
  }

  json Oom(int64_t s) {
    json j = Common(s);
    j["kind"] = "step";
    j["fits"] = false;
    return j;
  }

  // Doubling from `start`, then bisecting to 1/16 of the last bracket; a length fits when one
  // full training step completes. Stops doubling when the next step would exceed the budget.
  json MaxSeq() {
    int64_t good = 0, bad = 0, s = args_.max_seq;
    double last_secs = 0;
    bool budget_stop = false;
    auto trial = [&](int64_t len) {
      ResetPeakDeviceMemory(rt_.device);
      const double t = Step(len, 0);
      json j = Common(len);
      j["kind"] = "fit";
      j["fits"] = t >= 0;
      if (t >= 0) {
        j["step_seconds"] = t;
        j["peak_allocated_bytes"] = ReadDeviceMemory(rt_.device).peak_allocated;
      }
      std::cout << j.dump() << std::endl;
      return t;
    };
    while (s <= args_.max_seq_limit) {
      const double t = trial(s);
      if (t < 0) {
        bad = s;
        break;
      }
      good = s;
      last_secs = t;
      // Attention dominates at length: a doubled step costs up to 4x.
      if (last_secs * 4 > args_.max_seq_step_budget) {
        budget_stop = true;
        break;
      }
      s *= 2;
    }
    const int64_t granularity = 1024;
    while (bad > 0 && good > 0 && bad - good > std::max<int64_t>(granularity, good / 16)) {
      const int64_t mid = (good + bad) / 2 / granularity * granularity;
      if (mid <= good) break;
      if (trial(mid) < 0) {
        bad = mid;
      } else {
        good = mid;
      }
    }
    json j = Common(good);
    j["kind"] = "max_seq";
    j["max_seq_len"] = good;
    j["first_oom_seq_len"] = bad;
    j["stopped_by_time_budget"] = budget_stop;
    return j;
  }

  json Profile(int64_t s, const std::string& trace) {
#ifdef ULYSSES_BENCH_PROFILER
    namespace prof = torch::autograd::profiler;
    Step(s, 0);  // warm up outside the trace
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    const std::set<prof::ActivityType> activities = {prof::ActivityType::CPU,
                                                     prof::ActivityType::CUDA};
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    const double secs = Step(s, 1);
    auto result = prof::disableProfiler();
    result->save(trace);
    json j = Common(s);
    j["kind"] = "profile";
    j["trace"] = trace;
    j["step_seconds"] = secs;
    return j;
#else
    json j = Common(s);
    j["kind"] = "profile";
    j["error"] = "profiling needs a CUDA libtorch >= 2.0";
    return j;
#endif
  }

 private:
  template <typename T>
  static T Unwrap(absl::StatusOr<T> v) {
    if (!v.ok()) {
      std::cerr << "engine_bench: " << v.status() << "\n";
      std::exit(2);
    }
    return std::move(v).value();
  }

  Args args_;
  model::LlamaConfig config_;
  ParallelRuntime rt_;
  model::LlamaForCausalLM model_{nullptr};
  AttentionCallback attention_;
  std::unique_ptr<AdamW> adam_;
  std::unique_ptr<Trainer> trainer_;
};

int Main(int argc, char** argv) {
  ConfigureCudaAllocator();  // As ulysses-train: expandable segments on libtorch >= 2.1.
  Args a = ParseArgs(argc, argv);
  Bench bench(a);
  for (int64_t s : a.seqs) std::cout << bench.Measure(s).dump() << std::endl;
  if (a.max_seq > 0) std::cout << bench.MaxSeq().dump() << std::endl;
  if (a.profile_seq > 0) {
    std::cout << bench
                     .Profile(a.profile_seq,
                              a.profile_trace.empty() ? "trace.json" : a.profile_trace)
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace ulysses::engine::train

int main(int argc, char** argv) { return ulysses::engine::train::Main(argc, argv); }
