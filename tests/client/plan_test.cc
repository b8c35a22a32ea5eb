// client/plan: parameter counts of the presets against the published model sizes, the
// all-to-all volume against the MHA closed form 4*N*H/P, the memory formulas against
// numbers computed by hand for a small shape, the verdict and the cheapest fix, byte-size
// parsing, and every shipped config fitting on an H100.
#include "client/plan.h"

#include <cstdlib>
#include <filesystem>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ulysses::client {
namespace {

using ::testing::HasSubstr;

constexpr double kGiB = 1024.0 * 1024 * 1024;

spec::JobSpec Job(const std::string& preset, int64_t seq_len, int64_t sp) {
  spec::JobSpec s;
  s.metadata.name = "plan";
  s.model.preset = preset;
  EXPECT_TRUE(spec::ApplyModelPreset(s.model).ok());
  s.data.synthetic = spec::SyntheticDataSpec{"random", 8};
  s.stages.push_back({seq_len, 10});
  s.parallelism.sp_degree = sp;
  return s;
}

DeviceSpec Device(const std::string& type, const std::string& memory = "") {
  absl::StatusOr<DeviceSpec> d = ResolveDevice(type, memory);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : DeviceSpec{};
}

TEST(PlanTest, PresetParameterCountsMatchPublishedSizes) {
  // Llama-3.2-1B: 1.24B (tied embeddings); Llama-3.1-8B: 8.03B.
  EXPECT_NEAR(ParameterCount(Job("llama3-1b", 1024, 1).model), 1.2358e9, 1e6);
  EXPECT_NEAR(ParameterCount(Job("llama3-8b", 1024, 1).model), 8.0301e9, 1e6);
}

TEST(PlanTest, MhaAllToAllIsFourNHOverP) {
  spec::JobSpec s = Job("tiny", 4096, 4);
  s.model.num_key_value_heads = s.model.num_attention_heads;  // MHA
  const std::vector<StagePlan> plans = PlanJob(s);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].tokens_per_rank, 1024);
  EXPECT_DOUBLE_EQ(plans[0].a2a_elements, 4.0 * 4096 * 256 / 4);
  // SP 1 keeps the whole sequence on one rank: no exchange at all.
  s.parallelism.sp_degree = 1;
  EXPECT_EQ(PlanJob(s)[0].a2a_elements, 0);
  EXPECT_EQ(PlanJob(s)[0].a2a_bytes, 0);
}

TEST(PlanTest, GqaReplicatesKvHeadsWhenSpExceedsThem) {
  spec::JobSpec s = Job("llama3-8b", 1 << 20, 32);
  const StagePlan p = PlanJob(s)[0];
  EXPECT_EQ(p.kv_heads_exchanged, 32);
  s.parallelism.sp_degree = 4;
  EXPECT_EQ(PlanJob(s)[0].kv_heads_exchanged, 8);
}

// A shape small enough to count by hand: vocab 16, hidden 8, intermediate 16, 2 layers,
// 2 query heads and 1 kv head of dim 4, untied, fp32.
spec::JobSpec SmallJob(int64_t seq_len, int64_t sp) {
  spec::JobSpec s;
  s.metadata.name = "small";
  s.model.vocab_size = 16;
  s.model.hidden_size = 8;
  s.model.intermediate_size = 16;
  s.model.num_hidden_layers = 2;
  s.model.num_attention_heads = 2;
  s.model.num_key_value_heads = 1;
  s.data.synthetic = spec::SyntheticDataSpec{"random", 8};
  s.stages.push_back({seq_len, 10});
  s.parallelism.sp_degree = sp;
  return s;
}

TEST(PlanTest, MemoryFormulasMatchHandCountsForASmallShape) {
  const spec::JobSpec s = SmallJob(64, 2);
  // Parameters per layer: q 8*8 + k, v 2*8*4 + o 8*8 + MLP 3*8*16 + norms 2*8 = 592;
  // total 2*16*8 (embed, lm_head) + 2*592 + 8 (final norm) = 1448.
  EXPECT_DOUBLE_EQ(ParameterCount(s.model), 1448);
  const StagePlan p = PlanJob(s)[0];
  // ZeRO 0, fp32 AdamW: weights 4, grads 4, exp_avg + exp_avg_sq 8 bytes per parameter.
  EXPECT_DOUBLE_EQ(p.parameter_bytes, 1448 * 4);
  EXPECT_DOUBLE_EQ(p.gradient_bytes, 1448 * 4);
  EXPECT_DOUBLE_EQ(p.optimizer_bytes, 1448 * 8);
  EXPECT_DOUBLE_EQ(p.gathered_bytes, 0);
  // n = 32 tokens per rank; sp 2 > 1 kv head: Hkv' = 2. Bytes per token per layer:
  // norms 2*8*(4+4) = 128, q and rotated q 2*8*4 = 64, k and rotated k 2*1*4*4 = 32,
  // exchanged q,k,v (2+2*2)*4*4 = 96, attention output and o_proj input 2*8*4 = 64,
  // lse 2*4 = 8, MLP 4*16*4 = 256: 648. Saved: 2 layers * 32 * 648 + final norm 32*8*8.
  EXPECT_DOUBLE_EQ(p.saved_activation_bytes, 2 * 32 * 648 + 2048);
  // One layer's backward: 32*4*(9*8 + 4*2*4) = 13312, all-to-all buffers 2*32*6*4*4 = 6144,
  // MLP gradients 3*32*16*4 = 6144 (more than the untiled loss, 32*16*16 + 32*8*4 = 9216).
  EXPECT_DOUBLE_EQ(p.working_bytes, 13312 + 6144 + 6144);
  EXPECT_DOUBLE_EQ(p.runtime_bytes, 0);  // no device: no reserve

  // Checkpointing keeps one hidden state per layer and recomputes the layer in backward.
  spec::JobSpec ckpt = s;
  ckpt.memory.activation_checkpointing = true;
  const StagePlan c = PlanJob(ckpt)[0];
  EXPECT_DOUBLE_EQ(c.saved_activation_bytes, 2 * 32 * 8 * 4 + 2048);
  EXPECT_DOUBLE_EQ(c.working_bytes, 32 * 648 + 13312 + 6144 + 6144);
  // Kept attention outputs add, per layer, the local attention output n*Hq*D = 32*2*4 in fp32
  // and its fp32 log-sum-exp 32*2, and take the attention forward out of the recompute.
  spec::JobSpec kept = ckpt;
  kept.memory.keep_attention_outputs = true;
  const StagePlan k = PlanJob(kept)[0];
  EXPECT_DOUBLE_EQ(k.saved_activation_bytes,
                   2 * 32 * 8 * 4 + 2 * (32 * 2 * 4 * 4 + 32 * 2 * 4) + 2048);
  EXPECT_DOUBLE_EQ(k.working_bytes, c.working_bytes);

  // ZeRO 3 over world 2 with bf16: P*2/2 parameters, P*4/2 fp32 gradients, P*12/2 optimizer
  // (exp_avg, exp_avg_sq, fp32 master), and gathered while in use the outer unit (embed,
  // lm_head, final norm: 2*16*8 + 8 = 264) and one layer (592), each with its gradients:
  // (264 + 592)*(2+4). Offloaded optimizer state moves to the host on a GPU, with the host
  // copy of the bf16 parameter chunk AdamW updates: P*12/2 + P*2/2.
  spec::JobSpec z3 = s;
  z3.model.dtype = "bfloat16";
  z3.parallelism.zero_stage = 3;
  z3.parallelism.offload_optimizer = true;
  const DeviceSpec h100 = Device("h100");
  const StagePlan z = PlanJob(z3, &h100)[0];
  EXPECT_DOUBLE_EQ(z.parameter_bytes, 1448);
  EXPECT_DOUBLE_EQ(z.gradient_bytes, 1448 * 2);
  EXPECT_DOUBLE_EQ(z.optimizer_bytes, 0);
  EXPECT_DOUBLE_EQ(z.host_bytes, 1448 * 6 + 1448);
  EXPECT_DOUBLE_EQ(z.gathered_bytes, (264 + 592) * 6);
  EXPECT_DOUBLE_EQ(z.runtime_bytes, 3 * kGiB);
  // On cpu the host is the device: offload moves nothing.
  const DeviceSpec cpu = Device("cpu");
  const StagePlan zc = PlanJob(z3, &cpu)[0];
  EXPECT_DOUBLE_EQ(zc.optimizer_bytes, 1448 * 6);
  EXPECT_DOUBLE_EQ(zc.host_bytes, 0);
  // The gathered layers come and go every layer: on cpu they carry glibc's retained heap like
  // the activations do.
  EXPECT_DOUBLE_EQ(zc.gathered_bytes, z.gathered_bytes * cpu.transient_overhead);
}

TEST(PlanTest, MemoryTechniquesReduceTheEstimate) {
  spec::JobSpec s = Job("llama3-8b", 131072, 8);
  const double plain = PlanJob(s)[0].activation_bytes();
  s.memory.activation_checkpointing = true;
  const double ckpt = PlanJob(s)[0].activation_bytes();
  s.memory.tiled_mlp = true;
  s.memory.tiled_loss = true;
  const double tiled = PlanJob(s)[0].activation_bytes();
  EXPECT_LT(ckpt, plain);
  EXPECT_LT(tiled, ckpt);
  s.model.hidden_size = 0;  // unknown shape (init_from): no estimate
  EXPECT_EQ(PlanJob(s)[0].activation_bytes(), 0);
}

TEST(PlanTest, StepTimeFollowsFlopsAtTheStatedThroughput) {
  spec::JobSpec s = SmallJob(64, 2);
  s.model.dtype = "bfloat16";
  const DeviceSpec h100 = Device("h100");
  const StagePlan p = PlanJob(s, &h100)[0];
  // 6 * (2*592 layer + 16*8 lm_head parameters) + attention 6 * 2 layers * 8 * 64 per token;
  // 64 tokens over 2 ranks.
  const double per_token = 6 * (2 * 592 + 128) + 6 * 2 * 8 * 64;
  EXPECT_DOUBLE_EQ(p.flops_per_rank, per_token * 64 / 2);
  EXPECT_DOUBLE_EQ(p.compute_seconds, p.flops_per_rank / (989e12 * 0.4));
  // Forward + backward all-to-all: (2*2 + 2*2)*4*32 elements * 2 bytes per layer, half leaves.
  EXPECT_DOUBLE_EQ(p.a2a_seconds, 8.0 * 4 * 32 * 2 * 0.5 * 2 * 2 / 150e9);
}

TEST(PlanTest, StageThatDoesNotFitGetsTheCheapestFix) {
  // Llama-3.1-8B at 128K on 8 H100 without any memory technique: 18 bytes per parameter
  // replicated (145 GB) alone exceeds 80 GiB.
  spec::JobSpec s = Job("llama3-8b", 131072, 8);
  s.model.dtype = "bfloat16";
  const DeviceSpec h100 = Device("h100");
  const StagePlan p = PlanJob(s, &h100)[0];
  EXPECT_FALSE(p.fits);
  EXPECT_GT(p.model_state_bytes(), 80 * kGiB);
  const FitFix fix = FindFix(s, 0, h100);
  ASSERT_TRUE(fix.found);
  EXPECT_TRUE(fix.plan.fits);
  EXPECT_LE(fix.plan.total_bytes(), 80 * kGiB);
  EXPECT_TRUE(PlanJob(fix.fixed, &h100)[0].fits);  // re-planned with the fix
  // No single change fits (the model state needs ZeRO, the activations more), so the fix is a
  // combination, and it names ZeRO.
  EXPECT_GE(fix.changes.size(), 2u);
  EXPECT_THAT(fix.changes, ::testing::Contains(HasSubstr("spec.parallelism.zero_stage=")));
  // Every fix found passes validation and fits, and they come cheapest by GPU-hours first; the
  // first is FindFix's. Checkpointing with ZeRO (the textbook fix) is among them, never cheaper.
  const std::vector<FitFix> all = FindFixes(s, 0, h100, 1000);
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(all[0].changes, fix.changes);
  bool checkpointing_listed = false;
  for (size_t k = 0; k < all.size(); ++k) {
    EXPECT_TRUE(spec::ValidateJobSpec(all[k].fixed).ok()) << k;
    EXPECT_TRUE(PlanJob(all[k].fixed, &h100)[0].fits) << k;
    EXPECT_DOUBLE_EQ(all[k].gpu_hours, StageGpuHours(all[k].plan));
    if (k > 0) EXPECT_LE(all[k - 1].gpu_hours, all[k].gpu_hours * (1 + 1e-9)) << k;
    // zero_stage 3 without checkpointing is refused by the validator: never offered.
    if (all[k].fixed.parallelism.zero_stage == 3) {
      EXPECT_TRUE(all[k].fixed.memory.activation_checkpointing) << k;
    }
    if (absl::c_linear_search(all[k].changes, "spec.memory.activation_checkpointing=true")) {
      checkpointing_listed = true;
      EXPECT_LE(fix.gpu_hours, all[k].gpu_hours);
    }
  }
  EXPECT_TRUE(checkpointing_listed);
  // Taking any one change away no longer fits: the combination is minimal.
  for (size_t drop = 0; drop < fix.changes.size(); ++drop) {
    std::vector<std::string> sets;
    for (size_t k = 0; k < fix.changes.size(); ++k) {
      if (k != drop) sets.push_back(fix.changes[k]);
    }
    spec::JobSpec partial = s;
    for (const std::string& set : sets) {
      if (set.find("zero_stage") != std::string::npos) {
        partial.parallelism.zero_stage = fix.fixed.parallelism.zero_stage;
      } else if (set.find("activation_checkpointing") != std::string::npos) {
        partial.memory.activation_checkpointing = true;
      } else if (set.find("tiled_mlp") != std::string::npos) {
        partial.memory.tiled_mlp = true;
      } else if (set.find("tiled_loss") != std::string::npos) {
        partial.memory.tiled_loss = true;
        partial.memory.loss_tile_tokens = fix.fixed.memory.loss_tile_tokens;
      } else if (set.find("offload_optimizer") != std::string::npos) {
        partial.parallelism.offload_optimizer = true;
      } else if (set.find("offload_activations") != std::string::npos) {
        partial.parallelism.offload_activations = true;
      } else if (set.find("sp_degree") != std::string::npos) {
        partial.stages[0].sp_degree = fix.fixed.stages[0].sp_degree;
      }
    }
    EXPECT_FALSE(PlanJob(partial, &h100)[0].fits) << "without " << fix.changes[drop];
  }
  // A stage that only lacks checkpointing gets exactly that single change.
  spec::JobSpec one = s;
  one.parallelism.zero_stage = 3;
  one.memory.tiled_mlp = true;
  one.memory.tiled_loss = true;
  const FitFix single = FindFix(one, 0, h100);
  ASSERT_TRUE(single.found);
  EXPECT_THAT(single.changes, ::testing::ElementsAre("spec.memory.activation_checkpointing=true"));
  // A stage that fits without kept attention outputs but not with them gets them turned off.
  spec::JobSpec kept = one;
  kept.memory.activation_checkpointing = true;
  kept.memory.keep_attention_outputs = true;
  int64_t seq = 0;
  for (int64_t len = 131072; len <= (int64_t{1} << 22) && seq == 0; len += 65536) {
    kept.stages[0].seq_len = len;
    spec::JobSpec without = kept;
    without.memory.keep_attention_outputs = false;
    if (PlanJob(without, &h100)[0].fits && !PlanJob(kept, &h100)[0].fits) seq = len;
  }
  ASSERT_GT(seq, 0) << "no length where only the kept outputs overflow an h100";
  // Dropping them is one of the single-change fixes (an offload that costs no step time in
  // the model can come first by GPU-hours).
  const std::vector<FitFix> drop_kept = FindFixes(kept, 0, h100, 1000);
  ASSERT_FALSE(drop_kept.empty());
  bool dropped = false;
  for (const FitFix& f : drop_kept) {
    if (f.changes == std::vector<std::string>{"spec.memory.keep_attention_outputs=false"}) {
      dropped = true;
      EXPECT_LE(drop_kept[0].gpu_hours, f.gpu_hours);
    }
  }
  EXPECT_TRUE(dropped) << "at seq_len " << seq;
  // CheckFits names the stage, the bytes and the fix.
  const absl::Status refused = CheckFits(s, h100);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("spec.stages[0]: seq_len 131072 at sp 8 needs "));
  EXPECT_THAT(refused.message(), HasSubstr("80.0 GiB of one h100 rank"));
  EXPECT_THAT(refused.message(), HasSubstr("fix: --set "));
  EXPECT_TRUE(CheckFits(fix.fixed, h100).ok());
}

// optimizer.micro_batch_size b: a rank holds b sequences' activations at once, exchanges b times
// the all-to-all volume and computes b times the FLOPs per step; the model state is unchanged.
// A stage that fits only one sequence at a time gets the fix that keeps the global batch:
// micro-batches of 1, accumulated b times as often.
TEST(PlanTest, MicroBatchScalesActivationsAndWorkAndItsFixKeepsTheGlobalBatch) {
  spec::JobSpec s = SmallJob(64, 2);
  const DeviceSpec h100 = Device("h100");
  const StagePlan one = PlanJob(s, &h100)[0];
  s.optimizer.micro_batch_size = 4;
  const StagePlan four = PlanJob(s, &h100)[0];
  EXPECT_EQ(four.micro_batch, 4);
  EXPECT_DOUBLE_EQ(four.saved_activation_bytes, 4 * one.saved_activation_bytes);
  EXPECT_DOUBLE_EQ(four.a2a_elements, 4 * one.a2a_elements);
  EXPECT_DOUBLE_EQ(four.flops_per_rank, 4 * one.flops_per_rank);
  EXPECT_DOUBLE_EQ(four.a2a_seconds, 4 * one.a2a_seconds);
  EXPECT_DOUBLE_EQ(four.model_state_bytes(), one.model_state_bytes());
  EXPECT_GT(four.working_bytes, one.working_bytes);

  // Llama-3.1-8B at 1M tokens on 8 H100 with every memory technique fits one sequence per rank
  // (the shipped recipe's options); 4 sequences at once do not.
  spec::JobSpec big = Job("llama3-8b", 1 << 20, 8);
  big.model.dtype = "bfloat16";
  big.parallelism.zero_stage = 3;
  big.memory.activation_checkpointing = true;
  big.memory.tiled_mlp = true;
  big.memory.tiled_loss = true;
  big.parallelism.offload_optimizer = true;
  big.parallelism.offload_activations = true;
  ASSERT_TRUE(PlanJob(big, &h100)[0].fits);
  big.optimizer.micro_batch_size = 4;
  big.optimizer.grad_accum_steps = 2;
  ASSERT_FALSE(PlanJob(big, &h100)[0].fits);
  const FitFix fix = FindFix(big, 0, h100);
  ASSERT_TRUE(fix.found);
  EXPECT_THAT(fix.changes, ::testing::ElementsAre("spec.optimizer.micro_batch_size=1 --set "
                                                  "spec.optimizer.grad_accum_steps=8"));
  EXPECT_EQ(fix.fixed.optimizer.micro_batch_size * fix.fixed.optimizer.grad_accum_steps, 8);
}

TEST(PlanTest, NothingFitsATinyDevice) {
  spec::JobSpec s = Job("llama3-8b", 1 << 20, 8);
  const DeviceSpec small = Device("h100", "4GiB");
  EXPECT_FALSE(FindFix(s, 0, small).found);
  EXPECT_THAT(CheckFits(s, small).message(), HasSubstr("use more memory"));
}

TEST(PlanTest, ByteSizesParseWithUnitsAndRejectBadValues) {
  EXPECT_DOUBLE_EQ(*ParseByteSize("80GiB", "--gpu-memory"), 80 * kGiB);
  EXPECT_DOUBLE_EQ(*ParseByteSize("141GB", "--gpu-memory"), 141e9);
  EXPECT_DOUBLE_EQ(*ParseByteSize("512 MiB", "--gpu-memory"), 512.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(*ParseByteSize("1.5tib", "--gpu-memory"), 1.5 * 1024 * kGiB);
  EXPECT_DOUBLE_EQ(*ParseByteSize("2000000000", "--gpu-memory"), 2e9);
  for (const char* bad : {"", "GiB", "80 XB", "-5GiB", "1.2.3GB", "0GiB", "100KiB", "9e99GB"}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<double> r = ParseByteSize(bad, "--gpu-memory");
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("--gpu-memory: '", bad, "'")));
    EXPECT_THAT(r.status().message(), HasSubstr("(use a size such as 80GiB"));
  }
  EXPECT_THAT(ParseByteSize("80 XB", "--gpu-memory").status().message(),
              HasSubstr("unknown unit 'xb'"));
}

TEST(PlanTest, DevicesHaveStatedMemory) {
  EXPECT_DOUBLE_EQ(Device("h100").memory_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(Device("h200").memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(Device("a100-80g").memory_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(Device("h100", "40GiB").memory_bytes, 40 * kGiB);
  const DeviceSpec cpu = Device("cpu");
  EXPECT_TRUE(cpu.host_is_device);
  EXPECT_GT(cpu.memory_bytes, 0);
  // On cpu the host's memory is shared by a stage's ranks.
  const StagePlan p = PlanJob(Job("tiny", 4096, 4), &cpu)[0];
  EXPECT_DOUBLE_EQ(p.device_bytes, cpu.memory_bytes / 4);
  absl::StatusOr<DeviceSpec> tpu = ResolveDevice("tpu", "");
  ASSERT_FALSE(tpu.ok());
  EXPECT_THAT(tpu.status().message(),
              HasSubstr("--device-type: 'tpu' is not a known device (use one of h100, h200, "
                        "a100-80g, cpu)"));
  EXPECT_THAT(ResolveDevice("h100", "2GiB").status().message(), HasSubstr("runtime reserve"));
}

// The asynchronous checkpoint's snapshot is in the plan: an 8B model's 1/8 share fits an H100
// node's host memory per GPU; a cpu host too small for it falls back with the reason and the fix;
// an explicit spec.checkpoint.async wins either way.
TEST(PlanTest, CheckpointSnapshotHostMemoryDecidesTheMode) {
  spec::JobSpec job = Job("llama3-8b", 8192, 8);
  const DeviceSpec gpu = Device("h100");
  const StagePlan h100 = PlanJob(job, &gpu)[0];
  // ~8.0e9 parameters x 14 bytes (bf16 weights, fp32 masters and moments) over 8 ranks, plus
  // at most the largest unit (the 128k-token embedding with its optimizer state).
  EXPECT_GT(h100.snapshot_host_bytes, 8.0e9 * 14 / 8);
  EXPECT_LT(h100.snapshot_host_bytes, 8.1e9 * 14 / 8 + 1.1e9 * 14);
  EXPECT_TRUE(h100.checkpoint_async) << h100.checkpoint_reason;
  EXPECT_THAT(h100.checkpoint_reason, HasSubstr("default: asynchronous"));

  DeviceSpec small = Device("cpu", "600GiB");  // per rank after the training state: too little
  small.memory_is_host_total = true;
  small.host_memory_bytes = 8 * 40 * kGiB;
  const StagePlan cpu = PlanJob(job, &small)[0];
  EXPECT_FALSE(cpu.checkpoint_async);
  EXPECT_THAT(cpu.checkpoint_reason, HasSubstr("fell back to synchronous"));
  EXPECT_THAT(cpu.checkpoint_reason, HasSubstr("spec.checkpoint.async=true"));

  job.checkpoint.async = true;
  EXPECT_TRUE(PlanJob(job, &small)[0].checkpoint_async);
  job.checkpoint.async = false;
  const StagePlan off = PlanJob(job, &gpu)[0];
  EXPECT_FALSE(off.checkpoint_async);
  EXPECT_EQ(off.checkpoint_reason, "spec.checkpoint.async: false");
}

// Start-up peaks (spec::StartupPerRank) by hand for the small shape: P = 1448 fp32 parameters,
// the largest tensor 128 elements (embed_tokens 16x8 and the MLP's 8x16), 4 MiB streaming block.
TEST(PlanTest, StartupPeaksMatchHandCountsForASmallShape) {
  spec::JobSpec s = SmallJob(64, 2);
  s.memory.activation_checkpointing = true;
  s.parallelism.zero_stage = 3;
  const StagePlan z3 = PlanJob(s)[0];  // no device: device and host apart, no runtime reserve
  // ZeRO-3 init over W = 2: parameter and gradient chunks (4 + 4) * 1448 / 2 on the device; on
  // the host one parameter made whole in fp32 and padded for the split: 128 * (4 + 4).
  EXPECT_DOUBLE_EQ(z3.init_bytes, 8 * 724);
  EXPECT_DOUBLE_EQ(z3.init_host_bytes, 128 * 8);
  EXPECT_FALSE(z3.init_is_import);
  // Resume: the chunks and the restored AdamW moments (8) on the device; the loaded share
  // (weights 4 + moments 8 per owned parameter) and one streaming block on the host.
  EXPECT_DOUBLE_EQ(z3.resume_bytes, 16 * 724);
  EXPECT_DOUBLE_EQ(z3.resume_host_bytes, 12 * 724 + 4.0 * 1024 * 1024);
  // Export: the largest tensor read whole and its converted copy.
  EXPECT_DOUBLE_EQ(z3.export_bytes, 2 * 4 * 128);
  // Import (init_from): the chunks, and every kept range read as fp32 on the host, one chunk of
  // the largest tensor in flight.
  s.model.init_from = "/models/small";
  const StagePlan imp = PlanJob(s)[0];
  EXPECT_TRUE(imp.init_is_import);
  EXPECT_DOUBLE_EQ(imp.init_bytes, 8 * 724);
  EXPECT_DOUBLE_EQ(imp.init_host_bytes, 4 * 724 + 128 * 4 / 2);
  // Later stages only resume.
  s.stages.push_back({128, 10});
  EXPECT_EQ(PlanJob(s)[1].init_bytes, 0);
  EXPECT_DOUBLE_EQ(PlanJob(s)[1].resume_bytes, z3.resume_bytes);

  // ZeRO 0 on cpu (host and device add up): a resuming rank holds the loaded checkpoint next to
  // the model and the restored AdamW state, the whole state twice: 2 * 12 * P, + the baseline.
  spec::JobSpec z0 = SmallJob(64, 2);
  const DeviceSpec cpu = Device("cpu");
  const StagePlan r0 = PlanJob(z0, &cpu)[0];
  EXPECT_DOUBLE_EQ(r0.resume_bytes, 2 * 12 * 1448 + 4.0 * 1024 * 1024 + cpu.reserve_bytes);
  EXPECT_EQ(r0.resume_host_bytes, 0);  // the host is the device
}

// The verdict is taken on the largest of the steady state, the init and the resume peak: for
// each, a job where it is the largest, a limit between it and the others fails the stage and a
// limit above it passes. Dropping any one of them from the max would let the first case pass.
TEST(PlanTest, EachPeakDecidesTheVerdictWhenItIsTheLargest) {
  // Device side, resume: Llama-3.1-8B, ZeRO-3 fp32 over 4 ranks on cpu at a short sequence holds
  // the loaded share (12 B per owned parameter) next to the chunks and moments (16 B) while
  // restoring.
  {
    spec::JobSpec s = Job("llama3-8b", 1024, 4);
    s.parallelism.zero_stage = 3;
    s.memory.activation_checkpointing = true;
    s.memory.tiled_loss = true;
    const DeviceSpec cpu = Device("cpu");
    const StagePlan p = PlanJob(s, &cpu)[0];
    ASSERT_EQ(p.peak_phase(), "resume");
    EXPECT_GT(p.resume_bytes, p.total_bytes());
    EXPECT_GT(p.resume_bytes, p.init_bytes);
    const double between = (p.resume_bytes + std::max(p.total_bytes(), p.init_bytes)) / 2;
    DeviceSpec tight = cpu;
    tight.memory_is_host_total = false;
    tight.memory_bytes = between;
    EXPECT_FALSE(PlanJob(s, &tight)[0].fits);
    tight.memory_bytes = p.resume_bytes * 1.01;
    EXPECT_TRUE(PlanJob(s, &tight)[0].fits);
    EXPECT_THAT(CheckFits(s,
                          [&] {
                            DeviceSpec d = tight;
                            d.memory_bytes = between;
                            return d;
                          }())
                    .message(),
                HasSubstr("per rank at resume"));
  }
  // Host side, resume: Llama-3.1-8B, ZeRO-3 over 8 H100 with the optimizer offloaded and
  // synchronous saves: the loaded share (14 P/W) beside the offloaded AdamW state (14 P/W).
  const DeviceSpec h100 = Device("h100");
  {
    spec::JobSpec s = Job("llama3-8b", 8192, 8);
    s.model.dtype = "bfloat16";
    s.parallelism.zero_stage = 3;
    s.parallelism.offload_optimizer = true;
    s.memory.activation_checkpointing = true;
    s.memory.tiled_mlp = true;
    s.memory.tiled_loss = true;
    s.checkpoint.async = false;
    const StagePlan p = PlanJob(s, &h100)[0];
    ASSERT_TRUE(p.fits);
    ASSERT_EQ(p.host_peak_phase(), "resume");
    const double other = std::max(p.steady_host_bytes, p.init_host_bytes);
    EXPECT_GT(p.resume_host_bytes, other);
    EXPECT_NEAR(p.resume_host_bytes, 28 * 8.0301e9 / 8, 0.01e9);
    DeviceSpec tight = h100;
    tight.host_memory_per_rank_bytes = (p.resume_host_bytes + other) / 2;
    const StagePlan t = PlanJob(s, &tight)[0];
    EXPECT_FALSE(t.fits);
    EXPECT_LE(t.peak_bytes(), t.device_bytes);  // the device alone would fit
    EXPECT_THAT(CheckFits(s, tight).message(), HasSubstr("of host memory per rank (resume)"));
  }
  // Host side, init: the same model over 512 ranks (sp 8 x dp 64): every rank's share is small,
  // but each still makes every parameter whole once (the 128256 x 4096 embedding: 2.1 GB in
  // fp32, + the bf16 copy and its padded split).
  {
    spec::JobSpec s = Job("llama3-8b", 8192, 8);
    s.model.dtype = "bfloat16";
    s.parallelism.dp_degree = 64;
    s.parallelism.zero_stage = 3;
    s.parallelism.offload_optimizer = true;
    s.memory.activation_checkpointing = true;
    s.memory.tiled_mlp = true;
    s.memory.tiled_loss = true;
    s.checkpoint.async = false;
    const StagePlan p = PlanJob(s, &h100)[0];
    ASSERT_EQ(p.host_peak_phase(), "init");
    EXPECT_NEAR(p.init_host_bytes, 128256.0 * 4096 * (4 + 2 + 2) + 2 * 8.0301e9 / 512, 0.01e9);
    DeviceSpec tight = h100;
    tight.host_memory_per_rank_bytes =
        (p.init_host_bytes + std::max(p.steady_host_bytes, p.resume_host_bytes)) / 2;
    EXPECT_FALSE(PlanJob(s, &tight)[0].fits);
    tight.host_memory_per_rank_bytes = p.init_host_bytes * 1.01;
    EXPECT_TRUE(PlanJob(s, &tight)[0].fits);
  }
  // Steady state: the shipped 8B recipe at 1M tokens, where activations dominate.
  {
    absl::StatusOr<spec::JobSpec> job = spec::LoadJobSpecFile(
        std::string(std::getenv("ULYSSES_SOURCE_DIR")) + "/configs/jobs/llama3-8b-1m.yaml");
    ASSERT_TRUE(job.ok()) << job.status();
    const StagePlan p = PlanJob(*job, &h100)[3];
    EXPECT_EQ(p.peak_phase(), "steady");
    EXPECT_EQ(p.peak_bytes(), p.total_bytes());
    EXPECT_GT(p.total_bytes(), p.resume_bytes);
  }
}

// Llama-3.1-70B at 256K: the shipped config plans FITS on 2 nodes of 8 H100 (ZeRO-3 over
// sp 8 x dp 2), and the planner's reason for 2 is that its longest stage on 1 node does not fit.
TEST(PlanTest, SeventyBillionAt256kNeedsTwoH100Nodes) {
  EXPECT_NEAR(ParameterCount(Job("llama3-70b", 1024, 1).model), 70.554e9, 0.01e9);
  const char* dir = std::getenv("ULYSSES_SOURCE_DIR");
  ASSERT_NE(dir, nullptr);
  absl::StatusOr<spec::JobSpec> job =
      spec::LoadJobSpecFile(std::string(dir) + "/configs/jobs/llama3-70b-256k.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  const DeviceSpec h100 = Device("h100");
  const std::vector<StagePlan> plans = PlanJob(*job, &h100);
  ASSERT_EQ(plans.size(), 3u);
  for (const StagePlan& p : plans) {
    EXPECT_TRUE(p.fits);
    EXPECT_EQ(p.world, 16);
    EXPECT_EQ(p.nodes, 2);
  }
  const NodeReason why = ExplainNodes(*job, 2, h100);
  EXPECT_EQ(why.nodes, 2);
  EXPECT_THAT(why.text, HasSubstr("2 nodes of 8 h100 (world 16 = sp 8 x dp 2): on 1 node "
                                  "(sp 8 x dp 1) a rank would need "));
  EXPECT_THAT(why.text, HasSubstr(": it does not fit"));
  EXPECT_FALSE(why.fewer_fits);
  EXPECT_TRUE(ExplainNodes(*job, 0, h100).fewer_fits);  // 32K alone would fit one node
  spec::JobSpec one_node = *job;
  one_node.parallelism.dp_degree = 1;
  EXPECT_FALSE(PlanJob(one_node, &h100)[2].fits);
  EXPECT_EQ(ExplainNodes(one_node, 2, h100).text, "");  // one node: nothing to explain
}

// Every config in configs/jobs, as shipped, fits on 80 GB H100s by the planner's account.
TEST(PlanTest, EveryShippedConfigFitsOnH100) {
  const char* dir = std::getenv("ULYSSES_SOURCE_DIR");
  ASSERT_NE(dir, nullptr) << "ULYSSES_SOURCE_DIR is not set (run through ctest)";
  const DeviceSpec h100 = Device("h100");
  int planned = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(dir) + "/configs/jobs")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<spec::JobSpec> job = spec::LoadJobSpecFile(entry.path().string());
    ASSERT_TRUE(job.ok()) << job.status();
    const std::vector<StagePlan> plans = PlanJob(*job, &h100);
    for (size_t i = 0; i < plans.size(); ++i) {
      EXPECT_TRUE(plans[i].fits) << "stage " << i << " needs " << plans[i].total_bytes();
    }
    ++planned;
  }
  EXPECT_GE(planned, 4);
}

}  // namespace
}  // namespace ulysses::client

namespace ulysses::client {
namespace {

// `plan --max-seq`: the shipped 8B recipe (ZeRO-3, optimizer and activation offload, checkpointing,
// tiled MLP and loss) on 80 GB H100s. On one GPU the search stops at ~120K tokens, where the
// largest term is the fp32 gradients of the whole model (ZeRO shards nothing over one rank, and
// gradients are not offloaded); at 512K one layer's backward (act_peak) alone exceeds the GPU.
// On 8 it passes 2M, limited by act_peak.
TEST(PlanTest, MaxSeqSearchesTheLongestFittingLengthAndNamesItsLimit) {
  absl::StatusOr<spec::JobSpec> job = spec::LoadJobSpecFile(
      std::string(std::getenv("ULYSSES_SOURCE_DIR")) + "/configs/jobs/llama3-8b-1m.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<DeviceSpec> h100 = ResolveDevice("h100", "");
  ASSERT_TRUE(h100.ok());
  for (int64_t gpus : {1, 8}) {
    absl::StatusOr<MaxSeqResult> r = MaxSequence(*job, *h100, gpus);
    ASSERT_TRUE(r.ok()) << r.status();
    // The longest length fits and the next multiple of 1024 * gpus does not.
    ASSERT_GT(r->max_seq_len, 0);
    EXPECT_EQ(r->max_seq_len % (1024 * gpus), 0);
    EXPECT_TRUE(r->at_max.fits);
    EXPECT_EQ(r->at_max.seq_len, r->max_seq_len);
    EXPECT_EQ(r->at_max.sp, gpus);
    EXPECT_FALSE(r->over.fits);
    EXPECT_EQ(r->over.seq_len, r->max_seq_len + 1024 * gpus);
    EXPECT_GT(r->at_max.host_bytes, 0) << "offload puts state in host memory";
    if (gpus == 1) {
      EXPECT_LT(r->max_seq_len, 500000);
      EXPECT_GT(r->max_seq_len, 100000);
      EXPECT_NE(r->limit.find("largest term grads"), std::string::npos) << r->limit;
      // At 512K the gradients are still the largest term of a plan that does not fit.
      spec::JobSpec at = *job;
      at.stages.resize(1);
      at.stages[0].seq_len = 524288;
      at.stages[0].sp_degree = 1;
      at.stages[0].dp_degree = 1;
      at.parallelism.sp_degree = 1;
      at.parallelism.dp_degree = 1;
      const StagePlan p = PlanJob(at, &*h100)[0];
      // At 512K one layer's backward alone (act_peak) is more than the device's memory.
      EXPECT_FALSE(p.fits);
      EXPECT_GT(p.working_bytes, p.device_bytes);
    } else {
      EXPECT_GT(r->max_seq_len, 2000000);
      EXPECT_NE(r->limit.find("largest term act_peak"), std::string::npos) << r->limit;
    }
  }
  // sp must divide the 32 attention heads.
  absl::StatusOr<MaxSeqResult> bad = MaxSequence(*job, *h100, 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("must divide the model's 32 attention heads"),
            std::string::npos)
      << bad.status();
  EXPECT_FALSE(MaxSequence(*job, *h100, 0).ok());
}

}  // namespace
}  // namespace ulysses::client
