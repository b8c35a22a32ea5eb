// Per-rank model-state bytes under ZeRO stages 0-3, measured on real Gloo ranks, against the
// formula the planner uses (common/spec/memory_model.h, ModelStatePerRank).
//
// Measured = the storage bytes of the model state one rank holds: module parameters (full or
// gathered), their .grad and the trainer's fp32 accumulators, the ZeRO chunks, host copies and
// gradient chunks (zero.h Residency), and the AdamW moments/masters. "rest" is after an optimizer
// step; "peak" is the maximum over the step, sampled after every gather and before every gradient
// reduction (ZeroSharding::SetObserver) and after the step.
//
//   zero_memory [--world 4] [--stage 3] [--steps 2] [--seq 64] [--dtype float32]
// Prints one table row (rank 0). Spawns `world` copies of itself (env ULYSSES_BENCH_RANK...).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/spawn_ranks.h"
#include "common/spec/memory_model.h"
#include "worker/engine/data/batches.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/parallelize.h"
#include "worker/engine/parallel/rendezvous_port.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/train_step.h"
#include "worker/engine/train/zero.h"

namespace {

using namespace ulysses::engine;         // NOLINT: a benchmark main
using namespace ulysses::engine::train;  // NOLINT

// A small shape where the outer parameters do not dominate: 4 layers of hidden 128.
ulysses::spec::ModelShape Shape() {
  ulysses::spec::ModelShape c;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  return c;
}

int64_t Bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

int RunRank(int rank, int world, int port, const std::map<std::string, std::string>& a) {
  const int stage = std::stoi(a.at("--stage"));
  const int64_t seq = std::stoll(a.at("--seq"));
  CommConfig config;
  config.rank = rank;
  config.world_size = world;
  config.sp_size = world;
  config.master_port = port;
  auto groups = CreateProcessGroups(config);
  if (!groups.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, groups.status().ToString().c_str());
    return 1;
  }
  auto dtype = ulysses::engine::model::ParseDtype(a.at("--dtype"));
  if (!dtype.ok()) return 2;
  model::MemoryOptions mem;
  mem.activation_checkpointing = true;
  auto m = BuildModel(Shape(), mem, 1, torch::kCPU, *dtype);
  if (!m.ok()) return 1;
  AdamW adam(AdamWConfig{});
  std::unique_ptr<ZeroSharding> zero;
  if (stage > 0) {
    ZeroOptions zo;
    zo.stage = stage;
    zo.activation_checkpointing = true;
    auto z = ZeroSharding::Create(*m, groups->world.get(), &adam, zo, torch::kCPU);
    if (!z.ok()) {
      std::fprintf(stderr, "%s\n", z.status().ToString().c_str());
      return 1;
    }
    zero = std::move(*z);
  }
  AttentionOptions ao;
  ao.block_size = 64;
  Trainer trainer(*m, UlyssesAttentionFn(groups->sp.get(), ao), groups->world.get(), &adam, 1.0,
                  torch::kCPU, zero.get());
  model::LlamaForCausalLM model = *m;
  auto measure = [&] {
    int64_t total = trainer.accumulator_bytes();
    for (auto& [name, p] : Params(model)) total += Bytes(p) + Bytes(p.grad());
    for (auto& [name, t] : adam.StateTensors()) total += Bytes(t);
    if (zero) {
      ModelStateResidency r = zero->Residency();
      total += r.parameters + r.gradients + r.optimizer;
    }
    return total;
  };
  int64_t peak = 0;
  if (zero) zero->SetObserver([&] { peak = std::max(peak, measure()); });
  auto data = OpenSynthetic("random", Split::kTrain, Shape().vocab_size, 1, 1);
  if (!data.ok()) return 1;
  BatchLayout layout;
  layout.seq_len = seq;
  layout.sp = world;
  layout.sp_rank = rank;
  int64_t rest = 0;
  for (int step = 0; step < std::stoi(a.at("--steps")); ++step) {
    auto batches = StepMicroBatches(**data, layout, step);
    if (!batches.ok()) return 1;
    auto stats = trainer.Step(*batches, 1e-3, step);
    if (!stats.ok()) {
      std::fprintf(stderr, "%s\n", stats.status().ToString().c_str());
      return 1;
    }
    rest = measure();
    peak = std::max(peak, rest);
  }
  if (rank == 0) {
    ulysses::spec::ModelStateInputs in;
    in.params = ulysses::spec::CountParameters(Shape());
    in.dtype = a.at("--dtype");
    in.zero_stage = stage;
    in.world = world;
    in.activation_checkpointing = true;
    const ulysses::spec::ModelStateBytes f = ulysses::spec::ModelStatePerRank(in);
    const double f_rest = f.parameters + f.gradients + f.optimizer;
    const double mb = 1e6;
    std::printf("| %d | %d | %s | %.3f | %.3f | %+.1f%% | %.3f | %.3f | %+.1f%% |\n", stage, world,
                a.at("--dtype").c_str(), rest / mb, f_rest / mb, 100.0 * (rest - f_rest) / f_rest,
                peak / mb, f.DeviceTotal() / mb,
                100.0 * (peak - f.DeviceTotal()) / f.DeviceTotal());
  }
  return groups->world->Barrier().ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a = {{"--world", "4"},
                                          {"--stage", "3"},
                                          {"--steps", "2"},
                                          {"--seq", "64"},
                                          {"--dtype", "float32"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!a.count(argv[i])) {
      std::fprintf(stderr, "unknown flag %s (flags: --world --stage --steps --seq --dtype)\n",
                   argv[i]);
      return 2;
    }
    a[argv[i]] = argv[i + 1];
  }
  const int world = std::stoi(a["--world"]);
  if (const char* r = std::getenv("ULYSSES_BENCH_RANK")) {
    return RunRank(std::atoi(r), world, std::atoi(std::getenv("ULYSSES_BENCH_PORT")), a);
  }
  if (world < 1 || std::stoll(a["--seq"]) % world != 0 || Shape().num_attention_heads % world) {
    std::fprintf(stderr, "bad setup: --world must divide --seq and the 4 heads\n");
    return 2;
  }
  absl::StatusOr<int> port = PickRendezvousPort();
  if (!port.ok()) return 1;
  return ulysses::bench::SpawnSelfAsRanks(world, *port, argv);
}
