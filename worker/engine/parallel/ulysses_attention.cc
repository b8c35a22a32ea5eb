#include "worker/engine/parallel/ulysses_attention.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ulysses::engine {

torch::Tensor UlyssesAttention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, Communicator* sp,
                               const AttentionOptions& opts, const torch::Tensor& doc_ids) {
  TORCH_CHECK(sp != nullptr, "UlyssesAttention: sp communicator is null");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "UlyssesAttention: q, k, v must be [b, s/p, h, d]");
  const int64_t p = sp->size(), hq = q.size(2), hkv = k.size(2);
  absl::Status heads = CheckUlyssesHeads(hq, hkv, p);
  TORCH_CHECK(heads.ok(), std::string(heads.message()));
  if (p == 1) return CausalAttention(q, k, v, opts, doc_ids);

  // GQA with fewer kv heads than ranks: [b, s/p, hkv, d] -> [b, s/p, p, d], so rank r receives
  // kv head r / (p/hkv), the one its query heads r*hq/p .. use.
  torch::Tensor kx = k, vx = v;
  const int64_t exchanged = spec::UlyssesKvHeadsExchanged(hkv, p);
  if (exchanged != hkv) {
    kx = k.repeat_interleave(exchanged / hkv, 2);
    vx = v.repeat_interleave(exchanged / hkv, 2);
  }
  const int64_t hk = kx.size(2);  // kv heads entering the exchange (a multiple of p)
  const int64_t b = q.size(0), sl = q.size(1), d = q.size(3);
  torch::Tensor q_full, k_full, v_full;
  if (kx.size(3) == d && kx.scalar_type() == q.scalar_type()) {
    // Fused exchange: per destination rank r, its q heads then its k heads then its v heads.
    // q [b, s/p, hq, d] -> [b, s/p, p, hq/p, d]; k, v [b, s/p, hk, d] -> [b, s/p, p, hk/p, d]
    torch::Tensor qkv =
        torch::cat({q.reshape({b, sl, p, hq / p, d}), kx.reshape({b, sl, p, hk / p, d}),
                    vx.reshape({b, sl, p, hk / p, d})},
                   3);  // [b, s/p, p, (hq+2hk)/p, d]
    const int64_t hl = (hq + 2 * hk) / p;
    qkv = qkv.reshape({b, sl, p * hl, d});            // [b, s/p, hq+2hk, d]
    torch::Tensor full = SeqAllToAll(qkv, sp, 2, 1);  // [b, s, (hq+2hk)/p, d]
    auto parts = full.split({hq / p, hk / p, hk / p}, 2);
    q_full = parts[0];  // [b, s, hq/p, d]
    k_full = parts[1];  // [b, s, hk/p, d]
    v_full = parts[2];  // [b, s, hk/p, d]
  } else {
    q_full = SeqAllToAll(q.contiguous(), sp, 2, 1);   // [b, s/p, hq, d] -> [b, s, hq/p, d]
    k_full = SeqAllToAll(kx.contiguous(), sp, 2, 1);  // [b, s/p, hk, d] -> [b, s, hk/p, d]
    v_full = SeqAllToAll(vx.contiguous(), sp, 2, 1);  // [b, s/p, hk, d] -> [b, s, hk/p, d]
  }
  // Every rank holds the whole sequence for its heads now; doc_ids [b, s] is the GLOBAL layout
  // (each rank of the SP group reads the same sample, so it has it without a collective).
  torch::Tensor out = CausalAttention(q_full, k_full, v_full, opts, doc_ids);  // [b, s, hq/p, d]
  return SeqAllToAll(out.contiguous(), sp, 1, 2);                              // -> [b, s/p, hq, d]
}

}  // namespace ulysses::engine
