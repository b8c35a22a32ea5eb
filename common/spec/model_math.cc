#include "common/spec/model_math.h"

#include <cmath>

#include "common/spec/memory_model.h"

namespace ulysses::spec {

double ModelFlopsPerToken(const ModelShape& shape, int64_t seq_len) {
  const ParameterCounts c = CountParameters(shape);
  const double h = static_cast<double>(shape.hidden_size);
  const double layers = static_cast<double>(shape.num_hidden_layers);
  const double lm_head = static_cast<double>(shape.vocab_size) * h;
  const double attention = 6 * layers * h * static_cast<double>(seq_len);
  return 6 * (layers * c.per_layer + lm_head) + attention;
}

double RecomputeFlopsPerToken(const ModelShape& shape, int64_t seq_len,
                              const RecomputeOptions& options) {
  const ParameterCounts c = CountParameters(shape);
  const double h = static_cast<double>(shape.hidden_size);
  const double layers = static_cast<double>(shape.num_hidden_layers);
  const double inter = static_cast<double>(shape.intermediate_size);
  const double vocab = static_cast<double>(shape.vocab_size);
  double flops = 0;
  if (options.activation_checkpointing) {
    // One more forward of every layer: 2 per parameter plus the forward third of attention,
    // which kept attention outputs do not run again.
    flops += 2 * layers * c.per_layer;
    if (!options.keep_attention_outputs) flops += 2 * layers * h * static_cast<double>(seq_len);
  } else if (options.tiled_mlp) {
    flops += 2 * layers * 3 * h * inter;  // The MLP forward again per tile.
  }
  if (options.tiled_loss) flops += 2 * vocab * h;  // Logits recomputed in the backward.
  return flops;
}

std::optional<double> Mfu(double flops_per_token, double tokens_per_s, int64_t devices,
                          double peak_flops_per_s) {
  if (!(flops_per_token > 0) || !(tokens_per_s >= 0)) return std::nullopt;
  return MfuOfFlopRate(flops_per_token * tokens_per_s, devices, peak_flops_per_s);
}

std::optional<double> MfuOfFlopRate(double model_flops_per_s, int64_t devices,
                                    double peak_flops_per_s) {
  if (!(model_flops_per_s >= 0) || !(peak_flops_per_s > 0) || devices < 1) return std::nullopt;
  const double mfu = model_flops_per_s / (static_cast<double>(devices) * peak_flops_per_s);
  if (!std::isfinite(mfu)) return std::nullopt;
  return mfu;
}

}  // namespace ulysses::spec
