// torch::ScalarType of the dtypes in common/dtype.h (the one table of names, sizes and
// safetensors codes): the only place the engine maps between the two.
#ifndef ULYSSES_WORKER_ENGINE_MODEL_TORCH_DTYPE_H_
#define ULYSSES_WORKER_ENGINE_MODEL_TORCH_DTYPE_H_

#include <torch/torch.h>

#include <optional>
#include <string_view>

#include "common/dtype.h"

namespace ulysses::engine {

// The torch type of a common/dtype.h entry (every entry has one).
inline torch::ScalarType TorchType(const DtypeInfo& d) {
  constexpr std::pair<std::string_view, torch::ScalarType> kTypes[] = {
      {"float32", torch::kFloat32}, {"bfloat16", torch::kBFloat16}, {"float16", torch::kFloat16},
      {"float64", torch::kFloat64}, {"int64", torch::kInt64},       {"int32", torch::kInt32},
      {"int16", torch::kInt16},     {"int8", torch::kInt8},         {"uint8", torch::kUInt8},
      {"bool", torch::kBool}};
  static_assert(std::size(kTypes) == std::size(kDtypes), "every dtype has a torch type");
  for (const auto& [name, type] : kTypes) {
    if (name == d.name) return type;
  }
  return torch::kFloat32;  // unreachable: the static_assert and the test keep the lists equal
}

// The common/dtype.h entry of a torch type, or null (complex, float8, ...).
inline const DtypeInfo* DtypeOf(torch::ScalarType t) {
  for (const DtypeInfo& d : kDtypes) {
    if (TorchType(d) == t) return &d;
  }
  return nullptr;
}

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_MODEL_TORCH_DTYPE_H_
