// Exact causal self-attention for one device, memory O(s * block) on CPU.
//
// CausalAttention(q [b, s, hq, d], k [b, s, hkv, d], v [b, s, hkv, d]) -> [b, s, hq, d], with
// hq % hkv == 0 (GQA: query head i uses kv head i / (hq/hkv)) and scale 1/sqrt(d).
//  - CPU: blockwise attention with an online softmax, one custom autograd Function that saves only
//    q, k, v, out and the per-row logsumexp and recomputes score blocks in backward (flash-style).
//    It never builds an [s, s] matrix. fp32 and fp64 are computed natively; fp16/bf16 are computed
//    in fp32 and cast back. GQA is handled by grouping query heads per kv head (kv never repeated).
//  - CUDA tensors with libtorch >= 2: at::scaled_dot_product_attention(is_causal=true), which
//    dispatches to a fused kernel (flash / memory-efficient / cuDNN; SdpaBackendFor() names the
//    one it picks). GQA passes kv heads unrepeated (enable_gqa) where libtorch supports it (2.5+).
// Pure function: no state, thread-safe. Throws c10::Error on bad shapes.
#ifndef ULYSSES_WORKER_ENGINE_ATTENTION_ATTENTION_H_
#define ULYSSES_WORKER_ENGINE_ATTENTION_ATTENTION_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "worker/engine/attention/kept_attention.h"

namespace ulysses::engine {

struct AttentionOptions {
  // Query/key tile length of the CPU kernel; memory per head group is O(block_size^2).
  int64_t block_size = 512;
};

// doc_ids (optional): [b, s] integer document id of every token, non-decreasing along s (packed
// documents are contiguous). With it, a query attends only to earlier keys of its own document:
// the CPU kernel skips key tiles that hold none of the query tile's documents (forward and
// backward) and masks the mixed tiles; CUDA passes SDPA a [b, 1, s, s] block-diagonal causal
// mask (O(s^2) bits).
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionOptions& opts,
                              const torch::Tensor& doc_ids = {});

// The SDPA backend libtorch's dispatcher picks for these q, k, v (causal, no mask): "flash",
// "efficient", "cudnn", "math", ...; "blockwise" where CausalAttention does not use SDPA (CPU
// tensors, or libtorch < 2).
std::string SdpaBackendFor(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// Kept attention through a fused SDPA op (kept_attention.h): CausalAttention's CUDA path under a
// KeepAttentionScope; tests call them with an op of their own. q [b, s, hq, d], k/v [b, s, hkv, d]
// -> [b, s, hq, d]; the op sees SDPA's [b, h, s, d] views with the kv heads repeated.
// Record (no grad): runs op's forward and appends what its backward needs to `kept`.
torch::Tensor RecordFusedAttention(const FusedAttentionOp& op, const torch::Tensor& q,
                                   const torch::Tensor& k, const torch::Tensor& v,
                                   KeptAttention* kept);
// Replay (grad on): the entry's output, whose backward runs the backward of the op named by
// entry->op (looked up once per process).
torch::Tensor ReplayFusedAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v,
                                   const c10::intrusive_ptr<KeptAttentionEntry>& entry);

// The naive reference: full [s, s] scores, masked softmax (tests and benchmarks only).
torch::Tensor NaiveCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& doc_ids = {});

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_ATTENTION_ATTENTION_H_
