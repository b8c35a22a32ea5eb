#include "worker/engine/train/rank_setup.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "worker/engine/train/model_io.h"

namespace ulysses::engine::train {

using json = nlohmann::json;
using model::LlamaConfig;

absl::StatusOr<spec::JobSpec> LoadSpec(const std::string& path,
                                       const std::vector<std::string>& overrides) {
  spec::ParseOptions opts;
  opts.overrides = overrides;
  return spec::LoadJobSpecFile(path, opts);
}

AdamWConfig AdamWConfigFromSpec(const spec::OptimizerSpec& o) {
  AdamWConfig c;
  c.beta1 = o.beta1;
  c.beta2 = o.beta2;
  c.eps = o.eps;
  c.weight_decay = o.weight_decay;
  return c;
}

absl::StatusOr<RankSetup> SetUpRank(const spec::JobSpec& spec, const LlamaConfig& config,
                                    const ParallelConfig& pc, bool structure_only) {
  RETURN_IF_ERROR(CheckUlyssesHeads(config.num_attention_heads, config.num_key_value_heads, pc.sp));
  ASSIGN_OR_RETURN(torch::Dtype dtype, model::ParseDtype(spec.model.dtype));
  if (dtype == torch::kHalf && pc.device == "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat(spec::fields::PathOf(&spec::ModelSpec::dtype),
                     ": float16 on a CPU device: libtorch has no float16 matrix products on "
                     "CPU (use bfloat16 or float32 on CPU; float16 runs on cuda devices)"));
  }
  if (spec.memory.attention_block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec::fields::PathOf(&spec::MemorySpec::attention_block_size), ": must be > 0"));
  }
  RankSetup s;
  ASSIGN_OR_RETURN(s.rt, Parallelize(pc));
  if (structure_only) {
    ASSIGN_OR_RETURN(s.model, BuildModelStructure(config, MemoryOptionsFromSpec(spec)));
  } else {
    ASSIGN_OR_RETURN(
        s.model, BuildModel(config, MemoryOptionsFromSpec(spec), spec.seed, s.rt.device, dtype));
  }
  AttentionOptions attn;
  attn.block_size = spec.memory.attention_block_size;
  s.attention = UlyssesAttentionFn(s.rt.groups.sp.get(), attn);
  return s;
}

int RanksOnThisHost(const torch::Device& device, int world_size) {
  if (!device.is_cuda()) return world_size;
  return std::max(1, std::min<int>(world_size, static_cast<int>(torch::cuda::device_count())));
}

int SetIntraOpThreads(int threads) {
  at::set_num_threads(threads);
  // OpenBLAS's C API (cblas.h), looked up at run time: the engine links the BLAS interface, not
  // OpenBLAS, and another implementation (MKL in pip torch, which at::set_num_threads covers)
  // has no such symbols.
  using SetFn = void (*)(int);
  using GetFn = int (*)();
  auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (set == nullptr || get == nullptr) return 0;
  set(threads);
  return get();
}

TrainingState TrainingStateOf(const spec::JobSpec& spec, const LlamaConfig& config,
                              const ParallelRuntime& rt, const LossScaler& scaler) {
  TrainingState t;
  t.seed = spec.seed;
  t.sp_degree = rt.sp;
  t.dp_degree = rt.dp;
  t.model_config = config;
  t.dtype = spec.model.dtype;
  // The HF model the job started from, absolute: `ulysses-train export` copies its tokenizer.
  if (!spec.model.init_from.empty()) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(spec.model.init_from, ec);
    t.init_from = ec ? spec.model.init_from : abs.lexically_normal().string();
  }
  if (scaler.enabled) {
    t.loss_scale = scaler.scale;
    t.loss_scale_good_steps = scaler.good_steps;
  }
  return t;
}

void RestoreLossScale(const TrainingState& training, LossScaler& scaler) {
  if (!scaler.enabled || !training.loss_scale) return;
  scaler.scale = *training.loss_scale;
  scaler.good_steps = training.loss_scale_good_steps;
}

}  // namespace ulysses::engine::train
