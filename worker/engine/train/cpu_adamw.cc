#include "worker/engine/train/cpu_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

namespace ulysses::engine::train {
namespace {

// Elements per task: below this a tensor is updated on the calling thread (each element moves
// about 20 bytes, so a task is ~640 KB of memory traffic).
constexpr int64_t kGrain = 1 << 15;

// The step's scalars, each rounded to fp32 once as libtorch rounds a Scalar operand of an fp32
// tensor op.
struct Scalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2, eps, neg_step;
};

inline float Bits2Float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint32_t Float2Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// c10::BFloat16's round-to-nearest-even, NaN -> 0x7FC0, in a form the vectoriser takes.
inline uint16_t RoundToBf16(float f) {
  const uint32_t u = Float2Bits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return nan ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}

template <typename GradT>
inline float LoadGrad(const GradT* g, int64_t i);
template <>
inline float LoadGrad<float>(const float* g, int64_t i) {
  return g[i];
}
template <>
inline float LoadGrad<uint16_t>(const uint16_t* g, int64_t i) {
  return Bits2Float(static_cast<uint32_t>(g[i]) << 16);
}

// The element loop; kDecay and kBf16Out are template flags so that each instance is a straight
// loop without branches.
template <typename GradT, bool kDecay, bool kBf16Out>
__attribute__((always_inline)) inline void Body(float* __restrict w, float* __restrict m,
                                                float* __restrict v, const GradT* __restrict g,
                                                uint16_t* __restrict out, int64_t n,
                                                const Scalars& s) {
  const float decay = s.decay, b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2,
              c2 = s.one_minus_beta2, bc2 = s.bias_correction2, eps = s.eps, step = s.neg_step;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = LoadGrad(g, i);
    float wi = w[i];
    if (kDecay) wi = wi * decay;
    const float mi = std::fma(gi, c1, m[i] * b1);
    const float vi = std::fma(c2 * gi, gi, v[i] * b2);
    const float denom = std::sqrt(vi / bc2) + eps;
    wi = wi + step * mi / denom;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
    if (kBf16Out) out[i] = RoundToBf16(wi);
  }
}

// One clone of each loop per ISA (GCC and Clang on x86-64 Linux: ifunc-dispatched at load time).
// By feature, not by "arch=" (which matches one CPU model exactly, so that any newer CPU took the
// baseline clone and its fma library calls): AVX-512F (which implies FMA), FMA (AVX), baseline.
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define ULYSSES_ISA_CLONES __attribute__((target_clones("avx512f", "fma", "default")))
#else
#define ULYSSES_ISA_CLONES
#endif

#define ULYSSES_DEFINE_LOOP(NAME, GRAD, DECAY, BF16)                                       \
  ULYSSES_ISA_CLONES void NAME(float* w, float* m, float* v, const GRAD* g, uint16_t* out, \
                               int64_t n, const Scalars& s) {                              \
    Body<GRAD, DECAY, BF16>(w, m, v, g, out, n, s);                                        \
  }
ULYSSES_DEFINE_LOOP(LoopF32, float, false, false)
ULYSSES_DEFINE_LOOP(LoopF32Decay, float, true, false)
ULYSSES_DEFINE_LOOP(LoopF32Bf16, float, false, true)
ULYSSES_DEFINE_LOOP(LoopF32DecayBf16, float, true, true)
ULYSSES_DEFINE_LOOP(LoopBf16, uint16_t, false, false)
ULYSSES_DEFINE_LOOP(LoopBf16Decay, uint16_t, true, false)
ULYSSES_DEFINE_LOOP(LoopBf16Bf16, uint16_t, false, true)
ULYSSES_DEFINE_LOOP(LoopBf16DecayBf16, uint16_t, true, true)
#undef ULYSSES_DEFINE_LOOP

bool CpuContiguous(const torch::Tensor& t, torch::ScalarType type, int64_t numel) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous() &&
         t.numel() == numel;
}

}  // namespace

bool CpuAdamWApplies(const CpuAdamWTensors& t) {
  if (!t.target.defined()) return false;
  const int64_t n = t.target.numel();
  if (!CpuContiguous(t.target, torch::kFloat, n) || !CpuContiguous(t.exp_avg, torch::kFloat, n) ||
      !CpuContiguous(t.exp_avg_sq, torch::kFloat, n)) {
    return false;
  }
  if (!CpuContiguous(t.grad, torch::kFloat, n) && !CpuContiguous(t.grad, torch::kBFloat16, n)) {
    return false;
  }
  return !t.param.defined() || CpuContiguous(t.param, torch::kBFloat16, n);
}

void CpuAdamWUpdate(const std::vector<CpuAdamWTensors>& tensors, const CpuAdamWStep& step) {
  const double t = static_cast<double>(step.step);
  const double bc1 = 1.0 - std::pow(step.beta1, t);
  const double bc2 = 1.0 - std::pow(step.beta2, t);
  const Scalars s{static_cast<float>(1.0 - step.lr * step.weight_decay),
                  static_cast<float>(step.beta1),
                  static_cast<float>(1.0 - step.beta1),
                  static_cast<float>(step.beta2),
                  static_cast<float>(1.0 - step.beta2),
                  static_cast<float>(bc2),
                  static_cast<float>(step.eps),
                  static_cast<float>(-step.lr / bc1)};
  for (const CpuAdamWTensors& e : tensors) {
    TORCH_CHECK(CpuAdamWApplies(e), "CpuAdamWUpdate: tensors the kernel does not take");
    float* w = e.target.data_ptr<float>();
    float* m = e.exp_avg.data_ptr<float>();
    float* v = e.exp_avg_sq.data_ptr<float>();
    const bool decay = e.decays && step.weight_decay != 0;
    const bool bf16_grad = e.grad.scalar_type() == torch::kBFloat16;
    const void* g = e.grad.data_ptr();
    uint16_t* out =
        e.param.defined() ? reinterpret_cast<uint16_t*>(e.param.data_ptr<at::BFloat16>()) : nullptr;
    const int variant = (bf16_grad ? 4 : 0) + (decay ? 1 : 0) + (out != nullptr ? 2 : 0);
    at::parallel_for(0, e.target.numel(), kGrain, [&](int64_t begin, int64_t end) {
      const int64_t n = end - begin;
      const float* gf = static_cast<const float*>(g) + begin;
      const uint16_t* gb = static_cast<const uint16_t*>(g) + begin;
      uint16_t* o = out != nullptr ? out + begin : nullptr;
      float *wb = w + begin, *mb = m + begin, *vb = v + begin;
      switch (variant) {
        case 0:
          LoopF32(wb, mb, vb, gf, o, n, s);
          break;
        case 1:
          LoopF32Decay(wb, mb, vb, gf, o, n, s);
          break;
        case 2:
          LoopF32Bf16(wb, mb, vb, gf, o, n, s);
          break;
        case 3:
          LoopF32DecayBf16(wb, mb, vb, gf, o, n, s);
          break;
        case 4:
          LoopBf16(wb, mb, vb, gb, o, n, s);
          break;
        case 5:
          LoopBf16Decay(wb, mb, vb, gb, o, n, s);
          break;
        case 6:
          LoopBf16Bf16(wb, mb, vb, gb, o, n, s);
          break;
        default:
          LoopBf16DecayBf16(wb, mb, vb, gb, o, n, s);
          break;
      }
    });
  }
}

}  // namespace ulysses::engine::train
