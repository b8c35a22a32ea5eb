#include "worker/engine/train/rank_setup.h"

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "worker/engine/train/model_io.h"

namespace ulysses::engine::train {

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

}  // namespace ulysses::engine::train
