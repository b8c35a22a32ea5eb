// The GPU peak table (common/spec/gpu_peaks.h): driver names map to their model's dense
// bf16 peak, variants before the family, unknown models to nothing.
#include "common/spec/gpu_peaks.h"

#include <string>

#include "gtest/gtest.h"

namespace ulysses::spec {
namespace {

std::string ModelOf(const std::string& driver_name) {
  std::optional<GpuPeak> p = GpuPeakOf(driver_name);
  return p ? p->model : "none";
}

TEST(GpuPeaksTest, DriverNamesMapToTheirModelsPeak) {
  EXPECT_EQ(ModelOf("NVIDIA H100 80GB HBM3"), "H100 SXM");
  EXPECT_EQ(GpuPeakOf("NVIDIA H100 80GB HBM3")->bf16_dense_flops, 989e12);
  EXPECT_EQ(ModelOf("NVIDIA H100 PCIe"), "H100 PCIe");
  EXPECT_EQ(GpuPeakOf("NVIDIA H100 PCIe")->bf16_dense_flops, 756e12);
  EXPECT_EQ(ModelOf("NVIDIA H100 NVL"), "H100 NVL");
  EXPECT_EQ(ModelOf("NVIDIA H200"), "H200");
  EXPECT_EQ(ModelOf("NVIDIA GH200 480GB"), "GH200");
  EXPECT_EQ(ModelOf("NVIDIA B200"), "B200");
  EXPECT_EQ(GpuPeakOf("NVIDIA B200")->bf16_dense_flops, 2250e12);
  EXPECT_EQ(ModelOf("NVIDIA GB200"), "GB200");
  EXPECT_EQ(ModelOf("NVIDIA A100-SXM4-80GB"), "A100");
  EXPECT_EQ(ModelOf("NVIDIA A100 80GB PCIe"), "A100");
  EXPECT_EQ(ModelOf("nvidia l40s"), "L40S");  // case does not matter
  EXPECT_EQ(ModelOf("NVIDIA GeForce RTX 4090"), "none");
  EXPECT_EQ(ModelOf(""), "none");
  EXPECT_EQ(GpuPeakNamed("H100 SXM").bf16_dense_flops, 989e12);
  for (const GpuPeak& p : GpuPeaks()) EXPECT_GT(p.bf16_dense_flops, 1e14) << p.model;
}

}  // namespace
}  // namespace ulysses::spec
