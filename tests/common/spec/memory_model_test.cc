#include "common/spec/memory_model.h"

#include <gtest/gtest.h>

namespace ulysses::spec {
namespace {

// `unit`: the outer parameters plus one layer (split evenly; the formula uses their sum).
ParameterCounts Counts(double total, double unit) {
  ParameterCounts c;
  c.total = total;
  c.largest_unit = unit / 2;
  c.outer = unit / 2;
  c.per_layer = unit / 2;
  return c;
}

TEST(MemoryModelTest, CountsTheTinyShapeByHand) {
  ModelShape s;
  s.vocab_size = 100;
  s.hidden_size = 8;
  s.intermediate_size = 16;
  s.num_hidden_layers = 2;
  s.num_attention_heads = 2;
  s.num_key_value_heads = 1;
  const ParameterCounts c = CountParameters(s);
  // q 8*8, k and v 8*4 each, o 8*8, gate/up/down 3*8*16, norms 2*8.
  EXPECT_DOUBLE_EQ(c.per_layer, 64 + 32 + 32 + 64 + 384 + 16);
  EXPECT_DOUBLE_EQ(c.embedding, 800);
  EXPECT_DOUBLE_EQ(c.total, 2 * 800 + 2 * c.per_layer + 8);
  EXPECT_DOUBLE_EQ(c.largest_unit, 800);
  EXPECT_DOUBLE_EQ(c.outer, 2 * 800 + 8);
}

TEST(MemoryModelTest, StagesShardOptimizerThenGradientsThenParameters) {
  ModelStateInputs in;
  in.params = Counts(1000, 100);
  in.dtype = "float32";
  in.world = 4;
  in.zero_stage = 0;
  ModelStateBytes z0 = ModelStatePerRank(in);
  EXPECT_DOUBLE_EQ(z0.DeviceTotal(), 1000 * (4 + 4 + 8));
  in.zero_stage = 1;  // + the owned parameter chunk copy
  EXPECT_DOUBLE_EQ(ModelStatePerRank(in).DeviceTotal(),
                   1000 * (4 + 4) + 1000 * 4 / 4.0 + 1000 * 8 / 4.0);
  in.zero_stage = 2;  // without activation checkpointing all gradients live until reduced
  EXPECT_DOUBLE_EQ(ModelStatePerRank(in).DeviceTotal(),
                   1000 * 4 + 1000 * 4 / 4.0 + 1000 * 12 / 4.0 + 1000 * 4);
  in.activation_checkpointing = true;  // one layer's (and the outer ones') at a time
  EXPECT_DOUBLE_EQ(ModelStatePerRank(in).DeviceTotal(),
                   1000 * 4 + 1000 * 4 / 4.0 + 1000 * 12 / 4.0 + 100 * 4);
  in.zero_stage = 3;
  EXPECT_DOUBLE_EQ(ModelStatePerRank(in).DeviceTotal(), 1000 * 16 / 4.0 + 100 * 8);
}

TEST(MemoryModelTest, Bf16KeepsFp32GradientsMasterAndMoments) {
  ModelStateInputs in;
  in.params = Counts(10, 1);
  in.dtype = "bfloat16";
  const ModelStateBytes b = ModelStatePerRank(in);
  EXPECT_DOUBLE_EQ(b.parameters, 20);
  EXPECT_DOUBLE_EQ(b.gradients, 40);
  EXPECT_DOUBLE_EQ(b.optimizer, 120);
}

TEST(MemoryModelTest, OffloadMovesOptimizerToHost) {
  ModelStateInputs in;
  in.params = Counts(1000, 100);
  in.zero_stage = 1;
  in.world = 2;
  in.offload_optimizer = true;
  const ModelStateBytes b = ModelStatePerRank(in);
  EXPECT_DOUBLE_EQ(b.optimizer, 0);
  EXPECT_DOUBLE_EQ(b.host_optimizer, 1000 * 8 / 2.0 + 1000 * 4 / 2.0);
}

TEST(MemoryModelTest, CheckpointAndSnapshotBytes) {
  const ParameterCounts c = Counts(1000, 100);  // largest unit 50
  // fp32: 4 (weights) + 8 (moments); bf16: 2 + 8 + 4 (fp32 masters).
  EXPECT_DOUBLE_EQ(CheckpointStateBytes(c, "float32"), 1000 * 12);
  EXPECT_DOUBLE_EQ(CheckpointStateBytes(c, "bfloat16"), 1000 * 14);
  EXPECT_DOUBLE_EQ(SnapshotBytesPerRank(c, "float32", 1, 0), 1000 * 12);
  EXPECT_DOUBLE_EQ(SnapshotBytesPerRank(c, "float32", 4, 1), 1000 * 12 / 4.0);  // ZeRO chunks
  // Without ZeRO a rank's tensor subset may exceed 1/W by up to the largest unit.
  EXPECT_DOUBLE_EQ(SnapshotBytesPerRank(c, "float32", 4, 0), 1000 * 12 / 4.0 + 50 * 12);
}

TEST(MemoryModelTest, CheckpointModeFollowsTheSpecThenHostMemory) {
  // Forced either way, whatever the memory.
  EXPECT_FALSE(ChooseCheckpointMode(false, 1, 1e12).async);
  EXPECT_EQ(ChooseCheckpointMode(false, 1, 1e12).reason, "spec.checkpoint.async: false");
  EXPECT_TRUE(ChooseCheckpointMode(true, 1e12, 1).async);
  // Unset: asynchronous while the snapshot fits half of the host memory per rank.
  EXPECT_TRUE(ChooseCheckpointMode(std::nullopt, 50, 100).async);
  const CheckpointModeChoice fallback = ChooseCheckpointMode(std::nullopt, 51, 100);
  EXPECT_FALSE(fallback.async);
  EXPECT_NE(fallback.reason.find("fell back to synchronous"), std::string::npos) << fallback.reason;
  EXPECT_NE(fallback.reason.find("spec.checkpoint.async=true"), std::string::npos);
  EXPECT_TRUE(ChooseCheckpointMode(std::nullopt, 1e15, 0).async);  // host memory unknown
}

}  // namespace
}  // namespace ulysses::spec
