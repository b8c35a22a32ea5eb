// The engine on a CUDA device (ctest label gpu). Without a CUDA device (or with a CPU-only
// libtorch, as on CI) every test here is SKIPPED, and ctest reports the test as skipped.
//   - fp32 on CUDA equals fp32 on CPU (SDPA vs the CPU blockwise kernel), loss rel < 1e-4;
//   - attention uses a fused SDPA backend (never the math one) and matches the CPU kernel;
//   - packed documents: SDPA's block-diagonal mask equals the CPU kernel's document skipping;
//   - SP 2 and 4 ranks sharing the one GPU (Gloo staging CUDA tensors through host memory) give
//     the loss and gradients of SP 1;
//   - the NCCL communicator at world size 1 runs every collective the engine uses;
//   - bf16 and fp16 (loss scaling) training on CUDA track fp32;
//   - ulysses-train trains a staged job on cuda (sp 1 -> sp 2 on one GPU) end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_tree.h"
#include "tests/testing/rank_processes.h"
#include "tests/testing/tiny_model.h"
#include "worker/engine/attention/attention.h"
#include "worker/engine/attention/kept_attention.h"
#include "worker/engine/data/batches.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/data/sharding.h"
#include "worker/engine/parallel/parallelize.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/train_step.h"

namespace ulysses::engine::train {
namespace {

namespace fs = std::filesystem;
using ::ulysses::testing::ChildEnv;

#define SKIP_WITHOUT_CUDA()                                                          \
  if (!torch::cuda::is_available()) {                                                \
    GTEST_SKIP() << "no CUDA device (or a CPU-only libtorch): GPU tests need a GPU"; \
  }

// Wider than the CPU tests' shape so the CUDA kernels see real tiles.
model::LlamaConfig TinyConfig() {
  model::LlamaConfig c = ::ulysses::testing::TinyLlama();
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  return c;
}

constexpr int64_t kSeq = 256;

// One rank training the tiny model on needle data at the given device/dtype/layout.
struct Rank {
  Rank(const std::string& device, torch::Dtype dtype, ParallelConfig pc = {},
       const model::MemoryOptions& memory = {}) {
    pc.device = device;
    rt = std::move(Parallelize(pc)).value();
    model = std::move(BuildModel(TinyConfig(), memory, 5, rt.device, dtype)).value();
    AttentionOptions attn;
    attn.block_size = 64;
    attention = UlyssesAttentionFn(rt.groups.sp.get(), attn);
    adam = std::make_unique<AdamW>(AdamWConfig{});
    trainer = std::make_unique<Trainer>(model, attention, rt.groups.world.get(), adam.get(), 1.0,
                                        rt.device);
    data = std::move(OpenSynthetic("needle", Split::kTrain, 256, 3, 0)).value();
    layout.seq_len = kSeq;
    layout.sp = pc.sp;
    layout.sp_rank = rt.groups.sp_rank;
  }
  StepStats Step(int64_t step) {
    auto b = StepMicroBatches(*data, layout, step);
    EXPECT_TRUE(b.ok()) << b.status();
    auto s = trainer->Step(*b, 3e-3, step);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : StepStats{};
  }
  ParallelRuntime rt;
  model::LlamaForCausalLM model{nullptr};
  AttentionCallback attention;
  std::unique_ptr<AdamW> adam;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<TokenDataset> data;
  BatchLayout layout;
};

double Rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

TEST(GpuEngineTest, CudaFloat32EqualsCpu) {
  SKIP_WITHOUT_CUDA();
  Rank cpu("cpu", torch::kFloat), gpu("cuda:0", torch::kFloat);
  for (int64_t step = 0; step < 5; ++step) {
    StepStats a = cpu.Step(step), b = gpu.Step(step);
    EXPECT_LT(Rel(b.loss, a.loss), 1e-4)
        << "step " << step << ": cpu " << a.loss << " cuda " << b.loss;
    EXPECT_LT(Rel(b.grad_norm, a.grad_norm), 1e-3) << "step " << step;
  }
}

TEST(GpuEngineTest, SdpaUsesFusedBackendAndMatchesBlockwise) {
  SKIP_WITHOUT_CUDA();
  for (torch::Dtype dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    auto opts = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
    // [b, s, h, d]: 8 query heads over 2 kv heads (GQA), head dim 64.
    torch::Tensor q = torch::randn({2, 1024, 8, 64}, opts).requires_grad_(true);
    torch::Tensor k = torch::randn({2, 1024, 2, 64}, opts).requires_grad_(true);
    torch::Tensor v = torch::randn({2, 1024, 2, 64}, opts).requires_grad_(true);
    const std::string backend = SdpaBackendFor(q, k, v);
    std::printf("[ INFO     ] sdpa backend for %s: %s\n", c10::toString(dtype), backend.c_str());
    EXPECT_TRUE(backend == "flash" || backend == "efficient" || backend == "cudnn") << backend;
    torch::Tensor out = CausalAttention(q, k, v, AttentionOptions{});
    torch::Tensor g = torch::randn_like(out);
    out.backward(g);
    // Reference: the CPU blockwise kernel in fp64 on the same inputs.
    auto up = [](const torch::Tensor& t) {
      return t.detach().to(torch::kCPU, torch::kDouble).requires_grad_(true);
    };
    torch::Tensor q64 = up(q), k64 = up(k), v64 = up(v);
    torch::Tensor ref = CausalAttention(q64, k64, v64, AttentionOptions{128});
    ref.backward(g.to(torch::kCPU, torch::kDouble));
    const double tol = dtype == torch::kFloat ? 1e-4 : 2e-2;
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return ((a.to(torch::kCPU, torch::kDouble) - b).norm() / b.norm()).item<double>();
    };
    EXPECT_LT(rel(out.detach(), ref.detach()), tol) << c10::toString(dtype);
    EXPECT_LT(rel(q.grad(), q64.grad()), tol) << "dq " << c10::toString(dtype);
    EXPECT_LT(rel(k.grad(), k64.grad()), tol) << "dk " << c10::toString(dtype);
    EXPECT_LT(rel(v.grad(), v64.grad()), tol) << "dv " << c10::toString(dtype);
  }
}

// Kept attention on CUDA: a call recorded without grad keeps the fused op's output and
// log-sum-exp; its replay runs no forward kernel and its op's backward gives the gradients of
// the plain call (which may use another kernel: GQA unrepeated), within bf16/fp16 rounding.
TEST(GpuEngineTest, KeptAttentionReplaysTheFusedOpWithoutASecondForward) {
  SKIP_WITHOUT_CUDA();
  for (torch::Dtype dtype : {torch::kBFloat16, torch::kHalf}) {
    auto opts = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
    torch::Tensor q = torch::randn({1, 2048, 8, 64}, opts),
                  k = torch::randn({1, 2048, 2, 64}, opts),
                  v = torch::randn({1, 2048, 2, 64}, opts),
                  g = torch::randn({1, 2048, 8, 64}, opts);
    auto grads = [&](bool keep, int64_t* forwards) {
      torch::Tensor q1 = q.clone().requires_grad_(true), k1 = k.clone().requires_grad_(true),
                    v1 = v.clone().requires_grad_(true);
      KeptAttention kept;
      if (keep) {
        torch::NoGradGuard no_grad;
        KeepAttentionScope record(&kept, KeepMode::kRecord);
        CausalAttention(q, k, v, AttentionOptions{});
        EXPECT_EQ(kept.size(), 1);
      }
      const int64_t before = CausalAttentionForwardRuns();
      torch::Tensor out;
      {
        std::optional<KeepAttentionScope> replay;
        if (keep) replay.emplace(&kept, KeepMode::kReplay);
        out = CausalAttention(q1, k1, v1, AttentionOptions{});
      }
      out.backward(g);
      *forwards = CausalAttentionForwardRuns() - before;
      return std::vector<torch::Tensor>{out.detach().clone(), q1.grad(), k1.grad(), v1.grad()};
    };
    int64_t plain_forwards = -1, kept_forwards = -1;
    auto plain = grads(false, &plain_forwards);
    auto kept = grads(true, &kept_forwards);
    std::printf("[ INFO     ] kept attention %s: replay ran %lld forward(s), plain %lld\n",
                c10::toString(dtype), static_cast<long long>(kept_forwards),
                static_cast<long long>(plain_forwards));
    EXPECT_EQ(plain_forwards, 1);
    EXPECT_EQ(kept_forwards, 0) << "the fused op was not kept (see the warning above)";
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
      const double rel = ((kept[i].to(torch::kDouble) - plain[i].to(torch::kDouble)).norm() /
                          plain[i].to(torch::kDouble).norm())
                             .item<double>();
      EXPECT_LT(rel, 2e-2) << names[i] << " " << c10::toString(dtype);
    }
  }
}

// A model with kept attention outputs trains like one that recomputes them (bf16 on CUDA).
TEST(GpuEngineTest, KeptAttentionOutputsTrainLikeFullCheckpointing) {
  SKIP_WITHOUT_CUDA();
  model::MemoryOptions ckpt;
  ckpt.activation_checkpointing = true;
  model::MemoryOptions kept = ckpt;
  kept.keep_attention_outputs = true;
  Rank a("cuda:0", torch::kBFloat16, {}, ckpt), b("cuda:0", torch::kBFloat16, {}, kept);
  for (int64_t step = 0; step < 5; ++step) {
    const int64_t before = CausalAttentionForwardRuns();
    StepStats sa = a.Step(step);
    const int64_t mid = CausalAttentionForwardRuns();
    StepStats sb = b.Step(step);
    // Per micro-batch and layer: two forwards recomputing, one keeping.
    const int64_t kept_forwards = CausalAttentionForwardRuns() - mid;
    EXPECT_GE(kept_forwards, TinyConfig().num_hidden_layers) << "step " << step;
    EXPECT_EQ(mid - before, 2 * kept_forwards) << "step " << step;
    EXPECT_LT(Rel(sb.loss, sa.loss), 2e-2)
        << "step " << step << ": " << sa.loss << " vs " << sb.loss;
  }
}

// Packed documents on CUDA: SDPA with the block-diagonal causal mask equals the CPU blockwise
// kernel with the same doc_ids (fp64 reference), forward and gradients; a token never sees
// another document (changing document 0's values leaves every later document's output alone).
TEST(GpuEngineTest, SdpaDocumentMaskMatchesBlockwiseDocuments) {
  SKIP_WITHOUT_CUDA();
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t s = 512;
  torch::Tensor q = torch::randn({2, s, 4, 32}, opts).requires_grad_(true);
  torch::Tensor k = torch::randn({2, s, 2, 32}, opts).requires_grad_(true);
  torch::Tensor v = torch::randn({2, s, 2, 32}, opts).requires_grad_(true);
  // Row 0: documents of 100, 300, 112 tokens; row 1: 7 and 505.
  torch::Tensor docs = torch::zeros({2, s}, torch::kLong);
  docs[0].slice(0, 100, 400).fill_(1);
  docs[0].slice(0, 400, s).fill_(2);
  docs[1].slice(0, 7, s).fill_(1);
  torch::Tensor out = CausalAttention(q, k, v, AttentionOptions{}, docs.to(torch::kCUDA));
  torch::Tensor g = torch::randn_like(out);
  out.backward(g);
  auto up = [](const torch::Tensor& t) {
    return t.detach().to(torch::kCPU, torch::kDouble).requires_grad_(true);
  };
  torch::Tensor q64 = up(q), k64 = up(k), v64 = up(v);
  torch::Tensor ref = CausalAttention(q64, k64, v64, AttentionOptions{128}, docs);
  ref.backward(g.to(torch::kCPU, torch::kDouble));
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a.to(torch::kCPU, torch::kDouble) - b).norm() / b.norm()).item<double>();
  };
  EXPECT_LT(rel(out.detach(), ref.detach()), 1e-4);
  EXPECT_LT(rel(q.grad(), q64.grad()), 1e-4);
  EXPECT_LT(rel(k.grad(), k64.grad()), 1e-4);
  EXPECT_LT(rel(v.grad(), v64.grad()), 1e-4);
  torch::NoGradGuard no_grad;
  torch::Tensor k2 = k.detach().clone(), v2 = v.detach().clone();
  k2[0].slice(0, 0, 100).mul_(3);
  v2[0].slice(0, 0, 100).add_(1);
  torch::Tensor moved =
      CausalAttention(q.detach(), k2, v2, AttentionOptions{}, docs.to(torch::kCUDA));
  auto diff = [&](int64_t from, int64_t to) {
    return (moved[0].slice(0, from, to) - out.detach()[0].slice(0, from, to))
        .abs()
        .max()
        .item<double>();
  };
  EXPECT_LT(diff(100, s), 1e-6);  // documents 1 and 2 never see document 0
  EXPECT_GT(diff(0, 100), 1e-3);  // document 0 itself changed
}

// Child rank of an SP group on cuda:0 over Gloo; rank 0 writes loss and grad norm per step.
int SpChild(const ChildEnv& env) {
  ParallelConfig pc;
  pc.sp = env.world;
  pc.rank = env.rank;
  pc.world_size = env.world;
  pc.master_port = env.port;
  pc.backend = "gloo";
  Rank r("cuda:0", torch::kFloat, pc);
  std::ostringstream out;
  for (int64_t step = 0; step < 3; ++step) {
    StepStats s = r.Step(step);
    out << s.loss << " " << s.grad_norm << "\n";
  }
  if (env.rank == 0) std::ofstream(std::getenv("ULYSSES_GPU_OUT")) << out.str();
  return 0;
}

std::vector<double> ReadNumbers(const std::string& path) {
  std::ifstream in(path);
  std::vector<double> v;
  double x;
  while (in >> x) v.push_back(x);
  return v;
}

TEST(GpuEngineTest, UlyssesSp2AndSp4ShareOneGpuAndEqualSp1) {
  SKIP_WITHOUT_CUDA();
  Rank one("cuda:0", torch::kFloat);
  std::vector<double> want;
  for (int64_t step = 0; step < 3; ++step) {
    StepStats s = one.Step(step);
    want.push_back(s.loss);
    want.push_back(s.grad_norm);
  }
  for (int sp : {2, 4}) {
    const std::string path = (fs::temp_directory_path() / ("ulysses_gpu_sp" + std::to_string(sp) +
                                                           "_" + std::to_string(getpid())))
                                 .string();
    auto results = ::ulysses::testing::RunChildren("sp", sp, std::chrono::seconds(240),
                                                   {"ULYSSES_GPU_OUT=" + path});
    for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << "sp " << sp;
    std::vector<double> got = ReadNumbers(path);
    ASSERT_EQ(got.size(), want.size()) << "sp " << sp;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_LT(Rel(got[i], want[i]), 1e-4) << "sp " << sp << " value " << i;
    }
    fs::remove(path);
  }
}

TEST(GpuEngineTest, NcclWorldOfOneRunsEveryCollective) {
  SKIP_WITHOUT_CUDA();
  ParallelConfig pc;
  pc.device = "cuda:0";
  pc.backend = "nccl";
  auto rt = Parallelize(pc);
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  Communicator& c = *rt->groups.world;
  torch::Tensor in = torch::arange(12, opts.dtype(torch::kFloat)).reshape({4, 3});
  torch::Tensor out = torch::zeros_like(in);
  ASSERT_TRUE(rt->groups.sp->AllToAll(out, in).ok());
  EXPECT_TRUE(torch::equal(out, in));
  std::vector<torch::Tensor> sums = {in.clone(), torch::ones({5}, opts.dtype(torch::kDouble)),
                                     torch::ones({2}, opts.dtype(torch::kBFloat16))};
  ASSERT_TRUE(c.AllReduceSum(sums).ok());
  EXPECT_TRUE(torch::equal(sums[0], in));
  EXPECT_EQ(sums[1].sum().item<double>(), 5.0);
  torch::Tensor flag = torch::ones({1}, opts.dtype(torch::kFloat));
  ASSERT_TRUE(c.AllReduceMax(flag).ok());
  EXPECT_EQ(flag.item<float>(), 1.0f);
  torch::Tensor b = torch::full({3}, 7.0, opts.dtype(torch::kFloat));
  ASSERT_TRUE(c.Broadcast(b, 0).ok());
  EXPECT_EQ(b.sum().item<float>(), 21.0f);
  ASSERT_TRUE(c.Barrier().ok());
  EXPECT_FALSE(c.Broadcast(b, 3).ok()) << "root out of range must fail";
}

// Trajectories drift apart step by step (an fp16 overflow skips a step), so the check is on where
// training gets: the mean loss of the last 10 of 30 steps within 5% of fp32's, and learning.
TEST(GpuEngineTest, Bfloat16AndFloat16TrainOnCudaAndTrackFloat32) {
  SKIP_WITHOUT_CUDA();
  Rank f32("cuda:0", torch::kFloat), bf16("cuda:0", torch::kBFloat16), f16("cuda:0", torch::kHalf);
  ASSERT_TRUE(f16.trainer->loss_scaler().enabled);
  double tail[3] = {0, 0, 0}, first = 0;
  int skipped_f16 = 0;
  for (int64_t step = 0; step < 30; ++step) {
    StepStats a = f32.Step(step), b = bf16.Step(step), c = f16.Step(step);
    skipped_f16 += c.skipped;
    EXPECT_FALSE(b.skipped);
    if (step == 0) first = a.loss;
    if (step >= 20) {
      tail[0] += a.loss / 10;
      tail[1] += b.loss / 10;
      tail[2] += c.loss / 10;
    }
  }
  EXPECT_LT(Rel(tail[1], tail[0]), 5e-2) << "bf16 " << tail[1] << " fp32 " << tail[0];
  EXPECT_LT(Rel(tail[2], tail[0]), 5e-2) << "fp16 " << tail[2] << " fp32 " << tail[0];
  EXPECT_LT(skipped_f16, 5) << "fp16 loss scaling must settle within a few steps";
  EXPECT_GT(f16.trainer->loss_scaler().scale, 1.0);
  EXPECT_LT(tail[0], first - 0.1);
  EXPECT_LT(tail[1], first - 0.1);
}

TEST(GpuEngineTest, UlyssesTrainRunsAStagedJobOnCuda) {
  SKIP_WITHOUT_CUDA();
  const char* bin = std::getenv("ULYSSES_BIN_DIR");
  const char* src = std::getenv("ULYSSES_SOURCE_DIR");
  ASSERT_TRUE(bin && src);
  const fs::path out =
      fs::temp_directory_path() / ("ulysses_gpu_train_" + std::to_string(getpid()));
  ulysses::RemoveTree(out).IgnoreError();
  // tiny-demo: 1k at sp 1, 2k at sp 2 (two ranks sharing cuda:0 over Gloo), 4k at sp 4.
  const std::string cmd = std::string(bin) + "/ulysses-train train -f " + src +
                          "/configs/jobs/tiny-demo.yaml --device cuda --out " + out.string() +
                          " --set spec.stages[0].steps=4 --set spec.stages[1].steps=3"
                          " --set spec.stages[2].steps=2 --set spec.model.dtype=bfloat16";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
  std::ifstream metrics(out / "metrics.jsonl");
  int steps = 0, evals = 0;
  std::string line;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval")) {
      ++evals;
      EXPECT_TRUE(std::isfinite(j["eval"]["loss"].get<double>()));
    } else {
      ++steps;
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
    }
  }
  EXPECT_EQ(steps, 9);
  EXPECT_EQ(evals, 3);
  ulysses::RemoveTree(out).IgnoreError();
}

int Dispatch(const ChildEnv& env) {
  if (env.scenario == "sp") return SpChild(env);
  return 2;
}

}  // namespace
}  // namespace ulysses::engine::train

ULYSSES_RANK_CHILD_MAIN(ulysses::engine::train::Dispatch);
