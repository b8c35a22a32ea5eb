// ZeRO stages 1-3 over ALL ranks of a stage (the world communicator, sp x dp: every rank of a
// Ulysses group holds the same weights, so the model state is sharded over every rank).
//
// Sharding: each parameter (n elements, flattened) is split into W = world.size() chunks of
// c = ceil(n / W) elements, the last padded with zeros; rank r owns chunk r. Collectives run per
// UNIT: unit 0 = the outer parameters (embed_tokens, final norm, lm_head), unit 1 + i = decoder
// layer i; one AllGather / ReduceScatterSum per unit moves the chunks of all its parameters.
//
//   stage 1: parameters and gradients full on every rank; AdamW state (moments and, for
//            bf16/fp16, the fp32 masters) only for the owned chunk. After the world all-reduce of
//            the gradients each rank updates its chunk, then the parameters are all-gathered.
//   stage 2: as 1, but gradients are reduce-scattered: each rank keeps only its chunk (an fp32
//            accumulator for bf16/fp16). With activation checkpointing this happens per layer
//            right after the layer's recomputed backward (LayerHooks); without it, after each
//            micro-batch's backward. The global gradient norm is the world sum of chunk norms.
//   stage 3: as 2, and the parameters themselves are chunks at rest (the module's tensors are
//            empty). A decoder layer's weights are all-gathered just before each use (forward and
//            the backward recompute) and freed right after; the outer unit is gathered for the
//            whole step (and for evaluation) and freed after it. Needs activation checkpointing
//            (the spec refuses stage 3 without it): backward re-gathers a layer by recomputing it.
//
// offload_optimizer (stages 1-3): the AdamW targets (chunk copies, fp32 masters) and moments live
// in host memory; each step copies the gradient chunk to the host, updates there and copies the
// chunk back to the device. On a CPU device the host copy is a separate CPU tensor: the same code
// path with the same numbers.
//
// Every stage equals stage 0 up to float reassociation (tests/worker/engine/train/zero_test.cc).
// Checkpoints: each rank saves only its chunks as pieces (checkpoint.h NamedTensor::full_shape); a
// resuming rank reads only the pieces overlapping its own chunks (resume.h ResumeShare), so any
// layout and stage resumes any checkpoint without any rank holding the whole state.
//
// Not thread-safe; borrows the model, the world communicator and the AdamW object. Hooks set on
// the model call back into this object: it must outlive the model's use.
#ifndef ULYSSES_WORKER_ENGINE_TRAIN_ZERO_H_
#define ULYSSES_WORKER_ENGINE_TRAIN_ZERO_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/model/llama.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/train/optimizer.h"

namespace ulysses::engine::train {

struct ZeroOptions {
  int stage = 0;                   // 1..3 (stage 0 needs no ZeroSharding)
  bool offload_optimizer = false;  // AdamW state and targets in host memory
  // The model's memory.activation_checkpointing: layers then reduce their gradient chunks in
  // backward (stage >= 2); stage 3 requires it.
  bool activation_checkpointing = false;
  // Sharded init (stage 3): the model's parameters are allocated but never written
  // (BuildModelStructure); Create makes each owned chunk one parameter at a time from
  // model::InitialParameter(name, shape, *init_seed), or zeros when init_seed is unset (a resume
  // overwrites them), converted to `dtype`, and frees the parameter. No rank ever writes a whole
  // model: peak = owned chunks + the largest single parameter in fp32.
  bool sharded_init = false;
  std::optional<uint64_t> init_seed;
  torch::Dtype dtype = torch::kFloat;
};

// Bytes of tensor storage a rank holds for its model state (bench/zero_memory).
struct ModelStateResidency {
  int64_t parameters = 0;  // module parameters (full or gathered) + owned parameter chunks
  int64_t gradients = 0;   // .grad tensors + chunk accumulators
  int64_t optimizer = 0;   // AdamW moments and masters (device or host)
};

// The chunk contract (defined once): a tensor of `numel` elements over `world` ranks has chunks of
// ZeroChunk elements; rank r owns the flat elements [begin, end) (possibly empty for small
// tensors).
int64_t ZeroChunk(int64_t numel, int world);
struct ElementRange {
  int64_t begin = 0, end = 0;
};
ElementRange ZeroOwnedRange(int64_t numel, int rank, int world);

class ZeroSharding {
 public:
  // Takes the model with its FULL weights loaded (identical on every rank), or at stage 3 with
  // ZeroOptions::sharded_init its unwritten structure; keeps the owned chunks (and, at stage 3,
  // frees the full weights). Collective-free.
  static absl::StatusOr<std::unique_ptr<ZeroSharding>> Create(model::LlamaForCausalLM model,
                                                              Communicator* world, AdamW* optimizer,
                                                              const ZeroOptions& options,
                                                              torch::Device device);
  ~ZeroSharding();
  ZeroSharding(const ZeroSharding&) = delete;
  ZeroSharding& operator=(const ZeroSharding&) = delete;

  int stage() const { return options_.stage; }
  // True when layers reduce their gradients in backward (stage >= 2 with checkpointing).
  bool per_layer_grads() const { return per_layer_grads_; }

  // Stage 3: all-gathers / frees the outer unit (embeddings, final norm, lm_head). Other stages:
  // no-ops. Collective (every rank, same order).
  absl::Status GatherOuter();
  void ReleaseOuter();

  // Stage >= 2, after one micro-batch's backward: reduce-scatters every parameter .grad still
  // present (the outer unit; every unit without per-layer hooks) into the chunk accumulators and
  // drops the full gradients. Collective.
  absl::Status ReduceRemainingGrads();

  // Stage >= 2: divides the gradient chunks by `divisor`, returns the global L2 norm (collective)
  // and, when clip > 0 and the norm exceeds it, scales the chunks by clip / norm.
  absl::StatusOr<double> FinishGrads(double divisor, double clip);
  // Stage >= 2: the AdamW update of the owned chunks (when apply), then the chunk accumulators are
  // zeroed; stage 2 all-gathers the parameters. Collective.
  absl::Status Update(double lr, bool apply);
  // Stage 1: the AdamW update of the owned chunks of the (world-averaged, clipped) full gradients
  // `grads` (in Params() order), then the parameters are all-gathered. Collective.
  absl::Status UpdateFromFullGrads(const std::vector<torch::Tensor>& grads, double lr);

  // Checkpoint pieces this rank owns: "model/<name>" and the AdamW state names (optimizer.h),
  // each the flat elements [r*c, min(n, (r+1)*c)) of the whole tensor (absent when empty): views
  // of the live chunks on the training device.
  std::vector<NamedTensor> OwnedCheckpointTensors() const;
  // Restores the owned state from loaded checkpoint tensors (any layout that wrote them): whole
  // tensors are sliced, pieces (LoadCheckpointShare of this rank's ZeroOwnedRange) must be exactly
  // the owned range. "model/<name>" tensors set the owned weight chunks (required at stage 3;
  // stages 1-2 also load the whole weights into the model before Create); the AdamW state is
  // restored from its whole tensors or pieces.
  absl::Status LoadOwnedState(const std::vector<NamedTensor>& tensors, int64_t adam_steps);

  // Chunks, host copies and gradient chunk accumulators this object holds (not the module's
  // parameters, their .grad or the AdamW state).
  ModelStateResidency Residency() const;
  // Called right after every gather and right before every gradient reduction, where the
  // transient full tensors peak (bench/zero_memory samples residency there).
  void SetObserver(std::function<void()> observer) { observer_ = std::move(observer); }

 private:
  struct Entry {
    std::string name;
    torch::Tensor param;  // the module's parameter (empty at rest at stage 3)
    std::vector<int64_t> shape;
    int64_t numel = 0, chunk = 0;
    size_t unit = 0;
    torch::Tensor shard;   // [chunk] in the parameter dtype on the device: the owned elements
    torch::Tensor grad;    // [chunk] accumulator (stage >= 2): fp32 for bf16/fp16, else param dtype
    torch::Tensor target;  // what AdamW updates: `shard`, or its host copy when offloading
  };
  ZeroSharding(model::LlamaForCausalLM model, Communicator* world, AdamW* optimizer,
               const ZeroOptions& options, torch::Device device);
  absl::Status GatherUnit(size_t unit);
  void ReleaseUnit(size_t unit);
  absl::Status ReduceUnitGrads(size_t unit);
  absl::Status StepShards(const std::vector<torch::Tensor>& chunk_grads, double lr);
  // Elements [rank*chunk, ...) of a whole tensor as a padded [chunk] tensor.
  torch::Tensor Slice(const Entry& e, const torch::Tensor& whole) const;
  int64_t OwnedLength(const Entry& e) const;

  model::LlamaForCausalLM model_;
  Communicator* world_;
  AdamW* optimizer_;
  ZeroOptions options_;
  torch::Device device_;
  int rank_ = 0, size_ = 1;
  bool per_layer_grads_ = false;
  std::vector<Entry> entries_;
  std::vector<std::vector<size_t>> units_;  // entry indices per unit
  NamedParams targets_;                     // (name, Entry::target) for AdamW
  std::function<void()> observer_;
};

}  // namespace ulysses::engine::train

#endif  // ULYSSES_WORKER_ENGINE_TRAIN_ZERO_H_
