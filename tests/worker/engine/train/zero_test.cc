// Data parallelism and ZeRO against one rank, through the real training step (train_step.h),
// the real data path (batches.h: DP replicas read disjoint sequences) and real checkpoints, with
// real rank processes over Gloo (tests/testing/rank_processes.h).
//
// Every layout of one test trains on the same GLOBAL batch of 4 sequences per step: one rank
// reads them as 4 micro-batches, dp D ranks as 4/D micro-batches each. So a DP replica that
// read another's sequence, or the wrong one, changes the loss.
//
//   * sp x dp layouts sp2xdp2, sp1xdp4, sp4xdp1 equal one rank (fp64): per-step losses and
//     gradient norms (rel 1e-10), the final weights and AdamW moments (1e-10 x scale).
//   * a checkpoint written at dp 4 resumes at dp 1 / sp 2 and continues like the uninterrupted run.
//   * ZeRO stages 1, 2 (with and without per-layer reduction) and 3 equal stage 0 over 20 steps
//     at sp2xdp2 and sp4 (fp64, rel 1e-9 against the 1e-6).
//   * each ZeRO rank writes only its chunks; a ZeRO-3 sp4 checkpoint resumes at ZeRO-0 sp1 and
//     the reverse, and exports to HF with the trained weights.
//   * bf16 parameters with fp32 gradients train under ZeRO-3 like under stage 0.
//   * offload_optimizer + offload_activations on CPU: the same code path as on a GPU, bit-equal.
//   * kept attention outputs at ZeRO 0 and ZeRO 3 (with offload): bit-equal to recomputing.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "tests/testing/rank_processes.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/data/batches.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/hf/export.h"
#include "worker/engine/hf/hf.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/ulysses_attention.h"
#include "worker/engine/train/commit.h"
#include "worker/engine/train/engine.h"
#include "worker/engine/train/evaluate.h"
#include "worker/engine/train/model_io.h"
#include "worker/engine/train/resume.h"
#include "worker/engine/train/train_step.h"
#include "worker/engine/train/zero.h"

namespace ulysses::engine::train {
namespace {

constexpr int64_t kSeq = 16;
constexpr int64_t kGlobalBatch = 4;  // sequences per optimizer step, whatever the layout

std::string Env(const char* name, const std::string& def = "") {
  const char* v = std::getenv(name);
  return v ? v : def;
}
int EnvInt(const char* name, int def) { return std::atoi(Env(name, std::to_string(def)).c_str()); }

// Child: one rank of one run. Config from ZT_* variables; rank 0 writes per-step
// [loss, grad_norm] to ZT_OUT (JSON); every rank commits a final checkpoint under ZT_CKPT_OUT
// (when set), after resuming from ZT_RESUME (when set).
int ChildMain(const ::ulysses::testing::ChildEnv& env) {
  const int sp = EnvInt("ZT_SP", 1), zero_stage = EnvInt("ZT_ZERO", 0);
  const int steps = EnvInt("ZT_STEPS", 3), first_step = EnvInt("ZT_FIRST_STEP", 0);
  const bool checkpointing = EnvInt("ZT_AC", 0) != 0;
  const bool bf16 = Env("ZT_DTYPE", "float64") == "bfloat16";
  const int dp = env.world / sp;
  CommConfig comm;
  comm.rank = env.rank;
  comm.world_size = env.world;
  comm.sp_size = sp;
  comm.master_port = env.port;
  auto groups = CreateProcessGroups(comm);
  CHILD_CHECK(env, groups.ok(), groups.status());

  model::MemoryOptions mem;
  mem.activation_checkpointing = checkpointing;
  mem.offload_activations = EnvInt("ZT_OFFLOAD_ACT", 0) != 0;
  mem.keep_attention_outputs = EnvInt("ZT_KEEP", 0) != 0;
  // ZeRO-3 as the engine runs it: the sharded init (each rank makes only its chunks).
  const bool sharded = zero_stage == 3;
  auto built = sharded ? BuildModelStructure(::ulysses::testing::TinyLlama(), mem)
                       : BuildModel(::ulysses::testing::TinyLlama(), mem, /*seed=*/99, torch::kCPU,
                                    bf16 ? torch::kBFloat16 : torch::kDouble);
  CHILD_CHECK(env, built.ok(), built.status());
  model::LlamaForCausalLM m = *built;
  AdamWConfig ac;
  ac.weight_decay = 0.1;
  AdamW adam(ac);
  std::optional<CheckpointState> resume;
  if (!Env("ZT_RESUME").empty()) {
    // As the engine resumes: only this rank's share, then the weights it holds whole.
    LoadStats read;
    auto st = LoadCheckpointShare(Env("ZT_RESUME"), "",
                                  ResumeShare(m, zero_stage, env.rank, env.world), &read);
    CHILD_CHECK(env, st.ok(), st.status());
    resume = std::move(*st);
    if (zero_stage < 3) {
      CHILD_CHECK(env, RestoreModel(*resume, Env("ZT_RESUME"), m).ok(), "restore model");
    }
    std::ofstream(absl::StrCat(Env("ZT_OUT"), ".read.", env.rank)) << read.data_bytes;
  }
  std::unique_ptr<ZeroSharding> zero;
  if (zero_stage > 0) {
    ZeroOptions zo;
    zo.stage = zero_stage;
    zo.offload_optimizer = EnvInt("ZT_OFFLOAD_OPT", 0) != 0;
    zo.activation_checkpointing = checkpointing;
    zo.sharded_init = sharded;
    if (Env("ZT_RESUME").empty()) zo.init_seed = 99;
    zo.dtype = bf16 ? torch::kBFloat16 : torch::kDouble;
    auto z = ZeroSharding::Create(m, groups->world.get(), &adam, zo, torch::kCPU);
    CHILD_CHECK(env, z.ok(), z.status());
    zero = std::move(*z);
  }
  // ZT_OBSERVE_OUT: at the run's first gradient reduction, how many parameters hold a gradient.
  // All of them when reductions run after backward; fewer when layers reduce inside backward
  // (the earlier layers' gradients do not exist yet). Stage 2 gathers nothing before it.
  int64_t grads_at_first_reduction = -1;
  if (zero != nullptr && !Env("ZT_OBSERVE_OUT").empty()) {
    zero->SetObserver([&] {
      if (grads_at_first_reduction >= 0) return;
      grads_at_first_reduction = 0;
      for (const torch::Tensor& p : m->parameters()) grads_at_first_reduction += p.grad().defined();
    });
  }
  if (resume) {
    auto training = TrainingState::FromJson(resume->extra, "checkpoint");
    CHILD_CHECK(env, training.ok(), training.status());
    absl::Status s = RestoreOptimizer(*resume, *training, m, adam, zero.get());
    CHILD_CHECK(env, s.ok(), s);
    resume.reset();  // the share lives in the model / ZeRO chunks now
  }
  Communicator* spc = groups->sp.get();
  AttentionOptions attn_opts;
  attn_opts.block_size = 4;
  AttentionCallback attn = UlyssesAttentionFn(spc, attn_opts);
  Trainer trainer(m, attn, groups->world.get(), &adam, /*grad_clip=*/0.5, torch::kCPU, zero.get());

  auto data = OpenSynthetic("random", Split::kTrain, 64, /*seed=*/7, 8);
  CHILD_CHECK(env, data.ok(), data.status());
  BatchLayout layout;
  layout.seq_len = kSeq;
  layout.sp = sp;
  layout.sp_rank = groups->sp_rank;
  layout.dp = dp;
  layout.dp_rank = groups->dp_rank;
  layout.grad_accum = kGlobalBatch / dp;
  nlohmann::json out = nlohmann::json::array();
  for (int step = first_step; step < first_step + steps; ++step) {
    auto batches = StepMicroBatches(**data, layout, step * layout.GlobalBatch());  // the cursor
    CHILD_CHECK(env, batches.ok(), batches.status());
    auto stats = trainer.Step(*batches, /*lr=*/2e-3, step);
    CHILD_CHECK(env, stats.ok(), stats.status());
    CHILD_CHECK(env, !stats->skipped, "step " << step << " skipped");
    out.push_back({stats->loss, stats->grad_norm, stats->tokens});
  }
  if (!Env("ZT_CKPT_OUT").empty()) {
    spec::JobSpec spec;
    spec.checkpoint.keep_last = 1;
    CommitPoint point{0, first_step + steps, first_step + steps, false};
    TrainingState extra;
    extra.model_config = ::ulysses::testing::TinyLlama();
    extra.dtype = bf16 ? "bfloat16" : "float64";
    auto c =
        CommitTraining(spec, Env("ZT_CKPT_OUT"), point, m, adam, extra, *groups->world, zero.get());
    CHILD_CHECK(env, c.ok(), c.status());
  }
  if (EnvInt("ZT_EVAL", 0) > 0) {
    // Evaluation over ZT_EVAL validation sequences, which need not divide over the replicas.
    auto val = OpenSynthetic("random", Split::kValidation, 64, /*seed=*/7, EnvInt("ZT_EVAL", 0));
    CHILD_CHECK(env, val.ok(), val.status());
    ParallelRuntime rt;
    rt.sp = sp;
    rt.dp = dp;
    rt.groups = std::move(*groups);  // the communicators stay where zero and trainer point
    if (zero) CHILD_CHECK(env, zero->GatherOuter().ok(), "gather outer");
    auto ev = Evaluate(m, attn, rt, **val, EnvInt("ZT_EVAL", 0), kSeq, false);
    CHILD_CHECK(env, ev.ok(), ev.status());
    if (zero) zero->ReleaseOuter();
    if (env.rank == 0) out.push_back({ev->loss, ev->tokens});
  }
  if (env.rank == 0) std::ofstream(Env("ZT_OUT")) << out.dump();
  if (env.rank == 0 && zero != nullptr && !Env("ZT_OBSERVE_OUT").empty()) {
    std::ofstream(Env("ZT_OBSERVE_OUT")) << nlohmann::json{
        {"grads_at_first_reduction", grads_at_first_reduction},
        {"parameters", m->parameters().size()},
        {"per_layer_grads",
         zero->per_layer_grads()}}.dump();
  }
  return 0;
}

ULYSSES_RANK_CHILD_MAIN(ChildMain);

struct Run {
  int world = 1, sp = 1, zero = 0, steps = 3, first_step = 0;
  int eval = 0;  // validation sequences evaluated after training (0: none)
  bool checkpointing = false, offload = false;
  bool keep_attention = false;  // kept attention outputs (with checkpointing)
  bool observe = false;         // record when the first gradient reduction runs (ZeRO >= 2)
  std::string dtype = "float64";
  std::string resume, ckpt_out;  // checkpoint to resume from / root to commit into
};

struct Result {
  std::vector<double> loss, grad_norm, tokens;
  std::optional<std::pair<double, int64_t>> eval;  // (loss, tokens) when Run::eval > 0
  std::vector<int64_t> read_bytes;                 // tensor bytes each rank read to resume
  std::map<std::string, torch::Tensor> tensors;    // the committed checkpoint's, when any
  std::string checkpoint;                          // its step dir
  nlohmann::json observed;                         // Run::observe: see ZT_OBSERVE_OUT
};

Result Train(const Run& r) {
  ::ulysses::testing::TempDir dir("ulysses-zero");
  const std::string out = dir.Sub("losses.json");
  std::vector<std::string> env = {"ZT_OUT=" + out,
                                  absl::StrCat("ZT_SP=", r.sp),
                                  absl::StrCat("ZT_ZERO=", r.zero),
                                  absl::StrCat("ZT_STEPS=", r.steps),
                                  absl::StrCat("ZT_FIRST_STEP=", r.first_step),
                                  absl::StrCat("ZT_AC=", r.checkpointing ? 1 : 0),
                                  absl::StrCat("ZT_OFFLOAD_OPT=", r.offload ? 1 : 0),
                                  absl::StrCat("ZT_OFFLOAD_ACT=", r.offload ? 1 : 0),
                                  absl::StrCat("ZT_KEEP=", r.keep_attention ? 1 : 0),
                                  "ZT_DTYPE=" + r.dtype,
                                  "ZT_RESUME=" + r.resume,
                                  absl::StrCat("ZT_EVAL=", r.eval),
                                  "ZT_CKPT_OUT=" + r.ckpt_out,
                                  "ZT_OBSERVE_OUT=" + (r.observe ? dir.Sub("observed.json") : "")};
  const auto results =
      ::ulysses::testing::RunChildren("rank", r.world, std::chrono::seconds(120), env);
  Result res;
  for (int i = 0; i < r.world; ++i) {
    EXPECT_EQ(results[i].exit_code, 0)
        << "rank " << i << " of " << r.world << " (zero " << r.zero << ", sp " << r.sp << ")";
    if (results[i].exit_code != 0) return res;
  }
  std::ifstream in(out);
  nlohmann::json j = nlohmann::json::parse(in);
  for (int i = 0; !r.resume.empty() && i < r.world; ++i) {
    std::ifstream bytes(absl::StrCat(out, ".read.", i));
    int64_t n = -1;
    bytes >> n;
    res.read_bytes.push_back(n);
  }
  if (r.eval > 0 && !j.empty()) {
    res.eval = {j.back()[0].get<double>(), j.back()[1].get<int64_t>()};
    j.erase(j.size() - 1);
  }
  for (const auto& step : j) {
    res.loss.push_back(step[0].get<double>());
    res.grad_norm.push_back(step[1].get<double>());
    res.tokens.push_back(step[2].get<double>());
  }
  if (r.observe) res.observed = nlohmann::json::parse(std::ifstream(dir.Sub("observed.json")));
  if (!r.ckpt_out.empty()) {
    auto latest = LatestCommittedCheckpoint(r.ckpt_out);
    EXPECT_TRUE(latest.ok()) << latest.status();
    if (!latest.ok()) return res;
    res.checkpoint = *latest;
    auto st = LoadCheckpoint(*latest, "");
    EXPECT_TRUE(st.ok()) << st.status();
    if (st.ok()) {
      for (auto& t : st->tensors) res.tensors[t.name] = t.tensor;
    }
  }
  return res;
}

void ExpectSameTraining(const Result& a, const Result& b, double rel, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_FALSE(a.loss.empty());
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (size_t i = 0; i < a.loss.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i));
    EXPECT_EQ(a.tokens[i], kGlobalBatch * kSeq);  // the whole global batch, every label
    EXPECT_EQ(a.tokens[i], b.tokens[i]);
    EXPECT_NEAR(a.loss[i], b.loss[i], rel * std::abs(a.loss[i]));
    EXPECT_NEAR(a.grad_norm[i], b.grad_norm[i], rel * std::abs(a.grad_norm[i]));
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    SCOPED_TRACE(name);
    auto it = b.tensors.find(name);
    ASSERT_NE(it, b.tensors.end());
    ASSERT_EQ(t.sizes(), it->second.sizes());
    const double scale = 1 + t.abs().max().item<double>();
    EXPECT_LE((t.to(torch::kDouble) - it->second.to(torch::kDouble)).abs().max().item<double>(),
              rel * scale);
  }
}

// Fresh checkpoint root under a test-owned temp dir.
struct Roots {
  ::ulysses::testing::TempDir dir{"ulysses-zero-ckpt"};
  std::string Get(const std::string& name) { return dir.Sub(name); }
};

TEST(DataParallelTest, SpDpLayoutsMatchOneRankOverTheSameGlobalBatch) {
  Roots roots;
  const Result one = Train({.world = 1, .sp = 1, .ckpt_out = roots.Get("one")});
  ExpectSameTraining(one, Train({.world = 4, .sp = 2, .ckpt_out = roots.Get("sp2dp2")}), 1e-10,
                     "sp2xdp2");
  ExpectSameTraining(one, Train({.world = 4, .sp = 1, .ckpt_out = roots.Get("sp1dp4")}), 1e-10,
                     "sp1xdp4");
  ExpectSameTraining(one, Train({.world = 4, .sp = 4, .ckpt_out = roots.Get("sp4dp1")}), 1e-10,
                     "sp4xdp1");
  // Every parameter trained and AdamW state saved (the comparison is not vacuous).
  EXPECT_EQ(one.tensors.size(), 3 * 21u);
}

TEST(DataParallelTest, CheckpointAtDp4ResumesAtDp1) {
  Roots roots;
  const Result straight = Train({.world = 1, .sp = 1, .steps = 4});
  const Result first = Train({.world = 4, .sp = 1, .steps = 2, .ckpt_out = roots.Get("dp4")});
  ASSERT_FALSE(first.checkpoint.empty());
  const Result second =
      Train({.world = 2, .sp = 2, .steps = 2, .first_step = 2, .resume = first.checkpoint});
  ASSERT_EQ(second.loss.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(first.loss[i], straight.loss[i], 1e-10 * straight.loss[i]);
    EXPECT_NEAR(second.loss[i], straight.loss[2 + i], 1e-10 * straight.loss[2 + i]);
  }
}

TEST(ZeroTest, StagesOneToThreeMatchStageZeroAtSp2Dp2AndSp4) {
  Roots roots;
  for (int sp : {2, 4}) {
    const Result base = Train({.world = 4,
                               .sp = sp,
                               .zero = 0,
                               .steps = 20,
                               .checkpointing = true,
                               .ckpt_out = roots.Get(absl::StrCat(sp, "z0"))});
    for (int stage : {1, 2, 3}) {
      ExpectSameTraining(base,
                         Train({.world = 4,
                                .sp = sp,
                                .zero = stage,
                                .steps = 20,
                                .checkpointing = true,
                                .ckpt_out = roots.Get(absl::StrCat(sp, "z", stage))}),
                         1e-9, absl::StrCat("sp ", sp, " zero ", stage));
    }
  }
}

TEST(ZeroTest, StageTwoWithoutCheckpointingReducesAfterBackward) {
  const Result base = Train({.world = 4, .sp = 2, .zero = 0, .steps = 5});
  const Result after = Train({.world = 4, .sp = 2, .zero = 2, .steps = 5, .observe = true});
  ExpectSameTraining(base, after, 1e-9, "zero 2 without activation checkpointing");
  // When: the first reduction comes once backward has finished (every parameter has its
  // gradient), not from per-layer hooks inside backward.
  ASSERT_TRUE(after.observed.is_object());
  EXPECT_FALSE(after.observed["per_layer_grads"].get<bool>());
  EXPECT_EQ(after.observed["grads_at_first_reduction"], after.observed["parameters"]);
  // With activation checkpointing the layers reduce inside backward: the first reduction runs
  // while the earlier layers have no gradient yet (so the observation can tell them apart).
  const Result during =
      Train({.world = 4, .sp = 2, .zero = 2, .steps = 1, .checkpointing = true, .observe = true});
  ASSERT_TRUE(during.observed.is_object());
  EXPECT_TRUE(during.observed["per_layer_grads"].get<bool>());
  EXPECT_GT(during.observed["grads_at_first_reduction"].get<int64_t>(), 0);
  EXPECT_LT(during.observed["grads_at_first_reduction"].get<int64_t>(),
            during.observed["parameters"].get<int64_t>());
}

// Each rank's shard file holds only pieces (its chunks), and they tile every tensor.
void ExpectOnlyOwnedPieces(const std::string& step_dir, int world) {
  std::ifstream in(step_dir + "/manifest.json");
  nlohmann::json manifest = nlohmann::json::parse(in);
  EXPECT_EQ(manifest["version"], 2);
  std::map<std::string, int64_t> per_name;
  for (const auto& t : manifest["tensors"]) {
    ASSERT_TRUE(t.contains("full_shape")) << t.dump();
    const std::string name = t["name"];
    int64_t numel = 1;
    for (int64_t d : t["full_shape"].get<std::vector<int64_t>>()) numel *= d;
    const int64_t chunk = (numel + world - 1) / world;
    EXPECT_EQ(t["elem_offset"].get<int64_t>(), t["shard"].get<int64_t>() * chunk) << name;
    per_name[name] += t["shape"][0].get<int64_t>();
    EXPECT_LE(t["shape"][0].get<int64_t>(), chunk) << name;
  }
  EXPECT_EQ(per_name.size(), 3 * 21u);
}

TEST(ZeroTest, Zero3Sp4CheckpointResumesAtZero0Sp1AndBackAndExports) {
  Roots roots;
  const Result straight = Train({.world = 1, .sp = 1, .steps = 4, .checkpointing = true});
  // ZeRO-3 at sp 4 -> ZeRO-0 at sp 1.
  const Result z3 = Train({.world = 4,
                           .sp = 4,
                           .zero = 3,
                           .steps = 2,
                           .checkpointing = true,
                           .ckpt_out = roots.Get("z3")});
  ASSERT_FALSE(z3.checkpoint.empty());
  ExpectOnlyOwnedPieces(z3.checkpoint, 4);
  const Result z0 = Train({.world = 1,
                           .sp = 1,
                           .zero = 0,
                           .steps = 2,
                           .first_step = 2,
                           .checkpointing = true,
                           .resume = z3.checkpoint,
                           .ckpt_out = roots.Get("z0")});
  ASSERT_EQ(z0.loss.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(z3.loss[i], straight.loss[i], 1e-9 * straight.loss[i]);
    EXPECT_NEAR(z0.loss[i], straight.loss[2 + i], 1e-9 * straight.loss[2 + i]);
  }
  // ZeRO-0 sp 1 -> ZeRO-3 at sp 4 (from the 2-step ZeRO-0 checkpoint of a fresh run).
  const Result z0_first = Train(
      {.world = 1, .sp = 1, .steps = 2, .checkpointing = true, .ckpt_out = roots.Get("z0first")});
  const Result z3_second = Train({.world = 4,
                                  .sp = 4,
                                  .zero = 3,
                                  .steps = 2,
                                  .first_step = 2,
                                  .checkpointing = true,
                                  .resume = z0_first.checkpoint});
  ASSERT_EQ(z3_second.loss.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(z3_second.loss[i], straight.loss[2 + i], 1e-9 * straight.loss[2 + i]);
  }
  // HF export of the ZeRO-3 checkpoint: the reassembled trained weights (a misplaced piece is off
  // by the weights' scale, 1e-2).
  ::ulysses::testing::TempDir hf("ulysses-zero-hf");
  ExportOptions eo;
  eo.checkpoint = z3.checkpoint;
  eo.hf_out = hf.Sub("hf");
  auto exported = ExportCheckpoint(eo);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->tensors, 21);
  model::LlamaForCausalLM loaded(::ulysses::testing::TinyLlama(), model::MemoryOptions{});
  loaded->to(torch::kDouble);
  ASSERT_TRUE(LoadInitFrom(loaded, eo.hf_out).ok());
  for (auto& [name, p] : Params(loaded)) {
    SCOPED_TRACE(name);
    // The HF round trip (export, then init_from) reads through fp32: equal to fp32 precision.
    const torch::Tensor& saved = z3.tensors.at(kModelPrefix + name);
    EXPECT_LE((p - saved).abs().max().item<double>(), 1e-6 * saved.abs().max().item<double>());
  }
}

// The sharded init (each ZeRO-3 rank generates one parameter at a time and keeps its chunk) equals
// the one-rank init bit for bit: the layout never changes the model.
TEST(ZeroTest, Zero3ShardedInitAtSp2Dp2EqualsOneRankInitBitForBit) {
  Roots roots;
  const Result one = Train({.world = 1, .sp = 1, .steps = 0, .ckpt_out = roots.Get("one")});
  const Result z3 = Train({.world = 4,
                           .sp = 2,
                           .zero = 3,
                           .steps = 0,
                           .checkpointing = true,
                           .ckpt_out = roots.Get("z3")});
  int compared = 0;
  for (const auto& [name, t] : one.tensors) {
    if (name.rfind(kModelPrefix, 0) != 0) continue;
    SCOPED_TRACE(name);
    ASSERT_EQ(z3.tensors.count(name), 1u);
    EXPECT_TRUE(torch::equal(t, z3.tensors.at(name)));
    ++compared;
  }
  EXPECT_EQ(compared, 21);
  // Not vacuous: the weights are the seeded normals (and ones for norms), distinct per parameter.
  EXPECT_FALSE(torch::equal(one.tensors.at("model/model.layers.0.self_attn.q_proj.weight"),
                            one.tensors.at("model/model.layers.1.self_attn.q_proj.weight")));
}

// 3 (and 5) validation sequences over 2 or 4 replicas: some replicas have fewer sequences than
// others. ZeRO-3 gathers every layer over the whole world inside the forward, so a replica that ran
// fewer forwards deadlocked its peers (issue 24); every stage must finish and count each sequence
// once, like one rank.
TEST(ZeroTest, EvalWithUnevenSequencesOverReplicasMatchesOneRankAtEveryStage) {
  for (int n : {3, 5}) {
    const Result one = Train({.world = 1, .sp = 1, .steps = 1, .eval = n, .checkpointing = true});
    ASSERT_TRUE(one.eval.has_value());
    EXPECT_EQ(one.eval->second, n * kSeq);  // every label of every sequence, once
    for (int sp : {2, 1}) {
      for (int stage : {0, 1, 2, 3}) {
        SCOPED_TRACE(absl::StrCat(n, " sequences, sp ", sp, " dp ", 4 / sp, " zero ", stage));
        const Result r = Train(
            {.world = 4, .sp = sp, .zero = stage, .steps = 1, .eval = n, .checkpointing = true});
        ASSERT_TRUE(r.eval.has_value());
        EXPECT_EQ(r.eval->second, one.eval->second);
        EXPECT_NEAR(r.eval->first, one.eval->first, 1e-10 * one.eval->first);
      }
    }
  }
}

// Tensor bytes rank `rank` of `world` must read to resume at `zero` from the checkpoint in
// `step_dir`: the stored entries overlapping what it keeps (the manifest says where each is).
int64_t ExpectedReadBytes(const std::string& step_dir, int zero, int rank, int world) {
  std::ifstream in(step_dir + "/manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(in);
  int64_t bytes = 0;
  for (const auto& t : manifest["tensors"]) {
    const std::string name = t["name"];
    const auto full = t.value("full_shape", t["shape"]).get<std::vector<int64_t>>();
    int64_t n = 1, len = 1;
    for (int64_t d : full) n *= d;
    for (int64_t d : t["shape"].get<std::vector<int64_t>>()) len *= d;
    const int64_t begin = t.value("elem_offset", int64_t{0}), end = begin + len;
    const bool whole = name.rfind("model/", 0) == 0 ? zero < 3 : zero == 0;
    const ElementRange own = whole ? ElementRange{0, n} : ZeroOwnedRange(n, rank, world);
    if (begin < own.end && end > own.begin) bytes += t["bytes"].get<int64_t>();
  }
  return bytes;
}

// A ZeRO-3 sp4 checkpoint resumed at ZeRO-3 sp2xdp2 (same W, another SP/DP), ZeRO-3 over 2 ranks,
// ZeRO-2 over 2 and ZeRO-1 over 4: each continues like the uninterrupted run, and each rank reads
// exactly the stored pieces overlapping what it keeps (counted bytes, not RSS): at ZeRO-3 W=4 the
// ranks read every byte once between them, at W=2 each about half.
TEST(ZeroTest, ResumeReadsOnlyEachRanksShareInEveryLayout) {
  Roots roots;
  const Result straight = Train({.world = 1, .sp = 1, .steps = 4, .checkpointing = true});
  const Result z3 = Train({.world = 4,
                           .sp = 4,
                           .zero = 3,
                           .steps = 2,
                           .checkpointing = true,
                           .ckpt_out = roots.Get("z3")});
  ASSERT_FALSE(z3.checkpoint.empty());
  const int64_t total = ExpectedReadBytes(z3.checkpoint, 0, 0, 1);  // every tensor byte
  struct Layout {
    int world, sp, zero;
  };
  for (const Layout& l : {Layout{4, 2, 3}, Layout{2, 1, 3}, Layout{2, 2, 2}, Layout{4, 1, 1}}) {
    SCOPED_TRACE(absl::StrCat("world ", l.world, " sp ", l.sp, " zero ", l.zero));
    const Result r = Train({.world = l.world,
                            .sp = l.sp,
                            .zero = l.zero,
                            .steps = 2,
                            .first_step = 2,
                            .checkpointing = true,
                            .resume = z3.checkpoint});
    ASSERT_EQ(r.loss.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(r.loss[i], straight.loss[2 + i], 1e-9 * straight.loss[2 + i]);
    }
    ASSERT_EQ(r.read_bytes.size(), static_cast<size_t>(l.world));
    int64_t sum = 0;
    for (int rank = 0; rank < l.world; ++rank) {
      EXPECT_EQ(r.read_bytes[rank], ExpectedReadBytes(z3.checkpoint, l.zero, rank, l.world))
          << "rank " << rank;
      sum += r.read_bytes[rank];
      if (l.zero == 3) EXPECT_LE(r.read_bytes[rank], total / l.world + total / 8) << rank;
    }
    if (l.zero == 3 && l.world == 4) EXPECT_EQ(sum, total);
  }
}

// A ZeRO-3 import (spec.model.init_from): each rank of 4 reads from a multi-file HF directory
// exactly the bytes of its own chunks (plus headers), the ranks together every weight byte once,
// and the pieces are the model's elements.
TEST(ZeroTest, Zero3ImportReadsOnlyEachRanksShareOfTheHfFiles) {
  ::ulysses::testing::TempDir dir;
  auto m = BuildModel(::ulysses::testing::TinyLlama(), {}, 7, torch::kCPU, torch::kFloat);
  ASSERT_TRUE(m.ok()) << m.status();
  std::map<std::string, torch::Tensor> params;
  int64_t total = 0;
  for (auto& [name, p] : Params(*m)) {
    params[name] = p.detach();
    total += p.numel() * 4;
  }
  auto written = WriteHfDirectoryStreaming(
      dir.path() + "/hf", ::ulysses::testing::TinyLlama(),
      [&](const std::string& name) -> absl::StatusOr<torch::Tensor> { return params.at(name); },
      torch::kFloat32, /*max_file_bytes=*/total / 3);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_GE(written->files.size(), 3u);  // model.safetensors.index.json and its files
  const int world = 4;
  int64_t sum = 0;
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const ShareRequest request = ImportShare(*m, rank, world);
    int64_t expected = 0;
    for (const auto& [name, share] : request) expected += (share.end - share.begin) * 4;
    LoadStats read;
    auto pieces = LoadHfWeightsShare(dir.path() + "/hf", request, &read);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    EXPECT_EQ(read.data_bytes, expected);
    EXPECT_LE(read.data_bytes, total / world + total / 8);
    EXPECT_GT(read.metadata_bytes, 0);
    for (const NamedTensor& t : *pieces) {
      const ElementRange own = ZeroOwnedRange(params.at(t.name).numel(), rank, world);
      EXPECT_EQ(t.offset, own.begin) << t.name;
      EXPECT_TRUE(torch::equal(
          t.tensor, params.at(t.name).reshape({-1}).narrow(0, own.begin, own.end - own.begin)))
          << t.name;
    }
    sum += read.data_bytes;
  }
  EXPECT_EQ(sum, total);
}

TEST(ZeroTest, Bf16Zero3TrainsLikeBf16Zero0) {
  const Result base = Train(
      {.world = 4, .sp = 2, .zero = 0, .steps = 5, .checkpointing = true, .dtype = "bfloat16"});
  const Result z3 = Train(
      {.world = 4, .sp = 2, .zero = 3, .steps = 5, .checkpointing = true, .dtype = "bfloat16"});
  ASSERT_EQ(base.loss.size(), 5u);
  ASSERT_EQ(z3.loss.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(z3.loss[i], base.loss[i], 1e-2 * base.loss[i]) << i;
  // Random tokens cannot be learned; the fp64 run pins what the bf16 losses should be.
  const Result fp64 = Train({.world = 4, .sp = 2, .zero = 0, .steps = 5, .checkpointing = true});
  ASSERT_EQ(fp64.loss.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(z3.loss[i], fp64.loss[i], 1e-2 * fp64.loss[i]) << i;
}

// Kept attention outputs replay what the recompute would compute with the same kernels: at ZeRO 0
// and at ZeRO 3 (whose layers gather and free their weights around the forward and the replay),
// with activation offload at stage 3, losses and gradient norms are equal to the bit.
TEST(ZeroTest, KeptAttentionOutputsTrainBitForBitLikeRecomputing) {
  for (int stage : {0, 3}) {
    const bool offload = stage == 3;
    const Result recompute = Train({.world = 4,
                                    .sp = 2,
                                    .zero = stage,
                                    .steps = 4,
                                    .checkpointing = true,
                                    .offload = offload});
    const Result kept = Train({.world = 4,
                               .sp = 2,
                               .zero = stage,
                               .steps = 4,
                               .checkpointing = true,
                               .offload = offload,
                               .keep_attention = true});
    ASSERT_EQ(recompute.loss.size(), 4u);
    ASSERT_EQ(kept.loss.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(recompute.loss[i], kept.loss[i]) << "stage " << stage << " step " << i;
      EXPECT_EQ(recompute.grad_norm[i], kept.grad_norm[i]) << "stage " << stage << " step " << i;
    }
  }
}

TEST(ZeroTest, OffloadOnCpuTakesTheSamePathWithTheSameNumbers) {
  for (int stage : {1, 3}) {
    const Result plain =
        Train({.world = 4, .sp = 2, .zero = stage, .steps = 4, .checkpointing = true});
    const Result offload = Train(
        {.world = 4, .sp = 2, .zero = stage, .steps = 4, .checkpointing = true, .offload = true});
    ASSERT_EQ(plain.loss.size(), 4u);
    ASSERT_EQ(offload.loss.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(plain.loss[i], offload.loss[i]) << "stage " << stage << " step " << i;
      EXPECT_EQ(plain.grad_norm[i], offload.grad_norm[i]) << "stage " << stage << " step " << i;
    }
  }
}

}  // namespace
}  // namespace ulysses::engine::train
