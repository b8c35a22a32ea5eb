// The one table of GPU peak FLOP/s: dense (no sparsity) bf16 tensor-core peaks of the GPU
// models Ulysses runs on, matched from the name the driver reports ("NVIDIA H100 80GB HBM3").
// ulysses-worker takes its MFU denominator from it when --peak-flops is not given
// (worker/agent/devices.h DetectGpuModel); `ulyssesctl plan`'s device types take their bf16
// peak from it. Figures: the vendors' data sheets (docs/ENGINE.md, "FLOPs and MFU").
#ifndef ULYSSES_COMMON_SPEC_GPU_PEAKS_H_
#define ULYSSES_COMMON_SPEC_GPU_PEAKS_H_

#include <optional>
#include <string_view>
#include <vector>

namespace ulysses::spec {

struct GpuPeak {
  const char* model;        // "H100 SXM", as docs and logs name it.
  double bf16_dense_flops;  // Dense bf16 tensor-core peak, FLOP/s.
};

// Every row, in match order.
const std::vector<GpuPeak>& GpuPeaks();

// The row whose model `driver_name` names, e.g. "NVIDIA H100 PCIe" -> H100 PCIe,
// "NVIDIA H100 80GB HBM3" -> H100 SXM, "NVIDIA A100-SXM4-80GB" -> A100; nullopt for a model
// not in the table (the worker then needs --peak-flops for MFU).
std::optional<GpuPeak> GpuPeakOf(std::string_view driver_name);

// The row of `model` exactly ("H100 SXM"); a programming error (abort) if absent.
const GpuPeak& GpuPeakNamed(std::string_view model);

}  // namespace ulysses::spec

#endif  // ULYSSES_COMMON_SPEC_GPU_PEAKS_H_
