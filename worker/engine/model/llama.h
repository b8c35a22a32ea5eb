// Llama decoder (Hugging Face LlamaForCausalLM layout) for Ulysses training.
//
// Parameter names and shapes are exactly HF's: named_parameters() yields
// model.embed_tokens.weight, model.layers.<i>.self_attn.{q,k,v,o}_proj.weight,
// model.layers.<i>.mlp.{gate,up,down}_proj.weight,
// model.layers.<i>.{input,post_attention}_layernorm.weight, model.norm.weight and
// lm_head.weight (absent when tie_word_embeddings).
//
// The model knows nothing about process groups: attention is a callback
// (AttentionFn) that the caller binds to Ulysses attention over its sp
// communicator (or to a local causal attention at sp 1). Every rank runs the
// model on its local sequence shard [b, s/p] with GLOBAL position ids.
//
// Memory options: tiled loss (logits never materialised beyond one tile of
// loss_tile_tokens x vocab, recomputed tile by tile in backward), per-layer
// activation checkpointing and tiled MLP (both recompute in backward).
//
// Not thread-safe: one model per rank, used by one thread. Errors are returned
// as Status only from the factory; forward/loss throw c10::Error like any
// libtorch module (the training loop catches them at the engine edge).
#ifndef ULYSSES_WORKER_ENGINE_MODEL_LLAMA_H_
#define ULYSSES_WORKER_ENGINE_MODEL_LLAMA_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/model_shape.h"

namespace ulysses::engine::model {

// Shape of the decoder: the one model-shape struct of common/spec/model_shape.h (HF
// LlamaConfig names, rope_scaling included; Validate() checks every field and names it).
using LlamaConfig = spec::ModelShape;

// Memory-saving execution options (all change memory, never results beyond
// floating-point reassociation).
struct MemoryOptions {
  bool activation_checkpointing = false;  // Recompute each decoder layer in backward.
  bool tiled_mlp = false;                 // MLP over sequence tiles, recomputed in backward.
  int64_t mlp_tile_tokens = 0;            // Tokens per MLP tile (0 = hidden_size).
  bool tiled_loss = false;                // Logits + CE in tiles, recomputed in backward.
  int64_t loss_tile_tokens = 4096;        // Tokens per loss tile.
  // With activation_checkpointing: each layer's saved input lives in host memory (pinned on
  // CUDA, copied without blocking) from forward to backward. On CPU the copy is an identical
  // host tensor: same code path, same numbers.
  bool offload_activations = false;
  // With activation_checkpointing (or ZeRO's checkpointed layers): each layer keeps its attention
  // output and log-sum-exp from forward, so its recompute in backward skips the attention forward
  // (selective checkpointing, worker/engine/attention/kept_attention.h). Costs one more [b, s/p, H]
  // per layer (and an fp32 [hq/p, s] log-sum-exp).
  bool keep_attention_outputs = false;
  // Speed levers (issue 25), results equal up to floating-point rounding, each measured on the
  // GPU (docs/BENCHMARKS.md "GPU", engine_bench --fuse-gate-up / --no-fused-rms-norm):
  // one GEMM for gate_proj and up_proj against their concatenated weights (untiled MLP only; the
  // parameters stay two, as in Hugging Face checkpoints). Off: 5 % slower at 8k on an H200;
  bool fuse_gate_up = false;
  // at::rms_norm (libtorch >= 2.4; fused CUDA kernel from 2.7) instead of the composite RMSNorm;
  // no effect on older libtorch. On: +10 % tokens/s at 8k, +6 % at 32k on an H200.
  bool fused_rms_norm = true;
};

// Called around every use of one decoder layer (ZeRO-2/3, worker/engine/train/zero.h): the layer
// then always runs through Checkpoint (its input is saved, the layer recomputed in backward).
// Hooks report failure by throwing c10::Error (they run inside autograd).
struct LayerHooks {
  std::function<void(int64_t layer)> before_use;      // forward and recompute: weights needed
  std::function<void(int64_t layer)> after_use;       // the layer's weights may be freed
  std::function<void(int64_t layer)> after_backward;  // the layer's parameter grads are final
  bool empty() const { return !before_use && !after_use && !after_backward; }
};

// Options of one Checkpoint call (all optional).
struct CheckpointOptions {
  std::function<void()> before_run;      // before forward and before the recompute
  std::function<void()> after_run;       // after forward, and after the backward
  std::function<void()> after_backward;  // after the recomputed backward, before after_run
  bool offload_input = false;            // keep the saved input in host memory until backward
  // Keep every CausalAttention call's output and log-sum-exp from the forward; the recompute
  // replays them instead of running the attention forward again (kept_attention.h).
  bool keep_attention = false;
};

// q [b, s/p, hq, d], k/v [b, s/p, hkv, d] (RoPE applied at global positions), doc_ids [b, s]
// (document of every token of the FULL sequence; undefined = one document per row)
// -> [b, s/p, hq, d]: causal attention over the FULL sequence, never across documents.
using AttentionFn =
    std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& doc_ids)>;

// Result of LossSum: loss_sum is a differentiable scalar (sum of per-token CE
// over valid labels); tokens = number of valid labels. Accuracy fields are
// filled only when asked for (argmax == label over accuracy_mask positions).
struct LossOutput {
  torch::Tensor loss_sum;
  int64_t tokens = 0;
  int64_t correct = 0;
  int64_t accuracy_tokens = 0;
};

inline constexpr int64_t kIgnoreIndex = -100;

// RoPE inverse frequencies [d/2] in fp64: rope_theta^(-2i/d), rescaled per
// config.rope_scaling (llama3, linear: see spec::RopeScaling). Throws c10::Error on a rope
// type it does not implement (a validated config has none).
torch::Tensor RopeInverseFrequencies(const LlamaConfig& config);
// cos/sin tables [s/p, d] for position_ids [s/p] (or [b, s/p, d] for per-row position_ids
// [b, s/p], e.g. packed documents restarting at 0) in the HF rotate_half layout, from
// RopeInverseFrequencies(config).
std::pair<torch::Tensor, torch::Tensor> RopeCosSin(const torch::Tensor& position_ids,
                                                   const LlamaConfig& config, torch::Dtype dtype,
                                                   torch::Device device);
// x [b, s/p, h, d]; cos/sin [s/p, d] or [b, s/p, d].
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// Runs fn(x) without saving activations and recomputes it in backward.
// Parameter gradients reached by fn accumulate into their .grad directly
// (reentrant backward), like PyTorch's reentrant checkpoint. fn must be
// deterministic; collectives inside fn run again, in the same order, on every rank.
torch::Tensor Checkpoint(std::function<torch::Tensor(const torch::Tensor&)> fn,
                         const torch::Tensor& x, const CheckpointOptions& options = {});

// The host copy activation offload keeps: pinned and filled without blocking for a CUDA tensor,
// a plain copy for a CPU one; ToDevice moves it back (non-blocking from pinned memory).
torch::Tensor OffloadToHost(const torch::Tensor& x);
torch::Tensor ReloadToDevice(const torch::Tensor& host, torch::Device device);

// Sum of token cross-entropy of hidden [n, H] against weight [V, H] and labels [n]
// (kIgnoreIndex skipped), computed tile_tokens rows at a time, fused with its gradient: when
// grad mode is on and an input requires grad, each tile's grad_hidden and grad_weight are made
// from its logits in the forward (kept until backward, which only scales them), so logits are
// never recomputed. Never holds more than tile_tokens x V logits (fp32 for that tile only).
torch::Tensor TiledCrossEntropySum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, int64_t tile_tokens);

// The initial value of parameter `name` of `shape` for `seed`, fp32 on CPU: 1-D (RMSNorm) weights
// are 1, matrices ~ N(0, 0.02) from a generator seeded by (seed, name) alone. A parameter's init
// depends on no other parameter, dtype, device or layout: any rank can make any one tensor alone
// (ZeRO-3 ranks generate one at a time and keep their chunk).
torch::Tensor InitialParameter(const std::string& name, c10::IntArrayRef shape, uint64_t seed);

// A bias-free linear layer: weight [out, in]. Construction allocates the weight without writing it
// (InitWeights, a loader or ZeRO-3's sharded init writes or frees it), so a model under
// construction holds no written whole-model copy. forward is torch::nn::Linear's without bias.
class LinearNoBiasImpl : public torch::nn::Module {
 public:
  LinearNoBiasImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);  // [..., in] -> [..., out]
  torch::Tensor weight;
};
TORCH_MODULE(LinearNoBias);

// Token embeddings: weight [vocab, H], allocated unwritten like LinearNoBias. forward is
// torch::nn::Embedding's: ids [...] -> [..., H].
class TokenEmbeddingImpl : public torch::nn::Module {
 public:
  TokenEmbeddingImpl(int64_t vocab, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;
};
TORCH_MODULE(TokenEmbedding);

class RMSNormImpl : public torch::nn::Module {
 public:
  // fused: at::rms_norm where libtorch has it (MemoryOptions::fused_rms_norm).
  RMSNormImpl(int64_t dim, double eps, bool fused = false);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
  [[maybe_unused]] bool fused_;  // Read only where libtorch has at::rms_norm (2.4+).
};
TORCH_MODULE(RMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  // x [b, s/p, H] -> [b, s/p, H]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const AttentionFn& attention, const torch::Tensor& doc_ids);
  LinearNoBias q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(const LlamaConfig& config, const MemoryOptions& memory);
  // x [b, s/p, H] -> [b, s/p, H]; down(silu(gate(x)) * up(x)).
  torch::Tensor forward(const torch::Tensor& x);
  LinearNoBias gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  torch::Tensor Dense(const torch::Tensor& x);
  MemoryOptions memory_;
  int64_t hidden_size_;
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& config, const MemoryOptions& memory);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const AttentionFn& attention, const torch::Tensor& doc_ids);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const LlamaConfig& config, const MemoryOptions& memory);
  // input_ids [b, s/p] int64, position_ids [s/p] or [b, s/p] int64 (RoPE positions of the local
  // shard), doc_ids [b, s] (global document layout, optional) -> [b, s/p, H] (final-normed).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                        const AttentionFn& attention, const torch::Tensor& doc_ids = {});
  TokenEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  // ZeRO per-layer gather/release (empty = none).
  void SetLayerHooks(LayerHooks hooks) { hooks_ = std::move(hooks); }

 private:
  LayerHooks hooks_;
  LlamaConfig config_;
  MemoryOptions memory_;
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  LlamaForCausalLMImpl(const LlamaConfig& config, const MemoryOptions& memory);

  // Deterministic init from seed, one parameter at a time (InitialParameter: keyed by the
  // parameter's name, generated in fp32 on CPU and copied into the parameter's dtype and device).
  // The same seed gives the same weights for every dtype, device and parallel layout.
  void InitWeights(uint64_t seed);

  // Final hidden states [b, s/p, H] of the local shard.
  torch::Tensor Hidden(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                       const AttentionFn& attention, const torch::Tensor& doc_ids = {});
  // Loss of the local shard: labels [b, s/p] (kIgnoreIndex = no target).
  // accuracy_mask [b, s/p] bool (optional): count argmax hits at these positions.
  // doc_ids [b, s] (optional): packed documents; attention stays inside each document.
  LossOutput Loss(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                  const torch::Tensor& labels, const AttentionFn& attention,
                  const torch::Tensor& accuracy_mask = {}, const torch::Tensor& doc_ids = {});

  // The LM head weight [V, H] (embed_tokens.weight when tied).
  torch::Tensor HeadWeight() const;
  const LlamaConfig& config() const { return config_; }

  LlamaModel model{nullptr};
  LinearNoBias lm_head{nullptr};

 private:
  LlamaConfig config_;
  MemoryOptions memory_;
};
TORCH_MODULE(LlamaForCausalLM);

// Parses spec.model.dtype.
absl::StatusOr<torch::Dtype> ParseDtype(const std::string& name);

}  // namespace ulysses::engine::model

#endif  // ULYSSES_WORKER_ENGINE_MODEL_LLAMA_H_
