// The element types the project names, defined once: the spelling used by job specs
// (spec.model.dtype), checkpoint shard tables, HF configs (torch_dtype) and exports; the
// safetensors code; bytes per element; and whether model weights may be stored in it. The
// engine's torch::ScalarType for each is in worker/engine/model/torch_dtype.h; the memory model
// (common/spec/memory_model.h) and the spec validator read sizes and names from here.
#ifndef ULYSSES_COMMON_DTYPE_H_
#define ULYSSES_COMMON_DTYPE_H_

#include <string>
#include <string_view>
#include <vector>

namespace ulysses {

struct DtypeInfo {
  std::string_view name;         // "bfloat16": specs, checkpoints, HF torch_dtype
  std::string_view safetensors;  // "BF16"
  int bytes = 0;                 // per element
  bool weight = false;           // model weights may use it (spec.model.dtype, exports)
};

inline constexpr DtypeInfo kDtypes[] = {
    {"float32", "F32", 4, true}, {"bfloat16", "BF16", 2, true}, {"float16", "F16", 2, true},
    {"float64", "F64", 8, true}, {"int64", "I64", 8, false},    {"int32", "I32", 4, false},
    {"int16", "I16", 2, false},  {"int8", "I8", 1, false},      {"uint8", "U8", 1, false},
    {"bool", "BOOL", 1, false},
};

// The entry named `name` ("bfloat16"), or null.
constexpr const DtypeInfo* FindDtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

// The entry whose safetensors code is `code` ("BF16"), or null.
constexpr const DtypeInfo* FindSafetensorsDtype(std::string_view code) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.safetensors == code) return &d;
  }
  return nullptr;
}

// "float32, bfloat16, float16 or float64" (safetensors codes: "F32, BF16, F16 or F64"): the
// weight dtypes, for error messages.
inline std::string WeightDtypeList(bool safetensors = false) {
  std::vector<std::string_view> names;
  for (const DtypeInfo& d : kDtypes) {
    if (d.weight) names.push_back(safetensors ? d.safetensors : d.name);
  }
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

}  // namespace ulysses

#endif  // ULYSSES_COMMON_DTYPE_H_
