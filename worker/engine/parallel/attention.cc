#include "worker/engine/parallel/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "worker/engine/torch_compat.h"

namespace ulysses::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::indexing::Slice;

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

struct BlockwiseCausalAttention : public torch::autograd::Function<BlockwiseCausalAttention> {
  // q [b, s, hq, d], k/v [b, s, hkv, d] -> out [b, s, hq, d]; saves q, k, v, out, lse.
  // docs_in: [b, s] int64 CPU document ids, or an EMPTY tensor for one document per row
  // (autograd::Function::apply cannot take an undefined tensor). Key tiles holding no document of
  // the query tile are skipped entirely; mixed tiles are masked (TileScores).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t block,
                               const torch::Tensor& docs_in) {
    const torch::Tensor docs = docs_in.numel() > 0 ? docs_in : torch::Tensor();
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
    torch::Tensor result = UngroupQueries(out);  // [b, s, hq, d]
    ctx->save_for_backward({q, k, v, result, lse});
    ctx->saved_data["block"] = block;
    ctx->saved_data["has_docs"] = docs.defined();
    if (docs.defined()) ctx->saved_data["docs"] = docs;
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3];
    const torch::Tensor& lse = saved[4];  // [b, hkv, g, s]
    const int64_t block = ctx->saved_data["block"].toInt();
    const torch::Tensor docs =
        ctx->saved_data["has_docs"].toBool() ? ctx->saved_data["docs"].toTensor() : torch::Tensor();
    const int64_t hkv = k.size(2), s = q.size(1), d = q.size(3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    torch::Tensor qg = GroupQueries(q, hkv);                       // [b, hkv, g, s, d]
    torch::Tensor dog = GroupQueries(grads[0].contiguous(), hkv);  // [b, hkv, g, s, d]
    torch::Tensor og = GroupQueries(o, hkv);                       // [b, hkv, g, s, d]
    torch::Tensor kh = HeadsFirst(k), vh = HeadsFirst(v);          // [b, hkv, s, d]
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
    return {UngroupQueries(dq), SequenceFirst(dk), SequenceFirst(dv), torch::Tensor(),
            torch::Tensor()};
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

#if ULYSSES_TORCH_HAS_SDPA
// q, k, v in SDPA's [b, h, s, d] layout; gqa: k/v hold the kv heads unrepeated (enable_gqa).
struct SdpaInputs {
  torch::Tensor q, k, v;
  bool gqa = false;
};

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
  in.k = k.repeat_interleave(g, 2).transpose(1, 2);
  in.v = v.repeat_interleave(g, 2).transpose(1, 2);
  return in;
}

// Document (block-diagonal causal) attention through SDPA: an explicit [b, 1, s, s] bool mask
// (true = attend), kv heads repeated. O(s^2) mask bits per sequence: a varlen kernel would avoid
// it (docs/DATA.md).
torch::Tensor SdpaDocuments(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& docs) {
  const int64_t g = q.size(2) / k.size(2), s = q.size(1);
  torch::Tensor d = docs.to(q.device());
  // [b, s, 1] == [b, 1, s] -> [b, s, s], and causal -> [b, 1, s, s]
  torch::Tensor allowed =
      d.unsqueeze(2)
          .eq(d.unsqueeze(1))
          .logical_and(torch::ones({s, s}, d.options().dtype(torch::kBool)).tril())
          .unsqueeze(1);
  torch::Tensor qh = q.transpose(1, 2);                                         // [b, hq, s, d]
  torch::Tensor kh = (g == 1 ? k : k.repeat_interleave(g, 2)).transpose(1, 2);  // [b, hq, s, d]
  torch::Tensor vh = (g == 1 ? v : v.repeat_interleave(g, 2)).transpose(1, 2);  // [b, hq, s, d]
  torch::Tensor o = at::scaled_dot_product_attention(qh, kh, vh, allowed, /*dropout_p=*/0.0,
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

}  // namespace

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
#if ULYSSES_TORCH_HAS_SDPA
  if (q.is_cuda()) return doc_ids.defined() ? SdpaDocuments(q, k, v, docs) : SdpaCausal(q, k, v);
#endif
  if (q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16) {
    return BlockwiseCausalAttention::apply(q.to(torch::kFloat), k.to(torch::kFloat),
                                           v.to(torch::kFloat), opts.block_size, docs)
        .to(q.scalar_type());
  }
  return BlockwiseCausalAttention::apply(q, k, v, opts.block_size, docs);
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
