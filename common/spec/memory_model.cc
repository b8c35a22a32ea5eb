#include "common/spec/memory_model.h"
#include "common/spec/job_spec_fields.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"

namespace ulysses::spec {

ParameterCounts CountParameters(const ModelShape& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double d = static_cast<double>(m.HeadDim());
  const double hq = static_cast<double>(m.num_attention_heads);
  const double hkv = static_cast<double>(m.num_key_value_heads);
  const double inter = static_cast<double>(m.intermediate_size);
  const double vocab = static_cast<double>(m.vocab_size);
  ParameterCounts c;
  // q, k, v, o projections; gate, up, down; two RMSNorm weights; the family's extras: q/k/v
  // biases (qwen2) and the per-head q_norm / k_norm weights (qwen3).
  c.per_layer = h * hq * d + 2 * h * hkv * d + hq * d * h + 3 * h * inter + 2 * h +
                (m.attention_bias ? hq * d + 2 * hkv * d : 0) + (m.qk_norm ? 2 * d : 0);
  c.embedding = vocab * h;
  const double embeddings = c.embedding * (m.tie_word_embeddings ? 1 : 2);
  c.total = embeddings + static_cast<double>(m.num_hidden_layers) * c.per_layer + h;
  c.largest_unit = std::max(c.per_layer, c.embedding);
  c.outer = embeddings + h;
  c.largest_tensor = std::max({c.embedding, h * inter, hq * d * h});
  return c;
}

int64_t DtypeBytes(const std::string& dtype) {
  const DtypeInfo* d = FindDtype(dtype);
  return d != nullptr ? d->bytes : 4;
}

ModelStateBytes ModelStatePerRank(const ModelStateInputs& in) {
  const double p = in.params.total;
  const double unit = in.params.outer + in.params.per_layer;  // O + Y
  const double w = static_cast<double>(std::max<int64_t>(1, in.world));
  const double b = static_cast<double>(DtypeBytes(in.dtype));
  const bool low_precision = b == 2;
  const double g = low_precision ? 4 : b;
  const double o = 2 * g + (low_precision ? 4 : 0);
  ModelStateBytes out;
  out.parameters = in.zero_stage >= 3 ? p * b / w : p * b;
  out.gradients = in.zero_stage >= 2 ? p * g / w : p * g;
  const double optimizer = in.zero_stage >= 1 ? p * o / w : p * o;
  // Stages 1-2 keep the owned parameter chunk as a copy next to the full parameters.
  if (in.zero_stage == 1 || in.zero_stage == 2) out.parameters += p * b / w;
  if (in.offload_optimizer) {
    // AdamW updates a host copy of the chunk, with its state, and copies the chunk back.
    out.host_optimizer = optimizer + (in.zero_stage >= 1 ? p * b / w : 0);
  } else {
    out.optimizer = optimizer;
  }
  if (in.zero_stage == 2) {
    out.gathered = (in.activation_checkpointing ? unit : p) * g;
  } else if (in.zero_stage >= 3) {
    out.gathered = unit * (b + g);
  }
  return out;
}

StartupBytes StartupPerRank(const ModelStateInputs& in) {
  const double p = in.params.total;
  const double largest = in.params.largest_tensor;
  const double w = static_cast<double>(std::max<int64_t>(1, in.world));
  const double b = static_cast<double>(DtypeBytes(in.dtype));
  const bool low_precision = b == 2;
  const double g = low_precision ? 4 : b;
  const double o = 2 * g + (low_precision ? 4 : 0);
  const int64_t z = in.zero_stage;
  const bool offload = in.offload_optimizer && z >= 1;
  // The owned chunks Create makes (zero.h): parameter chunk b, gradient chunk g (stage >= 2), the
  // host copy AdamW updates when offloading.
  const double chunk_device = z >= 1 ? p * b / w + (z >= 2 ? p * g / w : 0) : 0;
  const double chunk_host = offload ? p * b / w : 0;
  // The full model of stages 0-2 (seeded one parameter at a time); none at stage 3.
  const double full_model = z >= 3 ? 0 : p * b;
  // AdamW state (moments and fp32 masters) once restored.
  const double optimizer = z >= 1 ? p * o / w : p * o;
  StartupBytes out;
  // One parameter made whole in fp32 (InitialParameter), converted to the dtype (none for fp32),
  // zero-padded for the chunk split (stages 1-3): host memory.
  const double one_init = largest * (4 + (b == 4 ? 0 : b) + (z >= 1 ? b : 0));
  out.init_device = full_model + chunk_device;
  out.init_host = chunk_host + one_init;
  out.import_device = out.init_device;
  out.import_host = z >= 3 ? chunk_host + p * 4 / w + largest * 4 / w
                           : chunk_host + std::max(one_init, largest * (4 + 4));
  const double share = z >= 3 ? p * (b + o) / w : (z >= 1 ? p * b + p * o / w : p * (b + o));
  out.resume_device = full_model + chunk_device + (offload ? 0 : optimizer);
  out.resume_host = share + kCheckpointStreamBlockBytes + chunk_host + (offload ? optimizer : 0);
  out.export_host = 2 * b * largest;
  return out;
}

namespace {

double OptimizerBytesPerParameter(double b) {
  const bool low_precision = b == 2;
  const double g = low_precision ? 4 : b;
  return 2 * g + (low_precision ? 4 : 0);
}

std::string GiB(double bytes) {
  return absl::StrFormat("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
}

}  // namespace

double CheckpointStateBytes(const ParameterCounts& params, const std::string& dtype) {
  const double b = static_cast<double>(DtypeBytes(dtype));
  return params.total * (b + OptimizerBytesPerParameter(b));
}

double SnapshotBytesPerRank(const ParameterCounts& params, const std::string& dtype, int64_t world,
                            int64_t zero_stage) {
  const double w = static_cast<double>(std::max<int64_t>(1, world));
  const double total = CheckpointStateBytes(params, dtype);
  if (zero_stage >= 1 || w == 1) return total / w;
  const double b = static_cast<double>(DtypeBytes(dtype));
  const double largest = params.largest_unit * (b + OptimizerBytesPerParameter(b));
  return std::min(total, total / w + largest);
}

CheckpointModeChoice ChooseCheckpointMode(std::optional<bool> requested, double snapshot_bytes,
                                          double host_bytes_per_rank) {
  CheckpointModeChoice c;
  if (requested.has_value()) {
    c.async = *requested;
    c.reason = absl::StrCat(
        fields::PathOf(&CheckpointSpec::async), ": ", c.async ? "true" : "false",
        c.async ? absl::StrCat(" (snapshot ", GiB(snapshot_bytes), " of host memory per rank)")
                : "");
    return c;
  }
  if (host_bytes_per_rank <= 0) {
    c.reason = absl::StrCat("default: asynchronous (snapshot ", GiB(snapshot_bytes),
                            " per rank; host memory unknown)");
    return c;
  }
  const double budget = kSnapshotHostShare * host_bytes_per_rank;
  c.async = snapshot_bytes <= budget;
  c.reason = c.async
                 ? absl::StrCat("default: asynchronous (snapshot ", GiB(snapshot_bytes),
                                " per rank fits half of the ", GiB(host_bytes_per_rank),
                                " of host memory per rank)")
                 : absl::StrCat(
                       "default fell back to synchronous: the snapshot needs ", GiB(snapshot_bytes),
                       " of host memory per rank, more than half of the ", GiB(host_bytes_per_rank),
                       " per rank (add host memory, raise zero_stage or sp/dp to shrink each "
                       "rank's part, or set spec.checkpoint.async=true to force it)");
  return c;
}

ActivationBytes ActivationBytesPerRank(const ActivationInputs& in) {
  const ModelShape& m = in.shape;
  const double b = static_cast<double>(DtypeBytes(in.dtype));
  const double u = std::max(b, 4.0);  // RMSNorm and logits upcast to fp32 (fp64 stays)
  // Tokens a rank holds per micro-batch: micro_batch_size rows of N/P.
  const double n = static_cast<double>(in.tokens);
  const double h = static_cast<double>(m.hidden_size);
  const double inter = static_cast<double>(m.intermediate_size);
  const double layers = static_cast<double>(m.num_hidden_layers);
  const double d = static_cast<double>(m.HeadDim());
  const double hq = static_cast<double>(m.num_attention_heads);
  const double hkv = static_cast<double>(m.num_key_value_heads);
  const double hx = static_cast<double>(in.kv_heads_exchanged);
  const double vocab = static_cast<double>(m.vocab_size);
  const bool ckpt = in.activation_checkpointing;
  const bool tiled_mlp = in.tiled_mlp;
  const double mlp_tile = std::min(n, h);  // the engine's MLP tile: H tokens
  // One layer's saved tensors per token (elements x bytes): two RMSNorms (fp32 input
  // copy + normalized), q and k before RoPE and rotated, the attention inputs after the
  // exchange (n*(Hq + 2Hkv')*D), its output and log-sum-exp, o_proj's input (a second
  // copy after the return exchange when P > 1), and the MLP's gate, silu, up and product
  // (a tile input only with tiled_mlp).
  const double per_token_layer = 2 * h * (u + b) + 2 * h * b + 2 * hkv * d * b +
                                 (hq + 2 * hx) * d * b + (in.sp > 1 ? 2 : 1) * h * b + hq * b +
                                 (tiled_mlp ? 0 : 4 * inter * b);
  const double layer_saved = n * per_token_layer;
  const double final_norm = n * h * (u + b);
  ActivationBytes a;
  // Checkpointing keeps each layer's input; offload_activations moves them to the host
  // (on a GPU) and keeps two layers' inputs on the device for the transfer.
  // Kept attention outputs add each layer's local attention output (n*Hq*D in the dtype) and
  // its fp32 log-sum-exp (n*Hq), on the device also when the inputs are offloaded.
  const double ckpt_inputs = layers * n * h * b;
  const double kept = in.keep_attention_outputs ? layers * n * (hq * d * b + hq * 4) : 0;
  if (ckpt) {
    if (in.offload_activations) {
      a.saved = final_norm + 2 * n * h * b + kept;
      a.host = ckpt_inputs;
    } else {
      a.saved = final_norm + ckpt_inputs + kept;
    }
  } else {
    a.saved = final_norm + layers * layer_saved;
  }
  // Backward of one layer: its recomputed forward (checkpointing), gradients in flight
  // (4 n*H), the attention backward's copies (5 n*H + 4 n*Hkv'*D), the all-to-all send and
  // receive buffers (P > 1), and the MLP's gradients (3 n*I) or one tile recomputed with
  // its gradients (7 t*I).
  const double a2a = in.sp > 1 ? 2 * n * (hq + 2 * hx) * d * b : 0;
  const double mlp = tiled_mlp ? 7 * mlp_tile * inter * b : 3 * n * inter * b;
  const double layer_working =
      (ckpt ? layer_saved : 0) + n * b * (4 * h + 5 * h + 4 * hx * d) + a2a + mlp;
  // The loss: with tiled_loss, one tile's fp32 logits, softmax and the bf16 gradient plus
  // the full lm_head gradient and the hidden gradient; without, the whole [n, V] logits
  // in the dtype, fp32 and log-softmax and its gradient.
  const double tile = in.tiled_loss ? std::min(n, static_cast<double>(in.loss_tile_tokens)) : n;
  const double loss_working = in.tiled_loss ? tile * vocab * (2 * u + b) + vocab * h * b + n * h * b
                                            : n * vocab * (b + 3 * u) + n * h * b;
  a.working = std::max(layer_working, loss_working);
  return a;
}

}  // namespace ulysses::spec
