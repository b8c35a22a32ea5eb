// --devices / --capacity of ulysses-worker: one slot per device (worker/agent/devices.h).
#include "worker/agent/devices.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::agent {
namespace {

using ::testing::HasSubstr;
using Devices = std::vector<std::string>;

TEST(DevicesTest, RangesListsCpuSlotsAndAuto) {
  EXPECT_EQ(*ParseDevices("cuda:0-3", 0, 0), (Devices{"cuda:0", "cuda:1", "cuda:2", "cuda:3"}));
  EXPECT_EQ(*ParseDevices("cuda:2,cuda:0", 0, 0), (Devices{"cuda:2", "cuda:0"}));
  EXPECT_EQ(*ParseDevices("cuda:0-1,cuda:4", 3, 0), (Devices{"cuda:0", "cuda:1", "cuda:4"}));
  EXPECT_EQ(*ParseDevices("cpu", 0, 8), (Devices{"cpu"}));
  EXPECT_EQ(*ParseDevices("cpu", 4, 8), (Devices(4, "cpu")));
  // auto: every visible GPU; CPU slots when there is none.
  EXPECT_EQ(*ParseDevices("auto", 0, 2), (Devices{"cuda:0", "cuda:1"}));
  EXPECT_EQ(*ParseDevices("auto", 0, 0), (Devices{"cpu"}));
  EXPECT_EQ(*ParseDevices("auto", 2, 0), (Devices{"cpu", "cpu"}));
}

TEST(DevicesTest, BadSpecsNameTheFlagTheValueAndTheFix) {
  auto message = [](const std::string& spec, int capacity) {
    auto parsed = ParseDevices(spec, capacity, 0);
    return parsed.ok() ? std::string("ok") : std::string(parsed.status().message());
  };
  EXPECT_THAT(message("tpu", 0), HasSubstr("--devices: \"tpu\" has \"tpu\", which is not cuda:N"));
  EXPECT_THAT(message("tpu", 0), HasSubstr("(use auto, cpu (with --capacity N"));
  EXPECT_THAT(message("cuda:0,cuda:0", 0), HasSubstr("names cuda:0 twice"));
  EXPECT_THAT(message("cuda:0-2,cuda:1", 0), HasSubstr("names cuda:1 twice"));
  EXPECT_THAT(message("cuda:3-1", 0), HasSubstr("not a GPU index or an increasing range"));
  EXPECT_THAT(message("cuda:x", 0), HasSubstr("not a GPU index"));
  EXPECT_THAT(message("cuda:0-7", 4),
              HasSubstr("--capacity: 4 differs from the 8 GPUs of --devices \"cuda:0-7\""));
  EXPECT_THAT(message("cpu", -1), HasSubstr("--capacity: -1 is outside 0..1024"));
  EXPECT_EQ(message("cuda:0-7", 8), "ok");
}

TEST(DevicesTest, VisibleGpusFollowCudaVisibleDevices) {
  const char* saved = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string before = saved == nullptr ? "" : saved;
  setenv("CUDA_VISIBLE_DEVICES", "3,5", 1);
  EXPECT_EQ(CountVisibleGpus(), 2);
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  EXPECT_EQ(CountVisibleGpus(), 0);
  setenv("CUDA_VISIBLE_DEVICES", "0,-1,2", 1);  // CUDA stops at the first invalid entry.
  EXPECT_EQ(CountVisibleGpus(), 1);
  if (saved == nullptr) {
    unsetenv("CUDA_VISIBLE_DEVICES");
  } else {
    setenv("CUDA_VISIBLE_DEVICES", before.c_str(), 1);
  }
}

// MFU without flags: the driver's model lines (a /proc/driver/nvidia/gpus tree written here)
// give the GPU model, and the table its dense bf16 peak; mixed or unknown models give none,
// with what to pass.
TEST(DevicesTest, PeakFlopsComeFromTheDriversGpuModel) {
  ::ulysses::testing::TempDir dir{"gpus"};
  auto gpu = [&](const std::string& bus, const std::string& model) {
    std::filesystem::create_directories(dir.path() + "/" + bus);
    std::ofstream(dir.path() + "/" + bus + "/information")
        << "Model: \t\t " << model << "\nIRQ:\t\t 42\nGPU UUID:\t GPU-0\n";
  };
  EXPECT_TRUE(GpuModels(dir.path() + "/missing").empty());
  gpu("0000:18:00.0", "NVIDIA H100 80GB HBM3");
  gpu("0000:2a:00.0", "NVIDIA H100 80GB HBM3");
  const std::vector<std::string> models = GpuModels(dir.path());
  EXPECT_EQ(models, (Devices{"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"}));
  PeakFlops p = PeakFlopsOfModels(models);
  EXPECT_EQ(p.flops, 989e12);
  EXPECT_THAT(p.why, HasSubstr("H100 SXM"));
  EXPECT_THAT(p.why, HasSubstr("--peak-flops overrides"));
  gpu("0000:3a:00.0", "NVIDIA A100-SXM4-80GB");
  p = PeakFlopsOfModels(GpuModels(dir.path()));
  EXPECT_EQ(p.flops, 0);
  EXPECT_THAT(p.why, HasSubstr("different models"));
  p = PeakFlopsOfModels({"NVIDIA GeForce RTX 4090"});
  EXPECT_EQ(p.flops, 0);
  EXPECT_THAT(p.why, HasSubstr("is not in the peak table"));
  EXPECT_EQ(PeakFlopsOfModels({}).flops, 0);
}

}  // namespace
}  // namespace ulysses::agent
