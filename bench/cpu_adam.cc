// CPU AdamW throughput: parameters updated per second (and per core) by the engine's CPU kernel
// (worker/engine/train/cpu_adamw.h, what offload_optimizer runs on the host) against the
// alternatives on the same machine and the same tensors:
//
//   ulysses            AdamW with fast_cpu (the kernel), fp32 parameters
//   ulysses-bf16       the same with bf16 parameters: fp32 masters updated, bf16 written back
//                      (the offloaded mixed-precision case; fp32 gradient chunks)
//   ulysses-reference  AdamW with fast_cpu = false: the per-tensor loop of seven tensor ops
//   torch-optim        torch::optim::AdamW (libtorch's C++ optimizer: a per-parameter loop)
//   torch-foreach      the op sequence of torch.optim.AdamW(foreach=True), written with the same
//                      at::_foreach_* ops in C++ (on CPU each is a loop over per-tensor kernels)
// libtorch 1.13's C++ API has no foreach or fused AdamW of its own (torch.optim's fused CPU
// AdamW arrived in PyTorch 2.4); the Python torch is not needed: torch-foreach runs its ops.
//
// The tensors are one Llama-3.1-8B decoder layer's parameters (q, k, v, o, gate, up, down, two
// norms) scaled by --scale; every variant updates identical copies. Each figure is the best of
// --reps timed runs of --iters steps after one warm-up step.
//
//   cpu_adam [--threads 1,2] [--scale 0.05] [--iters 5] [--reps 3]
// Prints a Markdown table: variant, threads, Mparams/s of wall time, Mparams per CPU-second of
// the process (all threads: parameters per second per core, insensitive to other processes
// taking the cores, sensitive to idle threads spinning), and the ratio of CPU seconds to
// torch-optim's.

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "worker/engine/train/optimizer.h"

namespace {

using ulysses::engine::train::AdamW;
using ulysses::engine::train::AdamWConfig;
using ulysses::engine::train::NamedParams;

constexpr double kLr = 1e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWd = 0.1;

struct Shape {
  std::string name;
  int64_t rows, cols;
};

// Llama-3.1-8B: hidden 4096, intermediate 14336, 8 kv heads of 128.
std::vector<Shape> LayerShapes(double scale) {
  auto r = [&](int64_t n) { return std::max<int64_t>(1, std::llround(n * scale)); };
  return {{"q_proj.weight", r(4096), 4096},
          {"k_proj.weight", r(1024), 4096},
          {"v_proj.weight", r(1024), 4096},
          {"o_proj.weight", r(4096), 4096},
          {"gate_proj.weight", r(14336), 4096},
          {"up_proj.weight", r(14336), 4096},
          {"down_proj.weight", r(4096), 14336},
          {"input_layernorm.weight", 1, 4096},
          {"post_attention_layernorm.weight", 1, 4096}};
}

struct Tensors {
  NamedParams params;
  std::vector<torch::Tensor> grads;
  int64_t numel = 0;
};

Tensors Make(const std::vector<Shape>& shapes, torch::Dtype dtype) {
  torch::manual_seed(1);
  Tensors t;
  for (const Shape& s : shapes) {
    std::vector<int64_t> size =
        s.rows == 1 ? std::vector<int64_t>{s.cols} : std::vector<int64_t>{s.rows, s.cols};
    torch::Tensor p = (torch::randn(size) * 0.02).to(dtype);
    t.params.emplace_back("model.layers.0." + s.name, p);
    t.grads.push_back(torch::randn(size) * 1e-3);  // fp32 (ZeRO's gradient chunks)
    t.numel += p.numel();
  }
  return t;
}

// The op sequence of torch.optim.AdamW's multi-tensor (foreach) path: every op is applied to the
// whole list of tensors before the next.
struct ForeachAdamW {
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;
  int64_t step = 0;
  void Step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads) {
    torch::NoGradGuard no_grad;
    if (exp_avg.empty()) {
      for (const auto& p : params) {
        exp_avg.push_back(torch::zeros_like(p));
        exp_avg_sq.push_back(torch::zeros_like(p));
      }
    }
    ++step;
    at::_foreach_mul_(params, 1 - kLr * kWd);
    at::_foreach_mul_(exp_avg, kBeta1);
    at::_foreach_add_(exp_avg, grads, 1 - kBeta1);
    at::_foreach_mul_(exp_avg_sq, kBeta2);
    at::_foreach_addcmul_(exp_avg_sq, grads, grads, 1 - kBeta2);
    const double bc1 = 1 - std::pow(kBeta1, step), bc2 = 1 - std::pow(kBeta2, step);
    std::vector<torch::Tensor> denom = at::_foreach_sqrt(exp_avg_sq);
    at::_foreach_div_(denom, std::sqrt(bc2));
    at::_foreach_add_(denom, kEps);
    at::_foreach_addcdiv_(params, exp_avg, denom, -kLr / bc1);
  }
};

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Best wall seconds and best process CPU seconds (all threads) per step.
struct Timing {
  double wall = 1e30, cpu = 1e30;
};
Timing Best(const std::function<void()>& step, int iters, int reps) {
  step();  // warm-up: allocates the state
  Timing best;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = CpuSeconds();
    for (int i = 0; i < iters; ++i) step();
    const double c = CpuSeconds() - c0;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best.wall = std::min(best.wall, s / iters);
    best.cpu = std::min(best.cpu, c / iters);
  }
  return best;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    const char* comma = std::strchr(p, ',');
    if (!comma) break;
    p = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  double scale = 0.05;
  int iters = 5, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") {
      threads = ParseList(argv[i + 1]);
    } else if (flag == "--scale") {
      scale = std::atof(argv[i + 1]);
    } else if (flag == "--iters") {
      iters = std::atoi(argv[i + 1]);
    } else if (flag == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "cpu_adam: unknown flag %s (--threads, --scale, --iters, --reps)\n",
                   flag.c_str());
      return 2;
    }
  }
  if (threads.empty() || scale <= 0 || scale > 1 || iters < 1 || reps < 1 ||
      *std::min_element(threads.begin(), threads.end()) < 1) {
    std::fprintf(stderr,
                 "cpu_adam: --threads takes positive counts, --scale (0, 1], --iters and --reps "
                 ">= 1\n");
    return 2;
  }
  const std::vector<Shape> shapes = LayerShapes(scale);
  std::printf(
      "| variant | threads | Mparams/s (wall) | Mparams per CPU-second | vs torch-optim (CPU) |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int n : threads) {
    at::set_num_threads(n);
    std::map<std::string, Timing> seconds;
    int64_t numel = 0;
    std::vector<std::string> order;
    auto run = [&](const std::string& name, const std::function<void()>& step) {
      seconds[name] = Best(step, iters, reps);
      order.push_back(name);
    };
    {
      Tensors t = Make(shapes, torch::kFloat);
      numel = t.numel;
      torch::optim::AdamW opt(
          [&] {
            std::vector<torch::Tensor> ps;
            for (auto& [name, p] : t.params) {
              p.set_requires_grad(true);
              ps.push_back(p);
            }
            return ps;
          }(),
          torch::optim::AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(kWd));
      for (size_t i = 0; i < t.params.size(); ++i) t.params[i].second.mutable_grad() = t.grads[i];
      run("torch-optim", [&] { opt.step(); });
    }
    {
      Tensors t = Make(shapes, torch::kFloat);
      ForeachAdamW opt;
      std::vector<torch::Tensor> ps;
      for (auto& [name, p] : t.params) ps.push_back(p);
      run("torch-foreach", [&] { opt.Step(ps, t.grads); });
    }
    for (bool fast : {false, true}) {
      Tensors t = Make(shapes, torch::kFloat);
      AdamWConfig cfg;
      cfg.beta1 = kBeta1;
      cfg.beta2 = kBeta2;
      cfg.eps = kEps;
      cfg.weight_decay = kWd;
      cfg.fast_cpu = fast;
      AdamW opt(cfg);
      run(fast ? "ulysses" : "ulysses-reference", [&] { opt.Step(t.params, t.grads, kLr); });
    }
    {
      Tensors t = Make(shapes, torch::kBFloat16);
      AdamWConfig cfg;
      cfg.beta1 = kBeta1;
      cfg.beta2 = kBeta2;
      cfg.eps = kEps;
      cfg.weight_decay = kWd;
      AdamW opt(cfg);
      run("ulysses-bf16", [&] { opt.Step(t.params, t.grads, kLr); });
    }
    const double base = seconds["torch-optim"].cpu;
    for (const std::string& name : order) {
      const Timing& t = seconds[name];
      std::printf("| %s | %d | %.1f | %.1f | %.2fx |\n", name.c_str(), n, numel / t.wall / 1e6,
                  numel / t.cpu / 1e6, base / t.cpu);
    }
  }
  std::printf("\n%lld parameters (one Llama-3.1-8B layer x %.3g), best of %d x %d steps\n",
              static_cast<long long>([&] {
                int64_t s = 0;
                for (const Shape& x : shapes) s += x.rows * x.cols;
                return s;
              }()),
              scale, reps, iters);
  return 0;
}
