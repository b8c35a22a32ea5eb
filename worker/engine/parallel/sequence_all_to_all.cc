#include "worker/engine/parallel/sequence_all_to_all.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/engine/parallel/alltoall_clock.h"

namespace ulysses::engine {
namespace {

std::atomic<int64_t> alltoall_nanos{0};  // SeqAllToAllSeconds(), in nanoseconds.

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The exchange without autograd. Shape legend for the canonical call (scatter=2, gather=1):
// b batch, s/p local sequence, h heads, d head dim, p group size.
torch::Tensor AllToAllImpl(const torch::Tensor& x, Communicator* comm, int64_t scatter_dim,
                           int64_t gather_dim) {
  const int64_t p = comm->size();
  const int64_t scatter_size = x.size(scatter_dim);
  TORCH_CHECK(scatter_size % p == 0, "SeqAllToAll: dim ", scatter_dim, " has size ", scatter_size,
              ", not divisible by the group size ", p);
  if (p == 1) return x;
  // Split the scatter dim into [p, h/p]: [b, s/p, h, d] -> [b, s/p, p, h/p, d].
  std::vector<int64_t> split = x.sizes().vec();
  split[scatter_dim] = scatter_size / p;
  split.insert(split.begin() + scatter_dim, p);
  // Destination rank first, contiguous: [b, s/p, p, h/p, d] -> [p, b, s/p, h/p, d].
  torch::Tensor send = x.reshape(split).movedim(scatter_dim, 0).contiguous();
  torch::Tensor recv = torch::empty_like(send);  // [p(source rank), b, s/p, h/p, d]
  const auto started = std::chrono::steady_clock::now();
  absl::Status st = comm->AllToAll(recv, send);
  if (!comm->times_alltoall()) {  // Blocking: the host time is the exchange's.
    alltoall_nanos.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - started)
                                 .count(),
                             std::memory_order_relaxed);
  }
  if (!st.ok()) throw std::runtime_error("SeqAllToAll: " + st.ToString());
  // Source rank next to the gather dim (1 + gather_dim in recv): [p, b, s/p, h/p, d] ->
  // [b, p, s/p, h/p, d]; then merge: -> [b, s, h/p, d] (source j lands at offset j*s/p).
  std::vector<int64_t> merged = x.sizes().vec();
  merged[scatter_dim] = scatter_size / p;
  merged[gather_dim] *= p;
  return recv.movedim(0, gather_dim).reshape(merged);
}

struct SeqAllToAllFunction : public torch::autograd::Function<SeqAllToAllFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm,
                               int64_t scatter_dim, int64_t gather_dim) {
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    ctx->saved_data["scatter"] = scatter_dim;
    ctx->saved_data["gather"] = gather_dim;
    return AllToAllImpl(x, comm, scatter_dim, gather_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    // The gradient travels back: scatter and gather swapped ([b, s, h/p, d] -> [b, s/p, h, d]).
    torch::Tensor g =
        AllToAllImpl(grad_out[0].contiguous(), comm, ctx->saved_data["gather"].toInt(),
                     ctx->saved_data["scatter"].toInt());
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

double SeqAllToAllSeconds() { return alltoall_nanos.load(std::memory_order_relaxed) / 1e9; }

void AddSeqAllToAllSeconds(double seconds) {
  alltoall_nanos.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
}

torch::Tensor SeqAllToAll(const torch::Tensor& x, Communicator* comm, int64_t scatter_dim,
                          int64_t gather_dim) {
  TORCH_CHECK(comm != nullptr, "SeqAllToAll: comm is null");
  const int64_t n = x.dim();
  if (scatter_dim < 0) scatter_dim += n;
  if (gather_dim < 0) gather_dim += n;
  TORCH_CHECK(scatter_dim >= 0 && scatter_dim < n && gather_dim >= 0 && gather_dim < n &&
                  scatter_dim != gather_dim,
              "SeqAllToAll: scatter_dim ", scatter_dim, " and gather_dim ", gather_dim,
              " must be distinct dims of a ", n, "-d tensor");
  return SeqAllToAllFunction::apply(x, comm, scatter_dim, gather_dim);
}

}  // namespace ulysses::engine
