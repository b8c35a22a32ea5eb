#include "common/spec/memory_model.h"

#include <algorithm>

namespace ulysses::spec {

ParameterCounts CountParameters(const ModelShape& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double d = static_cast<double>(m.head_dim());
  const double hq = static_cast<double>(m.num_attention_heads);
  const double hkv = static_cast<double>(m.num_key_value_heads);
  const double inter = static_cast<double>(m.intermediate_size);
  const double vocab = static_cast<double>(m.vocab_size);
  ParameterCounts c;
  // q, k, v, o projections; gate, up, down; two RMSNorm weights.
  c.per_layer = h * hq * d + 2 * h * hkv * d + hq * d * h + 3 * h * inter + 2 * h;
  c.embedding = vocab * h;
  const double embeddings = c.embedding * (m.tie_word_embeddings ? 1 : 2);
  c.total = embeddings + static_cast<double>(m.num_hidden_layers) * c.per_layer + h;
  c.largest_unit = std::max(c.per_layer, c.embedding);
  return c;
}

int64_t DtypeBytes(const std::string& dtype) {
  if (dtype == "float64") {
    return 8;
  }
  if (dtype == "bfloat16" || dtype == "float16") {
    return 2;
  }
  return 4;
}

ModelStateBytes ModelStatePerRank(const ModelStateInputs& in) {
  const double p = in.params.total;
  const double l = in.params.largest_unit;
  const double w = static_cast<double>(std::max<int64_t>(1, in.world));
  const double b = static_cast<double>(DtypeBytes(in.dtype));
  const bool low_precision = b == 2;
  const double g = low_precision ? 4 : b;
  const double o = 2 * g + (low_precision ? 4 : 0);
  ModelStateBytes out;
  out.parameters = in.zero_stage >= 3 ? p * b / w : p * b;
  out.gradients = in.zero_stage >= 2 ? p * g / w : p * g;
  const double optimizer = in.zero_stage >= 1 ? p * o / w : p * o;
  if (in.offload_optimizer) {
    out.host_optimizer = optimizer;
  } else {
    out.optimizer = optimizer;
  }
  if (in.zero_stage == 2) {
    out.gathered = l * g;
  } else if (in.zero_stage >= 3) {
    out.gathered = 2 * l * (b + g);
  }
  return out;
}

}  // namespace ulysses::spec
