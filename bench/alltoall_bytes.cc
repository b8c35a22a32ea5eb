// All-to-all bytes per Ulysses attention layer per rank, measured with Communicator::bytes_sent()
// over real Gloo processes on 127.0.0.1, against the formulas:
//   paper    = 4*N*H/P elements (H = Hq*D; all-to-all input per rank, forward, MHA)
//   leaves   = (2*Hq + 2*Hkv')*D*N/P*(P-1)/P elements forward, Hkv' = Hkv if Hkv % P == 0 else P
//              (kv replicated), i.e. what actually leaves the rank (its own 1/P chunk stays).
// Backward moves the same amount again (the swapped exchanges).
//
//   alltoall_bytes [--P 4] [--N 4096] [--hq 8] [--hkv 8] [--d 64]
// Prints one table row (rank 0). Spawns P copies of itself (env ULYSSES_BENCH_RANK...).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench/spawn_ranks.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/rendezvous_port.h"
#include "worker/engine/parallel/ulysses_attention.h"

namespace {

using ulysses::engine::AttentionOptions;
using ulysses::engine::CommConfig;
using ulysses::engine::CreateProcessGroups;
using ulysses::engine::UlyssesAttention;

int FreePort() {
  absl::StatusOr<int> port = ulysses::engine::PickRendezvousPort();
  if (!port.ok()) {
    std::fprintf(stderr, "%s\n", port.status().ToString().c_str());
    std::exit(1);
  }
  return *port;
}

int RunRank(int rank, int p, int port, int64_t n, int64_t hq, int64_t hkv, int64_t d) {
  CommConfig config;
  config.rank = rank;
  config.world_size = p;
  config.sp_size = p;
  config.master_port = port;
  auto groups = CreateProcessGroups(config);
  if (!groups.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, groups.status().ToString().c_str());
    return 1;
  }
  auto* sp = groups->sp.get();
  torch::manual_seed(rank);
  const int64_t sl = n / p;
  auto q = torch::randn({1, sl, hq, d}).requires_grad_(true);
  auto k = torch::randn({1, sl, hkv, d}).requires_grad_(true);
  auto v = torch::randn({1, sl, hkv, d}).requires_grad_(true);
  const auto t0 = std::chrono::steady_clock::now();
  auto out = UlyssesAttention(q, k, v, sp, AttentionOptions{});
  const int64_t fwd = sp->bytes_sent();
  out.sum().backward();
  const int64_t total = sp->bytes_sent();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank == 0) {
    const int64_t es = 4;  // fp32
    const int64_t hk = ulysses::spec::UlyssesKvHeadsExchanged(hkv, p);
    const double paper = 4.0 * n * hq * d / p * es;
    const double leaves = static_cast<double>(2 * hq + 2 * hk) * d * n / p * (p - 1) / p * es;
    std::printf("| %d | %lld | %lld | %lld | %lld | %lld | %.0f | %.0f | %lld | %.2f |\n", p,
                static_cast<long long>(n), static_cast<long long>(hq), static_cast<long long>(hkv),
                static_cast<long long>(d), static_cast<long long>(fwd), leaves, paper,
                static_cast<long long>(total - fwd), secs);
  }
  return sp->Barrier().ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, int64_t> a = {
      {"--P", 4}, {"--N", 4096}, {"--hq", 8}, {"--hkv", 8}, {"--d", 64}};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!a.count(argv[i])) {
      std::fprintf(stderr, "unknown flag %s (flags: --P --N --hq --hkv --d)\n", argv[i]);
      return 2;
    }
    a[argv[i]] = std::atoll(argv[i + 1]);
  }
  const int p = static_cast<int>(a["--P"]);
  if (const char* r = std::getenv("ULYSSES_BENCH_RANK")) {
    return RunRank(std::atoi(r), p, std::atoi(std::getenv("ULYSSES_BENCH_PORT")), a["--N"],
                   a["--hq"], a["--hkv"], a["--d"]);
  }
  auto st = ulysses::engine::CheckUlyssesHeads(a["--hq"], a["--hkv"], p);
  if (!st.ok() || a["--N"] % p != 0) {
    std::fprintf(stderr, "bad setup: %s (N %% P must be 0)\n", st.ToString().c_str());
    return 2;
  }
  const int port = FreePort();
  return ulysses::bench::SpawnSelfAsRanks(p, port, argv);
}
