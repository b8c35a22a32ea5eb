// Data-path benchmark (issue 14): packing throughput and the attention speedup from skipping
// cross-document tiles.
//
//   data_packing [--docs 20000] [--mean-len 1000] [--seq 32768] [--doc-len 1024] [--hq 8]
//                [--hkv 2] [--d 64] [--block 512] [--reps 1]
//
// 1. Pack: writes a JSONL of --docs documents (lengths uniform in [1, 2 * mean-len), with masks),
//    times `PackJsonl` (JSONL -> PREFIX.idx/.bin/.mask) and reports documents/s and input GB/s;
//    then times building every packed sequence of --seq tokens (open + plan + Get) and reports
//    documents/s and token GB/s (4-byte tokens read).
// 2. Attention: CPU CausalAttention forward+backward (fp32, b=1) on --seq tokens as one document
//    vs documents of --doc-len tokens, and the speedup. OMP threads follow the environment.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "common/file_tree.h"
#include "worker/engine/attention/attention.h"
#include "worker/engine/data/indexed.h"
#include "worker/engine/data/packing.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double AttentionSeconds(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& docs, int64_t block, int reps) {
  ulysses::engine::AttentionOptions opts;
  opts.block_size = block;
  auto q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true),
       v1 = v.clone().requires_grad_(true);
  auto run = [&] { ulysses::engine::CausalAttention(q1, k1, v1, opts, docs).sum().backward(); };
  run();  // warm-up
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) run();
  return Since(t0) / reps;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, int64_t> a = {{"--docs", 20000},   {"--mean-len", 1000}, {"--seq", 32768},
                                      {"--doc-len", 1024}, {"--hq", 8},          {"--hkv", 2},
                                      {"--d", 64},         {"--block", 512},     {"--reps", 1}};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!a.count(argv[i])) {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
    a[argv[i]] = std::atoll(argv[i + 1]);
  }
  const fs::path dir =
      fs::temp_directory_path() / ("ulysses-bench-data-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string jsonl = (dir / "docs.jsonl").string(), prefix = (dir / "ds").string();
  {
    std::ofstream out(jsonl);
    uint64_t x = 1;
    for (int64_t d = 0; d < a["--docs"]; ++d) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const int64_t n = 1 + static_cast<int64_t>((x >> 33) % (2 * a["--mean-len"] - 1));
      std::string ids, mask;
      for (int64_t i = 0; i < n; ++i) {
        ids += (i ? "," : "") + std::to_string((d * 131 + i * 7) % 32000);
        mask += i ? (i < n / 4 ? ",0" : ",1") : "0";
      }
      out << "{\"ids\": [" << ids << "], \"mask\": [" << mask << "]}\n";
    }
  }
  const double jsonl_bytes = static_cast<double>(fs::file_size(jsonl));
  auto t0 = Clock::now();
  auto stats = ulysses::engine::PackJsonl(jsonl, prefix, 32000);
  const double pack_s = Since(t0);
  if (!stats.ok()) {
    std::fprintf(stderr, "%s\n", std::string(stats.status().message()).c_str());
    return 1;
  }
  t0 = Clock::now();
  auto ds = ulysses::engine::OpenPackedDataset(prefix, ulysses::engine::Split::kValidation, 32000,
                                               1, /*packing=*/true);
  if (!ds.ok()) return 1;
  const int64_t seq = a["--seq"], n_seq = (*ds)->NumSequences(seq);
  for (int64_t i = 0; i < n_seq; ++i) {
    if (!(*ds)->Get(i, seq).ok()) return 1;
  }
  const double read_s = Since(t0);
  std::printf(
      "| stage | documents | tokens | seconds | documents/s | GB/s |\n|---|---|---|---|---|---|\n");
  std::printf("| pack JSONL -> indexed | %ld | %ld | %.3f | %.0f | %.3f (JSONL in) |\n",
              static_cast<long>(stats->documents), static_cast<long>(stats->tokens), pack_s,
              stats->documents / pack_s, jsonl_bytes / pack_s / 1e9);
  std::printf("| pack into %ld sequences of %ld | %ld | %ld | %.3f | %.0f | %.3f (tokens) |\n\n",
              static_cast<long>(n_seq), static_cast<long>(seq), static_cast<long>(stats->documents),
              static_cast<long>(stats->tokens), read_s, stats->documents / read_s,
              4.0 * stats->tokens / read_s / 1e9);
  ulysses::RemoveTree(dir).IgnoreError();

  torch::manual_seed(0);
  const int64_t hq = a["--hq"], hkv = a["--hkv"], d = a["--d"], doc_len = a["--doc-len"];
  auto q = torch::randn({1, seq, hq, d}), k = torch::randn({1, seq, hkv, d}),
       v = torch::randn({1, seq, hkv, d});
  torch::Tensor docs = torch::arange(seq, torch::kLong).div(doc_len, "floor").unsqueeze(0);
  const double one = AttentionSeconds(q, k, v, {}, a["--block"], a["--reps"]);
  const double many = AttentionSeconds(q, k, v, docs, a["--block"], a["--reps"]);
  std::printf("| s | documents | block | fwd+bwd s | speedup |\n|---|---|---|---|---|\n");
  std::printf("| %ld | 1 | %ld | %.2f | 1.00 |\n", static_cast<long>(seq),
              static_cast<long>(a["--block"]), one);
  std::printf("| %ld | %ld x %ld | %ld | %.2f | %.2f |\n", static_cast<long>(seq),
              static_cast<long>((seq + doc_len - 1) / doc_len), static_cast<long>(doc_len),
              static_cast<long>(a["--block"]), many, one / many);
  return 0;
}
