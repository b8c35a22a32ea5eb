// CPU causal attention throughput: blockwise flash-style CausalAttention vs the naive masked
// softmax, forward+backward tokens/s at a few sequence lengths (b=1, fp32).
//
//   attention_cpu [--hq 8] [--hkv 2] [--d 64] [--block 512] [--reps 2] S...
// One table row per S. OMP/MKL threads follow the environment (set OMP_NUM_THREADS).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "worker/engine/attention/attention.h"

namespace {

template <typename Fn>
double SecondsPerStep(Fn fn, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                      int reps) {
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true),
       v1 = v.clone().requires_grad_(true);
  fn(q1, k1, v1).sum().backward();  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn(q1, k1, v1).sum().backward();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, int64_t> a = {{"--hq", 8},      {"--hkv", 2},  {"--d", 64},
                                      {"--block", 512}, {"--reps", 2}, {"--naive-max", 4096}};
  std::vector<int64_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--", 2) == 0 && i + 1 < argc && a.count(argv[i])) {
      a[argv[i]] = std::atoll(argv[i + 1]);
      ++i;
    } else {
      sizes.push_back(std::atoll(argv[i]));
    }
  }
  if (sizes.empty()) sizes = {1024, 2048, 4096};
  ulysses::engine::AttentionOptions opts;
  opts.block_size = a["--block"];
  std::printf(
      "| s | hq/hkv | d | block | blockwise fwd+bwd s | tokens/s | naive fwd+bwd s | tokens/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int64_t s : sizes) {
    torch::manual_seed(0);
    auto q = torch::randn({1, s, a["--hq"], a["--d"]});
    auto k = torch::randn({1, s, a["--hkv"], a["--d"]});
    auto v = torch::randn({1, s, a["--hkv"], a["--d"]});
    const int reps = static_cast<int>(a["--reps"]);
    double blockwise = SecondsPerStep(
        [&](auto& x, auto& y, auto& z) { return ulysses::engine::CausalAttention(x, y, z, opts); },
        q, k, v, reps);
    std::string naive_s = "skipped", naive_tps = "-";
    if (s <= a["--naive-max"]) {
      double naive = SecondsPerStep(
          [](auto& x, auto& y, auto& z) { return ulysses::engine::NaiveCausalAttention(x, y, z); },
          q, k, v, reps);
      naive_s = std::to_string(naive);
      naive_tps = std::to_string(static_cast<int64_t>(s / naive));
    }
    std::printf("| %lld | %lld/%lld | %lld | %lld | %.3f | %lld | %s | %s |\n",
                static_cast<long long>(s), static_cast<long long>(a["--hq"]),
                static_cast<long long>(a["--hkv"]), static_cast<long long>(a["--d"]),
                static_cast<long long>(opts.block_size), blockwise,
                static_cast<long long>(s / blockwise), naive_s.c_str(), naive_tps.c_str());
    std::fflush(stdout);
  }
  return 0;
}
