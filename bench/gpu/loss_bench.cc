// The loss at the end of the model, alone: forward + backward seconds and peak memory of the
// dense cross-entropy (full [n, V] logits, upcast to fp32) and of TiledCrossEntropySum (the
// chunked linear-cross-entropy fused with its gradient, worker/engine/model/llama.h), on the
// same random hidden states, head weight and labels.
//
//   loss_bench --device cpu|cuda:0 --dtype float32|bfloat16 --tokens 4096 --hidden 2048
//       --vocab 32000 [--tile 1024] [--steps 3]
//
// Prints one JSON line per variant: {"variant": "dense"|"tiled", tokens, hidden, vocab, tile,
// seconds (mean of --steps after one warm-up), peak_allocated_bytes, loss}. The peak is per
// variant on CUDA; on CPU it is the process's high-water mark so far (train/device_memory.h),
// so only the CUDA figure compares the two.
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/train/device_memory.h"

namespace {

using ulysses::engine::model::kIgnoreIndex;

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "loss_bench: " << why << " (see the header of bench/gpu/loss_bench.cc)\n";
  std::exit(2);
}

struct Args {
  std::string device = "cpu", dtype = "float32";
  int64_t tokens = 4096, hidden = 2048, vocab = 32000, tile = 1024, steps = 3;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) Usage(f + " needs a value");
    const std::string v = argv[++i];
    int64_t* target = f == "--tokens"   ? &a.tokens
                      : f == "--hidden" ? &a.hidden
                      : f == "--vocab"  ? &a.vocab
                      : f == "--tile"   ? &a.tile
                      : f == "--steps"  ? &a.steps
                                        : nullptr;
    if (f == "--device") {
      a.device = v;
    } else if (f == "--dtype") {
      a.dtype = v;
    } else if (target == nullptr) {
      Usage("unknown flag " + f);
    } else if (!absl::SimpleAtoi(v, target) || *target < 1) {
      Usage(f + ": '" + v + "' is not a positive integer");
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  namespace F = torch::nn::functional;
  using ulysses::engine::train::ReadDeviceMemory;
  using ulysses::engine::train::ResetPeakDeviceMemory;
  const Args a = Parse(argc, argv);
  auto dtype = ulysses::engine::model::ParseDtype(a.dtype);
  if (!dtype.ok()) Usage(std::string(dtype.status().message()));
  const torch::Device device(a.device);
  auto opts = torch::TensorOptions().device(device).dtype(*dtype);
  torch::manual_seed(1);
  torch::Tensor hidden = torch::randn({a.tokens, a.hidden}, opts);
  torch::Tensor weight = torch::randn({a.vocab, a.hidden}, opts).mul_(0.02);
  torch::Tensor labels = torch::randint(0, a.vocab, {a.tokens}, torch::kLong).to(device);
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  for (const std::string variant : {"dense", "tiled"}) {
    double total = 0, loss = 0;
    ResetPeakDeviceMemory(device);
    for (int64_t step = 0; step <= a.steps; ++step) {  // step 0 warms up
      torch::Tensor h = hidden.detach().requires_grad_(true);
      torch::Tensor w = weight.detach().requires_grad_(true);
      sync();
      const auto start = std::chrono::steady_clock::now();
      torch::Tensor l;
      if (variant == "dense") {
        torch::Tensor logits = h.matmul(w.t()).to(torch::kFloat);  // [n, V] fp32
        l = F::cross_entropy(
            logits, labels,
            F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
      } else {
        l = ulysses::engine::model::TiledCrossEntropySum(h, w, labels, a.tile);
      }
      l.backward();
      sync();
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (step > 0) total += secs;
      loss = l.item<double>();
    }
    nlohmann::json j{{"variant", variant},
                     {"device", a.device},
                     {"dtype", a.dtype},
                     {"tokens", a.tokens},
                     {"hidden", a.hidden},
                     {"vocab", a.vocab},
                     {"tile", a.tile},
                     {"seconds", total / static_cast<double>(a.steps)},
                     {"peak_allocated_bytes", ReadDeviceMemory(device).peak_allocated},
                     {"loss", loss}};
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
