#include "worker/engine/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "worker/engine/attention/kept_attention.h"
#include "worker/engine/torch_compat.h"

namespace ulysses::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::indexing::Slice;

// FindFusedAttentionOp(name), looked up once per op and process; nullptr (logged once) when it
// cannot be kept.
const FusedAttentionOp* CachedFusedOp(const std::string& name) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* ops = new std::map<std::string, std::unique_ptr<FusedAttentionOp>>();
  absl::MutexLock lock(&mu);
  auto it = ops->find(name);
  if (it == ops->end()) {
    absl::StatusOr<FusedAttentionOp> op = FindFusedAttentionOp(name);
    if (!op.ok()) {
      ULOG(WARNING) << "kept attention: " << op.status().message()
                    << "; attention is recomputed in backward for " << name;
    }
    it = ops->emplace(name, op.ok() ? std::make_unique<FusedAttentionOp>(*std::move(op)) : nullptr)
             .first;
  }
  return it->second.get();
}

// Internal layout. Legend: b batch, s sequence, hkv kv heads, g = hq/hkv query heads per kv head,
// d head dim, bq/bk query/key tile lengths.
// q [b, s, hq, d] -> [b, s, hkv, g, d] -> [b, hkv, g, s, d]
torch::Tensor GroupQueries(const torch::Tensor& q, int64_t hkv) {
  const int64_t b = q.size(0), s = q.size(1), hq = q.size(2), d = q.size(3);
  return q.reshape({b, s, hkv, hq / hkv, d}).permute({0, 2, 3, 1, 4}).contiguous();
}
// [b, hkv, g, s, d] -> [b, s, hkv, g, d] -> [b, s, hq, d]
torch::Tensor UngroupQueries(const torch::Tensor& x) {
  const int64_t b = x.size(0), hkv = x.size(1), g = x.size(2), s = x.size(3), d = x.size(4);
  return x.permute({0, 3, 1, 2, 4}).reshape({b, s, hkv * g, d});
}
// k/v [b, s, hkv, d] -> [b, hkv, s, d]
torch::Tensor HeadsFirst(const torch::Tensor& x) { return x.permute({0, 2, 1, 3}).contiguous(); }
// [b, hkv, s, d] -> [b, s, hkv, d]
torch::Tensor SequenceFirst(const torch::Tensor& x) { return x.permute({0, 2, 1, 3}).contiguous(); }

// Document layout helpers. docs [b, s] int64 on the CPU, non-decreasing along s (packed
// documents are contiguous), so a key tile [j0, j1) and a query tile [i0, i1) share no document
// in any batch row when every row's last key document is below its first query document.
bool TilesDisjoint(const torch::Tensor& docs, int64_t i0, int64_t j1) {
  auto a = docs.accessor<int64_t, 2>();
  for (int64_t r = 0; r < docs.size(0); ++r) {
    if (a[r][j1 - 1] >= a[r][i0]) return false;
  }
  return true;
}
// Positions [begin, end) lie in one document in every batch row (no document mask needed).
bool TileInOneDocument(const torch::Tensor& docs, int64_t begin, int64_t end) {
  auto a = docs.accessor<int64_t, 2>();
  for (int64_t r = 0; r < docs.size(0); ++r) {
    if (a[r][begin] != a[r][end - 1]) return false;
  }
  return true;
}

// Scores of query tile [i0, i0+bq) against key tile [j0, j0+bk), causally masked where the tile
// crosses the diagonal. qt [b, hkv, g, bq, d], kt [b, hkv, bk, d] -> [b, hkv, g, bq, bk].
// docs (optional): [b, s] int64 document ids, non-decreasing along s; where the tile spans more
// than one document, scores between different documents are masked too.
torch::Tensor TileScores(const torch::Tensor& qt, const torch::Tensor& kt, double scale, int64_t i0,
                         int64_t j0, const torch::Tensor& docs = {}) {
  // kt [b, hkv, bk, d] -> [b, hkv, 1, d, bk]; broadcast over g.
  torch::Tensor s = torch::matmul(qt, kt.unsqueeze(2).transpose(-1, -2)).mul_(scale);
  const int64_t bq = qt.size(3), bk = kt.size(2);
  if (j0 + bk - 1 > i0) {  // some key in the tile is after some query: mask key > query
    auto rows = torch::arange(i0, i0 + bq, torch::kLong).unsqueeze(1);  // [bq, 1]
    auto cols = torch::arange(j0, j0 + bk, torch::kLong).unsqueeze(0);  // [1, bk]
    s.masked_fill_(cols > rows, -std::numeric_limits<double>::infinity());
  }
  if (docs.defined() && !TileInOneDocument(docs, j0, i0 + bq)) {
    const int64_t b = docs.size(0);
    // [b, bq, 1] != [b, 1, bk] -> [b, bq, bk] -> [b, 1, 1, bq, bk] (broadcast over hkv, g)
    torch::Tensor other =
        docs.slice(1, i0, i0 + bq).unsqueeze(2).ne(docs.slice(1, j0, j0 + bk).unsqueeze(1));
    s.masked_fill_(other.view({b, 1, 1, bq, bk}).to(s.device()),
                   -std::numeric_limits<double>::infinity());
  }
  return s;
}

// The blockwise forward: q [b, s, hq, d], k/v [b, s, hkv, d] -> {out [b, s, hq, d], lse
// [b, hkv, g, s]}. docs: [b, s] int64 CPU document ids, or undefined for one document per row. Key
// tiles holding no document of the query tile are skipped entirely; mixed tiles are masked
// (TileScores).
std::pair<torch::Tensor, torch::Tensor> BlockwiseForward(const torch::Tensor& q,
                                                         const torch::Tensor& k,
                                                         const torch::Tensor& v, int64_t block,
                                                         const torch::Tensor& docs) {
  CountCausalAttentionForward();
  const int64_t hkv = k.size(2), s = q.size(1), d = q.size(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  torch::Tensor qg = GroupQueries(q, hkv);                                // [b, hkv, g, s, d]
  torch::Tensor kh = HeadsFirst(k);                                       // [b, hkv, s, d]
  torch::Tensor vh = HeadsFirst(v);                                       // [b, hkv, s, d]
  torch::Tensor out = torch::empty_like(qg);                              // [b, hkv, g, s, d]
  torch::Tensor lse = torch::empty(qg.sizes().slice(0, 4), q.options());  // [b, hkv, g, s]
  for (int64_t i0 = 0; i0 < s; i0 += block) {
    const int64_t i1 = std::min(s, i0 + block);
    torch::Tensor qt = qg.index({Slice(), Slice(), Slice(), Slice(i0, i1)});  // [b,hkv,g,bq,d]
    torch::Tensor m, l, acc;  // running max [.., bq, 1], sum [.., bq, 1], output [.., bq, d]
    for (int64_t j0 = 0; j0 < i1; j0 += block) {  // key tiles in order: the first has key 0
      const int64_t j1 = std::min(s, j0 + block);
      if (docs.defined() && TilesDisjoint(docs, i0, j1)) continue;         // another document
      torch::Tensor kt = kh.index({Slice(), Slice(), Slice(j0, j1)});      // [b, hkv, bk, d]
      torch::Tensor vt = vh.index({Slice(), Slice(), Slice(j0, j1)});      // [b, hkv, bk, d]
      torch::Tensor sc = TileScores(qt, kt, scale, i0, j0, docs);          // [b, hkv, g, bq, bk]
      torch::Tensor tile_max = std::get<0>(sc.max(-1, /*keepdim=*/true));  // [.., bq, 1]
      if (docs.defined()) {
        // A row may see no key of this tile (-inf max): exponentiate against a finite max so
        // it contributes exp(-inf) = 0. Every row sees itself, so l > 0 at the end.
        if (!m.defined()) {
          m = torch::full_like(tile_max, -std::numeric_limits<double>::infinity());
          l = torch::zeros_like(tile_max);
          acc = torch::zeros(qt.sizes(), qt.options());
        }
        torch::Tensor m_new = torch::maximum(m, tile_max);
        torch::Tensor m_safe = m_new.masked_fill(m_new.isinf(), 0.0);
        torch::Tensor alpha = (m - m_safe).exp_();
        torch::Tensor p = (sc - m_safe).exp_();
        l = l * alpha + p.sum(-1, true);
        acc = acc * alpha + torch::matmul(p, vt.unsqueeze(2));
        m = m_new;
      } else if (!m.defined()) {
        m = tile_max;  // finite: key 0 is visible to every query
        torch::Tensor p = (sc - m).exp_();
        l = p.sum(-1, true);
        acc = torch::matmul(p, vt.unsqueeze(2));  // [.., bq, bk] x [.., 1, bk, d] -> [.., bq, d]
      } else {
        torch::Tensor m_new = torch::maximum(m, tile_max);
        torch::Tensor alpha = (m - m_new).exp_();
        torch::Tensor p = (sc - m_new).exp_();
        l = l * alpha + p.sum(-1, true);
        acc = acc * alpha + torch::matmul(p, vt.unsqueeze(2));
        m = m_new;
      }
    }
    out.index_put_({Slice(), Slice(), Slice(), Slice(i0, i1)}, acc / l);
    lse.index_put_({Slice(), Slice(), Slice(), Slice(i0, i1)}, (m + l.log()).squeeze(-1));
  }
  return {UngroupQueries(out), lse};
}

// The blockwise backward of BlockwiseForward's {o, lse} for the output gradient `grad`
// [b, s, hq, d] -> {dq [b, s, hq, d], dk, dv [b, s, hkv, d]}.
std::vector<torch::Tensor> BlockwiseBackward(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& v, const torch::Tensor& o,
                                             const torch::Tensor& lse, const torch::Tensor& grad,
                                             int64_t block, const torch::Tensor& docs) {
  const int64_t hkv = k.size(2), s = q.size(1), d = q.size(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  torch::Tensor qg = GroupQueries(q, hkv);                   // [b, hkv, g, s, d]
  torch::Tensor dog = GroupQueries(grad.contiguous(), hkv);  // [b, hkv, g, s, d]
  torch::Tensor og = GroupQueries(o, hkv);                   // [b, hkv, g, s, d]
  torch::Tensor kh = HeadsFirst(k), vh = HeadsFirst(v);      // [b, hkv, s, d]
  // delta_i = sum_d dO_i * O_i: [b, hkv, g, s, 1]
  torch::Tensor delta = (dog * og).sum(-1, true);
  torch::Tensor dq = torch::zeros_like(qg);  // [b, hkv, g, s, d]
  torch::Tensor dk = torch::zeros_like(kh);  // [b, hkv, s, d]
  torch::Tensor dv = torch::zeros_like(vh);  // [b, hkv, s, d]
  for (int64_t j0 = 0; j0 < s; j0 += block) {
    const int64_t j1 = std::min(s, j0 + block);
    torch::Tensor kt = kh.index({Slice(), Slice(), Slice(j0, j1)});  // [b, hkv, bk, d]
    torch::Tensor vt = vh.index({Slice(), Slice(), Slice(j0, j1)});  // [b, hkv, bk, d]
    torch::Tensor dk_acc = torch::zeros_like(kt), dv_acc = torch::zeros_like(vt);
    for (int64_t i0 = (j0 / block) * block; i0 < s; i0 += block) {  // query tiles at/after j0
      const int64_t i1 = std::min(s, i0 + block);
      // Later query tiles hold later documents only: none of them sees this key tile either.
      if (docs.defined() && TilesDisjoint(docs, i0, j1)) break;
      auto rows = Slice(i0, i1);
      torch::Tensor qt = qg.index({Slice(), Slice(), Slice(), rows});    // [b, hkv, g, bq, d]
      torch::Tensor dot = dog.index({Slice(), Slice(), Slice(), rows});  // [b, hkv, g, bq, d]
      torch::Tensor sc = TileScores(qt, kt, scale, i0, j0, docs);        // [b, hkv, g, bq, bk]
      // P = exp(S - lse): [b, hkv, g, bq, bk]
      torch::Tensor p = (sc - lse.index({Slice(), Slice(), Slice(), rows}).unsqueeze(-1)).exp_();
      // dV += sum_g P^T dO: [.., g, bk, bq] x [.., g, bq, d] -> [.., g, bk, d] -> [b, hkv, bk, d]
      dv_acc += torch::matmul(p.transpose(-1, -2), dot).sum(2);
      // dP = dO V^T: [.., g, bq, d] x [.., 1, d, bk] -> [.., g, bq, bk]
      torch::Tensor dp = torch::matmul(dot, vt.unsqueeze(2).transpose(-1, -2));
      // dS = P * (dP - delta) * scale
      torch::Tensor ds =
          p.mul_(dp.sub_(delta.index({Slice(), Slice(), Slice(), rows}))).mul_(scale);
      // dQ += dS K: [.., g, bq, bk] x [.., 1, bk, d] -> [.., g, bq, d]
      dq.index({Slice(), Slice(), Slice(), rows}) += torch::matmul(ds, kt.unsqueeze(2));
      // dK += sum_g dS^T Q: [.., g, bk, bq] x [.., g, bq, d] -> [b, hkv, bk, d]
      dk_acc += torch::matmul(ds.transpose(-1, -2), qt).sum(2);
    }
    dk.index_put_({Slice(), Slice(), Slice(j0, j1)}, dk_acc);
    dv.index_put_({Slice(), Slice(), Slice(j0, j1)}, dv_acc);
  }
  return {UngroupQueries(dq), SequenceFirst(dk), SequenceFirst(dv)};
}

// Kept attention entries of the blockwise kernel carry this op name.
constexpr char kBlockwiseOp[] = "blockwise";

struct BlockwiseCausalAttention : public torch::autograd::Function<BlockwiseCausalAttention> {
  // q [b, s, hq, d], k/v [b, s, hkv, d] -> out [b, s, hq, d]; saves q, k, v, out, lse.
  // docs_in: [b, s] int64 CPU document ids, or an EMPTY tensor for one document per row
  // (autograd::Function::apply cannot take an undefined tensor). kept: null, or a kept forward of
  // these q, k, v (kept attention's replay): its output and lse are used, the forward not run.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t block, const torch::Tensor& docs_in,
                               c10::intrusive_ptr<KeptAttentionEntry> kept) {
    const torch::Tensor docs = docs_in.numel() > 0 ? docs_in : torch::Tensor();
    torch::Tensor result, lse;
    if (kept) {
      TORCH_CHECK(kept->op == kBlockwiseOp && kept->out.sizes() == q.sizes() &&
                      kept->out.scalar_type() == q.scalar_type(),
                  "kept attention: the kept output (", kept->op, ", ", kept->out.sizes(),
                  ") does not match this call's q ", q.sizes(),
                  ": the recompute is not the forward it replays");
      result = kept->out;
      lse = kept->lse;
    } else {
      std::tie(result, lse) = BlockwiseForward(q, k, v, block, docs);
    }
    ctx->save_for_backward({q, k, v, result, lse});
    ctx->saved_data["block"] = block;
    ctx->saved_data["has_docs"] = docs.defined();
    if (docs.defined()) ctx->saved_data["docs"] = docs;
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor docs =
        ctx->saved_data["has_docs"].toBool() ? ctx->saved_data["docs"].toTensor() : torch::Tensor();
    std::vector<torch::Tensor> d =
        BlockwiseBackward(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0],
                          ctx->saved_data["block"].toInt(), docs);
    return {d[0], d[1], d[2], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

void CheckShapes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "CausalAttention: q, k, v must be [b, s, h, d]; got ", q.sizes(), ", ", k.sizes(),
              ", ", v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes(), "CausalAttention: k ", k.sizes(), " != v ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
              "CausalAttention: q ", q.sizes(), " and k ", k.sizes(),
              " must agree on batch, sequence and head dim");
  TORCH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "CausalAttention: query heads ",
              q.size(2), " must be a multiple of kv heads ", k.size(2));
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "CausalAttention: q, k, v dtypes differ");
}

// doc_ids [b, s] integer, non-decreasing along s -> contiguous int64 on the CPU.
torch::Tensor CheckDocIds(const torch::Tensor& doc_ids, int64_t b, int64_t s) {
  TORCH_CHECK(doc_ids.dim() == 2 && doc_ids.size(0) == b && doc_ids.size(1) == s,
              "CausalAttention: doc_ids ", doc_ids.sizes(), " must be [b, s] = [", b, ", ", s,
              "] (the document of every token of the full sequence)");
  torch::Tensor docs = doc_ids.to(torch::kCPU, torch::kLong).contiguous();
  TORCH_CHECK(s < 2 || docs.slice(1, 1).ge(docs.slice(1, 0, s - 1)).all().item<bool>(),
              "CausalAttention: doc_ids must be non-decreasing along the sequence (documents are "
              "contiguous)");
  return docs;
}

// q, k, v in SDPA's [b, h, s, d] layout; gqa: k/v hold the kv heads unrepeated (enable_gqa).
struct SdpaInputs {
  torch::Tensor q, k, v;
  bool gqa = false;
};

// q [b, s, hq, d], k/v [b, s, hkv, d] -> SDPA's [b, h, s, d] views with the kv heads repeated to
// the query head count: for kept attention (it calls the fused ops below SDPA's GQA handling),
// document masks, and GQA where no fused kernel takes the kv heads unrepeated.
SdpaInputs RepeatedSdpaLayout(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v) {
  const int64_t g = q.size(2) / k.size(2);
  SdpaInputs in;
  in.q = q.transpose(1, 2);                                         // [b, hq, s, d]
  in.k = (g == 1 ? k : k.repeat_interleave(g, 2)).transpose(1, 2);  // [b, hq, s, d]
  in.v = (g == 1 ? v : v.repeat_interleave(g, 2)).transpose(1, 2);  // [b, hq, s, d]
  return in;
}

#if ULYSSES_TORCH_HAS_SDPA

// sdp::SDPBackend values (ATen/native/transformers/sdp_utils_cpp.h).
constexpr int64_t kSdpaMath = 0;

int64_t SdpaChoice(const SdpaInputs& in) {
#if ULYSSES_TORCH_HAS_SDPA_GQA
  return at::_fused_sdp_choice(in.q, in.k, in.v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                               /*is_causal=*/true, /*scale=*/std::nullopt, in.gqa);
#else
  return at::_fused_sdp_choice(in.q, in.k, in.v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                               /*is_causal=*/true);
#endif
}

// q [b, s, hq, d], k/v [b, s, hkv, d] -> SDPA's [b, h, s, d] views. kv heads are shared by their
// query group (enable_gqa, libtorch >= 2.5) when a fused kernel takes them so, and repeated to the
// query head count otherwise (never the math kernel's O(s^2) memory just for GQA).
SdpaInputs ToSdpaLayout(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t g = q.size(2) / k.size(2);
  SdpaInputs in;
  in.q = q.transpose(1, 2);
  in.k = k.transpose(1, 2);
  in.v = v.transpose(1, 2);
  if (g == 1) return in;
#if ULYSSES_TORCH_HAS_SDPA_GQA
  in.gqa = true;
  if (SdpaChoice(in) != kSdpaMath) return in;
  in.gqa = false;
#endif
  return RepeatedSdpaLayout(q, k, v);
}

// Document (block-diagonal causal) attention through SDPA: an explicit [b, 1, s, s] bool mask
// (true = attend), kv heads repeated. O(s^2) mask bits per sequence: a varlen kernel would avoid
// it (docs/DATA.md).
torch::Tensor SdpaDocuments(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& docs) {
  const int64_t s = q.size(1);
  torch::Tensor d = docs.to(q.device());
  // [b, s, 1] == [b, 1, s] -> [b, s, s], and causal -> [b, 1, s, s]
  torch::Tensor allowed =
      d.unsqueeze(2)
          .eq(d.unsqueeze(1))
          .logical_and(torch::ones({s, s}, d.options().dtype(torch::kBool)).tril())
          .unsqueeze(1);
  SdpaInputs in = RepeatedSdpaLayout(q, k, v);  // [b, hq, s, d] each
  torch::Tensor o = at::scaled_dot_product_attention(in.q, in.k, in.v, allowed, /*dropout_p=*/0.0,
                                                     /*is_causal=*/false);
  return o.transpose(1, 2).contiguous();  // [b, h, s, d] -> [b, s, h, d]
}

torch::Tensor SdpaCausal(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  SdpaInputs in = ToSdpaLayout(q, k, v);
#if ULYSSES_TORCH_HAS_SDPA_GQA
  torch::Tensor o = at::scaled_dot_product_attention(in.q, in.k, in.v, /*attn_mask=*/{},
                                                     /*dropout_p=*/0.0, /*is_causal=*/true,
                                                     /*scale=*/std::nullopt, in.gqa);
#else
  torch::Tensor o = at::scaled_dot_product_attention(in.q, in.k, in.v, /*attn_mask=*/{},
                                                     /*dropout_p=*/0.0, /*is_causal=*/true);
#endif
  return o.transpose(1, 2).contiguous();  // [b, h, s, d] -> [b, s, h, d]
}
#endif

// The fused op libtorch's dispatcher picks for these SDPA-layout inputs (causal, no mask, kv
// repeated), bound for kept attention; nullptr when it picks none it can keep (math), when
// libtorch has no SDPA, or when the op does not bind (logged once per op).
const FusedAttentionOp* KeepableFusedOp(const SdpaInputs& in) {
  const char* name = nullptr;
#if ULYSSES_TORCH_HAS_SDPA
  switch (SdpaChoice(in)) {
    case 1:
      name = "aten::_scaled_dot_product_flash_attention";
      break;
    case 2:
      name = "aten::_scaled_dot_product_efficient_attention";
      break;
    case 3:
      name = "aten::_scaled_dot_product_cudnn_attention";
      break;
    default:
      break;
  }
#endif
  if (name == nullptr || in.q.size(-1) % 8 != 0) return nullptr;  // SDPA pads other head dims
  return CachedFusedOp(name);
}

// The dtype the blockwise kernel computes in: fp16/bf16 in fp32, fp32/fp64 natively.
torch::ScalarType BlockwiseComputeType(const torch::Tensor& q) {
  const bool narrow = q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16;
  return narrow ? torch::kFloat : q.scalar_type();
}

// The blockwise kernel in its compute dtype, cast back to q's; `kept` as in
// BlockwiseCausalAttention (null: run the forward).
torch::Tensor Blockwise(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionOptions& opts, const torch::Tensor& docs,
                        const c10::intrusive_ptr<KeptAttentionEntry>& kept) {
  const torch::ScalarType t = BlockwiseComputeType(q);
  return BlockwiseCausalAttention::apply(q.to(t), k.to(t), v.to(t), opts.block_size, docs, kept)
      .to(q.scalar_type());
}

// q [b, s, hq, d], k/v [b, s, hkv, d], docs [b, s] (empty: one document per row) -> [b, s, hq, d].
torch::Tensor Attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const AttentionOptions& opts, const torch::Tensor& docs) {
#if ULYSSES_TORCH_HAS_SDPA
  if (q.is_cuda()) {
    CountCausalAttentionForward();
    return docs.numel() > 0 ? SdpaDocuments(q, k, v, docs) : SdpaCausal(q, k, v);
  }
#endif
  return Blockwise(q, k, v, opts, docs, c10::intrusive_ptr<KeptAttentionEntry>());
}

bool UsesSdpa(const torch::Tensor& q) {
#if ULYSSES_TORCH_HAS_SDPA
  return q.is_cuda();
#else
  (void)q;
  return false;
#endif
}

// Kept attention through a fused op on SDPA-layout inputs (kv repeated) -> [b, s, hq, d].
torch::Tensor RecordFusedSdpa(const FusedAttentionOp& op, const SdpaInputs& in,
                              KeptAttention* kept) {
  c10::intrusive_ptr<KeptAttentionEntry> entry = RunFusedAttentionForward(op, in.q, in.k, in.v);
  torch::Tensor out = entry->out.transpose(1, 2).contiguous();  // [b, h, s, d] -> [b, s, h, d]
  kept->Push(std::move(entry));
  return out;
}

// Kept attention, record (no grad): runs the forward keeping its output and lse in `kept`.
torch::Tensor RecordKept(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const AttentionOptions& opts, const torch::Tensor& docs,
                         KeptAttention* kept) {
  if (UsesSdpa(q)) {
    if (docs.numel() == 0) {
      SdpaInputs in = RepeatedSdpaLayout(q, k, v);
      if (const FusedAttentionOp* op = KeepableFusedOp(in)) return RecordFusedSdpa(*op, in, kept);
    }
    kept->Push(c10::make_intrusive<KeptAttentionEntry>());  // not kept: recomputed
    return Attend(q, k, v, opts, docs);
  }
  const torch::ScalarType compute = BlockwiseComputeType(q);
  const torch::Tensor no_docs = docs.numel() > 0 ? docs : torch::Tensor();
  auto entry = c10::make_intrusive<KeptAttentionEntry>();
  entry->kept = true;
  entry->op = kBlockwiseOp;
  std::tie(entry->out, entry->lse) = BlockwiseForward(q.to(compute), k.to(compute), v.to(compute),
                                                      opts.block_size, no_docs);  // [b, s, hq, d]
  torch::Tensor out = entry->out.to(q.scalar_type());
  kept->Push(std::move(entry));
  return out;
}

// The replay of a fused SDPA op: forward returns the kept output, backward runs the op's backward.
struct KeptFusedAttention : public torch::autograd::Function<KeptFusedAttention> {
  // q, k, v [b, h, s, d] (kv repeated) -> the kept output [b, h, s, d].
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v,
                               c10::intrusive_ptr<KeptAttentionEntry> kept) {
    TORCH_CHECK(kept->out.sizes() == q.sizes() && kept->out.device() == q.device() &&
                    kept->out.scalar_type() == q.scalar_type(),
                "kept attention: the kept output (", kept->op, ", ", kept->out.sizes(),
                ") does not match this call's q ", q.sizes(),
                ": the recompute is not the forward it replays");
    const FusedAttentionOp* op = CachedFusedOp(kept->op);
    TORCH_CHECK(op != nullptr, "kept attention: ", kept->op, " is no longer bound");
    // The output becomes this node's output: only the saved-variable machinery may hold it (as
    // an output, without a strong reference back to the node), never the entry the node keeps.
    torch::Tensor out = std::move(kept->out);
    kept->forward_returns[op->binding.output_index()] = c10::IValue();
    ctx->save_for_backward({q, k, v, out});
    ctx->saved_data["kept"] = c10::IValue::make_capsule(kept);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto kept =
        c10::static_intrusive_pointer_cast<KeptAttentionEntry>(ctx->saved_data["kept"].toCapsule());
    const FusedAttentionOp* op = CachedFusedOp(kept->op);
    std::vector<torch::Tensor> d =
        RunFusedAttentionBackward(*op, *kept, grads[0], saved[0], saved[1], saved[2], saved[3]);
    return {d[0], d[1], d[2], torch::Tensor()};
  }
};

// Kept attention, replay (grad on): the kept output, with the kernel's backward against it.
torch::Tensor ReplayKept(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const AttentionOptions& opts, const torch::Tensor& docs,
                         const c10::intrusive_ptr<KeptAttentionEntry>& entry) {
  if (entry->op != kBlockwiseOp) return ReplayFusedAttention(q, k, v, entry);
  return Blockwise(q, k, v, opts, docs, entry);
}

}  // namespace

torch::Tensor RecordFusedAttention(const FusedAttentionOp& op, const torch::Tensor& q,
                                   const torch::Tensor& k, const torch::Tensor& v,
                                   KeptAttention* kept) {
  CheckShapes(q, k, v);
  return RecordFusedSdpa(op, RepeatedSdpaLayout(q, k, v), kept);
}

torch::Tensor ReplayFusedAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v,
                                   const c10::intrusive_ptr<KeptAttentionEntry>& entry) {
  CheckShapes(q, k, v);
  SdpaInputs in = RepeatedSdpaLayout(q, k, v);
  torch::Tensor o = KeptFusedAttention::apply(in.q, in.k, in.v, entry);  // [b, h, s, d]
  return o.transpose(1, 2).contiguous();                                 // [b, s, h, d]
}

std::string SdpaBackendFor(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
#if ULYSSES_TORCH_HAS_SDPA
  if (q.is_cuda()) {
    const int64_t choice = SdpaChoice(ToSdpaLayout(q, k, v));
    switch (choice) {
      case kSdpaMath:
        return "math";
      case 1:
        return "flash";
      case 2:
        return "efficient";
      case 3:
        return "cudnn";
      default:
        return "backend-" + std::to_string(choice);
    }
  }
#endif
  return "blockwise";
}

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionOptions& opts,
                              const torch::Tensor& doc_ids) {
  CheckShapes(q, k, v);
  TORCH_CHECK(opts.block_size > 0, "AttentionOptions.block_size: ", opts.block_size,
              " must be > 0");
  torch::Tensor docs = torch::empty({0}, torch::kLong);  // empty: one document per row
  if (doc_ids.defined()) {
    docs = CheckDocIds(doc_ids, q.size(0), q.size(1));
  }
  KeepAttentionScope* scope = KeepAttentionScope::Current();
  if (scope != nullptr && scope->mode() == KeepMode::kReplay) {
    c10::intrusive_ptr<KeptAttentionEntry> entry = scope->kept()->Pop();
    if (entry->kept) return ReplayKept(q, k, v, opts, docs, entry);
  } else if (scope != nullptr && !torch::GradMode::is_enabled()) {
    // Record: what the replay needs, or a "not kept" entry so the two stay in step.
    return RecordKept(q, k, v, opts, docs, scope->kept());
  }
  return Attend(q, k, v, opts, docs);
}

torch::Tensor NaiveCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& doc_ids) {
  CheckShapes(q, k, v);
  const int64_t g = q.size(2) / k.size(2), s = q.size(1);
  // [b, s, h, d] -> [b, h, s, d], kv repeated to hq heads.
  auto qh = q.transpose(1, 2);
  auto kh = k.repeat_interleave(g, 2).transpose(1, 2);
  auto vh = v.repeat_interleave(g, 2).transpose(1, 2);
  auto scores = torch::matmul(qh, kh.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(3)));
  torch::Tensor mask = torch::ones({s, s}, torch::kBool).triu(1);  // [s, s]: key after query
  if (doc_ids.defined()) {
    torch::Tensor d = doc_ids.to(torch::kLong);
    // [s, s] | ([b, s, 1] != [b, 1, s]) -> [b, 1, s, s] (broadcast over heads)
    mask = mask.logical_or(d.unsqueeze(2).ne(d.unsqueeze(1))).unsqueeze(1).to(q.device());
  }
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  return torch::matmul(scores.softmax(-1), vh).transpose(1, 2);  // [b, h, s, d] -> [b, s, h, d]
}

}  // namespace ulysses::engine
