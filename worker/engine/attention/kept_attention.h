// Kept attention: selective activation checkpointing for the attention kernel
// (MemoryOptions::keep_attention_outputs, spec memory.keep_attention_outputs).
//
// A checkpointed decoder layer runs its forward without saving activations and runs it again in
// backward to rebuild them (model::Checkpoint). The attention forward is the most expensive part
// of that recompute at long sequences (a second flash forward, O(s^2)). With kept attention the
// layer's first forward runs under a KeepAttentionScope in kRecord mode: every CausalAttention
// call computes its output AND its per-row log-sum-exp (what the kernel's backward needs) and
// appends them to the layer's KeptAttention. The recompute runs in kReplay mode: each
// CausalAttention call takes the next entry instead of running the forward kernel, returns the
// kept output, and its backward runs the kernel's backward on the recomputed q, k, v with the
// kept output and log-sum-exp. Gradients equal those of the full recompute: the same backward
// kernel gets the same inputs.
//
// Cost: per layer, the local attention output [b, s, hq/p, d] (the size of the layer's input)
// and the log-sum-exp [b, hq/p, s] fp32 stay from forward to backward.
//
// Kernels (attention.cc): the CPU blockwise kernel keeps its own output and lse; on CUDA
// (libtorch >= 2) the fused op that libtorch's dispatcher picks (cuDNN, flash or efficient) is
// called directly with compute_log_sumexp, and its backward op is called on replay; both ops
// are bound by their schemas' argument names (FusedAttentionBinding), so a libtorch whose
// schemas differ is detected when the op is first bound, and then that op's calls are recorded as
// "not kept" and recomputed as before. Document-masked CUDA attention is never kept.
//
// Scopes are per thread (the autograd engine runs a CUDA backward on its device thread: the
// recompute and its scope run there together). Not thread-safe otherwise: a KeptAttention
// belongs to one checkpointed call.
#ifndef ULYSSES_WORKER_ENGINE_ATTENTION_KEPT_ATTENTION_H_
#define ULYSSES_WORKER_ENGINE_ATTENTION_KEPT_ATTENTION_H_

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ulysses::engine {

// One attention call's kept forward: the output as the kernel returned it, its log-sum-exp, and
// (fused CUDA ops) every value the forward op returned, for its backward.
struct KeptAttentionEntry : torch::CustomClassHolder {
  bool kept = false;  // false: the call ran without keeping (the replay recomputes it)
  torch::Tensor out;  // kernel layout (blockwise: [b, s, hq, d]; SDPA ops: [b, h, s, d])
  torch::Tensor lse;
  std::vector<c10::IValue> forward_returns;  // fused ops: the forward op's returns, in order
  std::string op;                            // the op that produced it ("blockwise", "aten::...")
};

// The entries of one checkpointed call, in the order its attention calls ran.
class KeptAttention : public torch::CustomClassHolder {
 public:
  void Push(c10::intrusive_ptr<KeptAttentionEntry> entry);
  // The next entry in recording order; throws c10::Error when none is left (the recompute ran
  // more attention calls than the forward it replays).
  c10::intrusive_ptr<KeptAttentionEntry> Pop();
  bool empty() const { return entries_.empty(); }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Bytes of the kept tensors (outputs and log-sum-exps).
  int64_t bytes() const;

 private:
  std::deque<c10::intrusive_ptr<KeptAttentionEntry>> entries_;
};

enum class KeepMode { kRecord, kReplay };

// Sets this thread's current KeptAttention and mode until destroyed (scopes nest; the innermost
// wins). `kept` is borrowed and must outlive the scope.
class KeepAttentionScope {
 public:
  KeepAttentionScope(KeptAttention* kept, KeepMode mode);
  ~KeepAttentionScope();
  KeepAttentionScope(const KeepAttentionScope&) = delete;
  KeepAttentionScope& operator=(const KeepAttentionScope&) = delete;

  KeptAttention* kept() const { return kept_; }
  KeepMode mode() const { return mode_; }
  // This thread's innermost scope, or nullptr.
  static KeepAttentionScope* Current();

 private:
  KeptAttention* kept_;
  KeepMode mode_;
  KeepAttentionScope* outer_;
};

// Forward kernel runs of CausalAttention in this process, kept or not (a replayed call does not
// run one). Tests and benches read it to see that a replay skipped the forward.
int64_t CausalAttentionForwardRuns();
void CountCausalAttentionForward();

// A fused attention op and its backward, bound by argument and return names:
//  forward arguments: query, key, value; attn_bias/attn_mask = None; compute_log_sumexp = true;
//    dropout_p = 0; is_causal = true; return_debug_mask = false; scale = None; any other must
//    have a default.
//  forward returns: "output" and "logsumexp" (or "log_sumexp") must be named.
//  backward arguments: grad_out (or grad_out_); query, key, value; out = the forward's output;
//    logsumexp = its log-sum-exp; any name the forward returned = that return (philox_seed and
//    philox_offset also match returns named rng_state and unused); attn_bias = an
//    undefined tensor; dropout_p, is_causal, scale as above; grad_input_mask = [1, 1, 1, 0];
//    any other must have a default. The first three returns are dq, dk, dv.
// An error names the argument that cannot be filled (the op is then not kept).
class FusedAttentionBinding {
 public:
  static absl::StatusOr<FusedAttentionBinding> Bind(const c10::FunctionSchema& forward,
                                                    const c10::FunctionSchema& backward);

  // The argument stacks (tests read them; Forward/Backward use them).
  std::vector<c10::IValue> ForwardStack(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v) const;
  std::vector<c10::IValue> BackwardStack(const torch::Tensor& grad, const torch::Tensor& q,
                                         const torch::Tensor& k, const torch::Tensor& v,
                                         const std::vector<c10::IValue>& forward_returns) const;
  int64_t output_index() const { return output_index_; }
  int64_t lse_index() const { return lse_index_; }

 private:
  enum class Source { kQuery, kKey, kValue, kGrad, kForwardReturn, kConstant };
  struct Arg {
    Source source = Source::kConstant;
    int64_t index = 0;  // kForwardReturn: which return
    c10::IValue value;  // kConstant
  };
  // One call's arguments in order (the forward's have no kGrad or kForwardReturn).
  static std::vector<c10::IValue> Stack(const std::vector<Arg>& args, const torch::Tensor& grad,
                                        const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v,
                                        const std::vector<c10::IValue>& forward_returns);
  std::vector<Arg> forward_args_, backward_args_;
  int64_t output_index_ = 0, lse_index_ = 1;
};

// The registered op `name` (e.g. "aten::_scaled_dot_product_cudnn_attention") and its
// "<name>_backward", bound; an error when either is not registered in this libtorch or does not
// bind (FusedAttentionBinding::Bind).
struct FusedAttentionOp {
  c10::OperatorHandle forward, backward;
  FusedAttentionBinding binding;
  std::string name;
};
absl::StatusOr<FusedAttentionOp> FindFusedAttentionOp(const std::string& name);

// Runs op's forward on q, k, v ([b, h, s, d] as SDPA takes them), keeping what its backward needs.
c10::intrusive_ptr<KeptAttentionEntry> RunFusedAttentionForward(const FusedAttentionOp& op,
                                                                const torch::Tensor& q,
                                                                const torch::Tensor& k,
                                                                const torch::Tensor& v);
// dq, dk, dv of a kept forward for the output gradient `grad`; `out` is its output (which the
// replay's autograd node holds, not the entry: an entry holding the node's own output would keep
// the node alive through it).
std::vector<torch::Tensor> RunFusedAttentionBackward(const FusedAttentionOp& op,
                                                     const KeptAttentionEntry& entry,
                                                     const torch::Tensor& grad,
                                                     const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v,
                                                     const torch::Tensor& out);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_ATTENTION_KEPT_ATTENTION_H_
