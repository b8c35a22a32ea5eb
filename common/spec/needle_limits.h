// The synthetic "needle" generator's limits, one definition for the spec validator
// (job_spec_validate.cc) and the generator itself (worker/engine/data/dataset.h, NeedleVocab).
#ifndef ULYSSES_COMMON_SPEC_NEEDLE_LIMITS_H_
#define ULYSSES_COMMON_SPEC_NEEDLE_LIMITS_H_

#include <cstdint>

namespace ulysses::spec {

// 8 reserved ids, then keys, their values and filler: 64 ids hold at least one key with values.
inline constexpr int64_t kNeedleMinVocab = 64;
// One needle and its query per 16 tokens (NeedleLayout::NeedlesFor): at least one.
inline constexpr int64_t kNeedleMinSeqLen = 16;

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_NEEDLE_LIMITS_H_
