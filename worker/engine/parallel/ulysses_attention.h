// Ulysses sequence-parallel causal attention.
//
// UlyssesAttention(q [b, s/p, hq, d], k/v [b, s/p, hkv, d]) on each of the p ranks of `sp`, with
// RoPE already applied using GLOBAL positions, returns this rank's [b, s/p, hq, d] slice of exact
// causal attention over the full sequence s:
//   all-to-all #1 (q, k, v fused into one exchange): [b, s/p, h, d] -> [b, s, h/p, d]
//   CausalAttention over the full sequence for the hq/p local query heads
//   all-to-all #2: [b, s, hq/p, d] -> [b, s/p, hq, d]
// Differentiable end to end (the exchanges are SeqAllToAll autograd Functions).
// GQA rule (spec::CheckUlyssesHeads, common/spec/model_shape.h, the one rule the spec validator
// and the planner use too): hq % p == 0; kv heads are sharded if hkv % p == 0, replicated p/hkv
// times (repeat_interleave) before the exchange if p % hkv == 0, otherwise rejected.
// p == 1 is plain CausalAttention. `sp` is borrowed and must outlive the autograd graph; every rank
// calls with the same shapes. Throws c10::Error on bad shapes, std::runtime_error on comm failure.
#ifndef ULYSSES_WORKER_ENGINE_PARALLEL_ULYSSES_ATTENTION_H_
#define ULYSSES_WORKER_ENGINE_PARALLEL_ULYSSES_ATTENTION_H_

#include <torch/torch.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/spec/model_shape.h"
#include "worker/engine/attention/attention.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/sequence_all_to_all.h"

namespace ulysses::engine {

// OK when hq query heads and hkv kv heads can be split over sp ranks; INVALID_ARGUMENT naming the
// numbers and the fix otherwise.
using spec::CheckUlyssesHeads;

// doc_ids (optional): [b, s] document id of every token of the FULL sequence (identical on every
// rank of `sp`); attention then never crosses a document (CausalAttention).
torch::Tensor UlyssesAttention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, Communicator* sp,
                               const AttentionOptions& opts, const torch::Tensor& doc_ids = {});

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_PARALLEL_ULYSSES_ATTENTION_H_
