// A table of bad TrainJob specs: each gives an InvalidArgument whose every line names a path,
// and the exact message the table expects.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/spec/job_spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/spec/job_spec_base.h"

namespace ulysses::spec {
namespace {

using ::testing::HasSubstr;
using testing::kBase;
using testing::With;

struct BadCase {
  const char* name;
  std::string yaml;
  const char* expected;
};

std::vector<BadCase> BadCases() {
  const std::string three_stages =
      "  stages:\n    - {seq_len: 8192, steps: 10}\n    - {seq_len: 16384, steps: 5}\n"
      "    - {seq_len: 100001, steps: 5}\n";
  const std::string base_stages =
      "  stages:\n    - {seq_len: 1024, steps: 10}\n    - {seq_len: 2048, steps: 5, sp_degree: "
      "4}\n";
  auto stages = [&](const std::string& s) { return With(base_stages, s); };
  return {
      {"seq_len_not_divisible_by_sp",
       With({{"{sp_degree: 2, dp_degree: 1}", "{sp_degree: 8}"}, {base_stages, three_stages}}),
       "spec.stages[2].seq_len: 100001 is not divisible by sp_degree 8 (try 98304 or 106496)"},
      {"short_seq_len_not_divisible",
       stages("  stages:\n    - {seq_len: 1001, steps: 10, sp_degree: 8}\n"),
       "spec.stages[0].seq_len: 1001 is not divisible by sp_degree 8 (try 1000 or 1008)"},
      {"unknown_key", With("  optimizer:", "  optimzer:"),
       "spec.optimzer: unknown key (did you mean 'optimizer'?)"},
      {"unknown_stage_key", With("{seq_len: 1024, steps: 10}", "{seqlen: 1024, steps: 10}"),
       "spec.stages[0].seqlen: unknown key (did you mean 'seq_len'?)"},
      {"unknown_key_far", With("{preset: tiny}", "{preset: tiny, banana: 1}"),
       "spec.model.banana: unknown key (valid keys: preset, family, vocab_size,"},
      {"wrong_type_int", With("{seq_len: 1024, steps: 10}", "{seq_len: 1024, steps: ten}"),
       "spec.stages[0].steps: 'ten' is not an integer"},
      {"wrong_type_double", With("lr: 1.0e-3", "lr: fast"),
       "spec.optimizer.lr: 'fast' is not a number"},
      {"wrong_type_bool", With("{tiled_loss: true}", "{tiled_loss: maybe}"),
       "spec.memory.tiled_loss: 'maybe' is not a boolean (write true or false)"},
      {"wrong_type_section", With("{preset: tiny}", "tiny"),
       "spec.model: 'tiny' is not a mapping (expected keys: preset, family, vocab_size"},
      {"wrong_type_stages", stages("  stages: 3\n"), "spec.stages: '3' is not a list"},
      {"wrong_type_betas", With("betas: [0.9, 0.95]", "betas: 0.9"),
       "spec.optimizer.betas: '0.9' is not a list of two numbers"},
      {"negative_seed", With("seed: 7", "seed: -1"),
       "spec.seed: '-1' is not a non-negative integer"},
      {"duplicate_key", With("  seed: 7\n", "  seed: 7\n  seed: 8\n"), "spec.seed: duplicate key"},
      {"malformed_yaml", With("{preset: tiny}", "{preset: tiny"), "yaml: line "},
      {"bad_indent", With("  seed: 7\n", " seed: 7\n"), "yaml: line 17, column"},
      {"empty_document", "", "(document): empty document"},
      {"only_comment", "# nothing here\n", "(document): empty document"},
      {"top_level_list", "- a\n- b\n", "(document): a list is not a mapping"},
      {"top_level_scalar", "hello\n", "(document): 'hello' is not a mapping"},
      {"two_documents", std::string(kBase) + "---\n" + kBase,
       "(document): more than one YAML document"},
      {"api_version", With("ulysses/v1", "ulysses/v2"),
       "apiVersion: 'ulysses/v2' is not supported (use ulysses/v1)"},
      {"kind", With("kind: TrainJob", "kind: Job"), "kind: 'Job' is not supported (use TrainJob)"},
      {"missing_kind", With("kind: TrainJob\n", ""), "kind: missing (add kind: TrainJob)"},
      {"name_missing", With("  name: unit-test\n", ""), "metadata.name: '' is missing"},
      {"name_not_dns", With("name: unit-test", "name: Unit_Test"),
       "metadata.name: 'Unit_Test' is not a DNS-1123 label"},
      {"no_stages", stages("  stages: []\n"), "spec.stages: [] is empty (add at least one stage"},
      {"steps_zero", With("{seq_len: 1024, steps: 10}", "{seq_len: 1024, steps: 0}"),
       "spec.stages[0].steps: 0 must be > 0"},
      {"seq_len_zero", With("{seq_len: 1024, steps: 10}", "{seq_len: 0, steps: 10}"),
       "spec.stages[0].seq_len: 0 must be > 0"},
      {"seq_len_not_increasing", With("{seq_len: 1024, steps: 10}", "{seq_len: 4096, steps: 10}"),
       "spec.stages[1].seq_len: 2048 is not greater than stages[0].seq_len 4096"},
      {"heads_not_divisible_by_sp", With("{sp_degree: 2, dp_degree: 1}", "{sp_degree: 3}"),
       "spec.parallelism.sp_degree: 3 does not divide num_attention_heads 8 (each rank needs "
       "whole query heads, so sp_degree is at most 8; use one of 1, 2, 4, 8)"},
      {"stage_sp_against_heads", With("steps: 5, sp_degree: 4", "steps: 5, sp_degree: 16"),
       "spec.stages[1].sp_degree: 16 does not divide num_attention_heads 8"},
      {"kv_heads_incompatible",
       With({{"{preset: tiny}",
              "{preset: tiny, hidden_size: 384, num_attention_heads: 12, "
              "num_key_value_heads: 6}"}}),
       "spec.stages[1].sp_degree: 4 is incompatible with num_key_value_heads 6: neither divides "
       "the other"},
      {"kv_heads_lists_valid_sp",
       With("{preset: tiny}",
            "{preset: tiny, hidden_size: 384, num_attention_heads: 12, "
            "num_key_value_heads: 6}"),
       "with 12 query and 6 kv heads use one of 1, 2, 3, 6, 12"},
      {"unsupported_family", With("{preset: tiny}", "{preset: tiny, family: gemma}"),
       "spec.model.family: 'gemma' is not a supported model family (use one of llama, mistral, "
       "qwen2, qwen3)"},
      {"bias_on_llama", With("{preset: tiny}", "{preset: tiny, attention_bias: true}"),
       "spec.model.attention_bias: true is not what family 'llama' has"},
      {"sliding_window_shorter_than_a_stage",
       With("{preset: tiny}", "{preset: tiny, family: mistral, sliding_window: 1024}"),
       "spec.model.sliding_window: 1024 is shorter than stages[1].seq_len 2048 (the engine "
       "attends over the whole causal prefix"},
      {"hidden_not_divisible_by_heads", With("{preset: tiny}", "{preset: tiny, hidden_size: 250}"),
       "spec.model.hidden_size: 250 is not divisible by num_attention_heads 8"},
      {"q_heads_not_divisible_by_kv",
       With("{preset: tiny}", "{preset: tiny, num_key_value_heads: 3}"),
       "spec.model.num_key_value_heads: 3 does not divide num_attention_heads 8 (each kv head "
       "serves a whole group of query heads; use one of 1, 2, 4, 8)"},
      {"sp_zero", With("{sp_degree: 2, dp_degree: 1}", "{sp_degree: 0}"),
       "spec.parallelism.sp_degree: 0 must be >= 1 (use 1 for no sequence parallelism)"},
      {"dp_zero", With("{sp_degree: 2, dp_degree: 1}", "{sp_degree: 2, dp_degree: 0}"),
       "spec.parallelism.dp_degree: 0 must be >= 1 (use 1 for no data parallelism)"},
      {"stage_dp_zero", With("steps: 5, sp_degree: 4", "steps: 5, dp_degree: -2"),
       "spec.stages[1].dp_degree: -2 must be >= 1"},
      {"vocab_negative", With("{preset: tiny}", "{preset: tiny, vocab_size: -1}"),
       "spec.model.vocab_size: -1 must be > 0"},
      {"layers_zero", With("{preset: tiny}", "{preset: tiny, num_hidden_layers: 0}"),
       "spec.model.num_hidden_layers: 0 must be > 0"},
      {"rope_theta", With("{preset: tiny}", "{preset: tiny, rope_theta: 0}"),
       "spec.model.rope_theta: 0.0 must be > 0"},
      {"rms_norm_eps", With("{preset: tiny}", "{preset: tiny, rms_norm_eps: -1e-5}"),
       "spec.model.rms_norm_eps: -1e-05 must be > 0 (use 1e-5)"},
      {"kv_heads_zero", With("{preset: tiny}", "{preset: tiny, num_key_value_heads: 0}"),
       "spec.model.num_key_value_heads: 0 must be > 0"},
      {"odd_head_dim", With("{preset: tiny}", "{preset: tiny, hidden_size: 24}"),
       "spec.model.hidden_size: 24 gives an odd head_dim 3 (hidden_size / num_attention_heads "
       "8) (RoPE rotates pairs of dimensions, so head_dim must be even; try 16 or 32)"},
      {"rope_type_unknown",
       With("{preset: tiny}", "{preset: tiny, rope_scaling: {rope_type: yarn}}"),
       "spec.model.rope_scaling.rope_type: 'yarn' is not a supported rope type (use none, "
       "llama3 or linear)"},
      {"rope_numbers_without_type",
       With("{preset: tiny}", "{preset: tiny, rope_scaling: {factor: 8}}"),
       "spec.model.rope_scaling.factor: 8.0 is set but rope_scaling.rope_type is 'none' (set "
       "rope_scaling.rope_type: llama3, or remove factor)"},
      {"rope_factor_below_one",
       With("{preset: tiny}", "{preset: llama3-8b, rope_scaling: {factor: 0.5}}"),
       "spec.model.rope_scaling.factor: 0.5 must be >= 1 (Llama 3.1 uses 8.0, Llama 3.2 32.0)"},
      {"rope_low_freq_zero",
       With("{preset: tiny}", "{preset: llama3-8b, rope_scaling: {low_freq_factor: 0}}"),
       "spec.model.rope_scaling.low_freq_factor: 0.0 must be > 0 (Llama 3 uses 1.0)"},
      {"rope_high_not_above_low",
       With("{preset: tiny}", "{preset: llama3-8b, rope_scaling: {high_freq_factor: 1}}"),
       "spec.model.rope_scaling.high_freq_factor: 1.0 must be greater than low_freq_factor 1.0 "
       "(Llama 3 uses high_freq_factor 4.0 and low_freq_factor 1.0)"},
      {"rope_original_max_zero",
       With("{preset: tiny}",
            "{preset: llama3-8b, rope_scaling: {original_max_position_embeddings: 0}}"),
       "spec.model.rope_scaling.original_max_position_embeddings: 0 must be > 0"},
      {"rope_llama3_without_numbers",
       With("{preset: tiny}", "{preset: tiny, rope_scaling: {rope_type: llama3}}"),
       "spec.model.rope_scaling.factor: 0.0 must be >= 1"},
      {"rope_unknown_key", With("{preset: tiny}", "{preset: llama3-8b, rope_scaling: {facter: 8}}"),
       "spec.model.rope_scaling.facter: unknown key (did you mean 'factor'?)"},
      {"rope_not_a_mapping", With("{preset: tiny}", "{preset: tiny, rope_scaling: 8}"),
       "spec.model.rope_scaling: '8' is not a mapping (expected keys: rope_type, factor, "
       "low_freq_factor, high_freq_factor, original_max_position_embeddings)"},
      {"rope_factor_not_a_number",
       With("{preset: tiny}", "{preset: llama3-8b, rope_scaling: {factor: big}}"),
       "spec.model.rope_scaling.factor: 'big' is not a number"},
      {"dtype", With("{preset: tiny}", "{preset: tiny, dtype: fp8}"),
       "spec.model.dtype: 'fp8' is not a supported dtype (use float32, bfloat16, float16 or "
       "float64)"},
      {"unknown_preset", With("{preset: tiny}", "{preset: llama9}"),
       "spec.model.preset: 'llama9' is not a known preset (use tiny, llama3-1b, llama3-8b, "
       "llama3-70b, mistral-7b-v0.3, qwen2.5-7b, qwen3-4b or qwen3-8b"},
      {"zero3_without_checkpointing",
       With("{sp_degree: 2, dp_degree: 1}", "{sp_degree: 2, zero_stage: 3}"),
       "spec.parallelism.zero_stage: 3 needs memory.activation_checkpointing (ZeRO-3 re-gathers "
       "each layer's weights in backward by recomputing the layer) (set "
       "memory.activation_checkpointing: true, or use zero_stage 2)"},
      {"offload_optimizer_without_zero",
       With("{sp_degree: 2, dp_degree: 1}", "{sp_degree: 2, offload_optimizer: true}"),
       "spec.parallelism.offload_optimizer: true needs zero_stage >= 1"},
      {"keep_attention_outputs_without_checkpointing",
       With("{tiled_loss: true}", "{tiled_loss: true, keep_attention_outputs: true}"),
       "spec.memory.keep_attention_outputs: true needs memory.activation_checkpointing (it keeps "
       "the attention outputs that checkpointing would recompute; without checkpointing every "
       "activation is kept anyway) (set memory.activation_checkpointing: true, or "
       "keep_attention_outputs: false)"},
      {"offload_activations_without_checkpointing",
       With("{sp_degree: 2, dp_degree: 1}", "{sp_degree: 2, offload_activations: true}"),
       "spec.parallelism.offload_activations: true needs memory.activation_checkpointing"},
      {"zero_stage_out_of_range",
       With("{sp_degree: 2, dp_degree: 1}", "{sp_degree: 2, zero_stage: 7}"),
       "spec.parallelism.zero_stage: 7 is out of range 0..3 (use 0 (replicated), 1 (optimizer "
       "state sharded), 2 (+ gradients) or 3 (+ parameters))"},
      {"lr_zero", With("lr: 1.0e-3", "lr: 0"), "spec.optimizer.lr: 0.0 must be > 0"},
      {"stage_lr_negative",
       With("{seq_len: 1024, steps: 10}", "{seq_len: 1024, steps: 10, lr: -1}"),
       "spec.stages[0].lr: -1.0 must be > 0"},
      {"beta_one", With("betas: [0.9, 0.95]", "betas: [0.9, 1.0]"),
       "spec.optimizer.betas[1]: 1.0 is outside [0, 1)"},
      {"beta_negative", With("betas: [0.9, 0.95]", "betas: [-0.1, 0.95]"),
       "spec.optimizer.betas[0]: -0.1 is outside [0, 1)"},
      {"eps_zero", With("lr: 1.0e-3", "lr: 1.0e-3, eps: 0"), "spec.optimizer.eps: 0.0 must be > 0"},
      {"grad_clip_negative", With("lr: 1.0e-3", "lr: 1.0e-3, grad_clip: -1"),
       "spec.optimizer.grad_clip: -1.0 must be >= 0"},
      {"warmup_negative", With("warmup_steps: 2", "warmup_steps: -1"),
       "spec.optimizer.warmup_steps: -1 must be >= 0"},
      {"schedule", With("lr: 1.0e-3", "lr: 1.0e-3, schedule: step"),
       "spec.optimizer.schedule: 'step' is not a supported schedule (use constant, linear or "
       "cosine)"},
      {"optimizer_type", With("lr: 1.0e-3", "lr: 1.0e-3, type: sgd"),
       "spec.optimizer.type: 'sgd' is not a supported optimizer (use adamw)"},
      {"grad_accum_zero", With("lr: 1.0e-3", "lr: 1.0e-3, grad_accum_steps: 0"),
       "spec.optimizer.grad_accum_steps: 0 must be >= 1"},
      {"keep_last_zero", With("keep_last: 2", "keep_last: 0"),
       "spec.checkpoint.keep_last: 0 must be >= 1"},
      {"every_steps_negative", With("every_steps: 5", "every_steps: -5"),
       "spec.checkpoint.every_steps: -5 must be >= 0"},
      {"every_steps_auto_with_every_seconds",
       With("every_steps: 5", "every_steps: auto, every_seconds: 600"),
       "spec.checkpoint.every_steps: auto is given with spec.checkpoint.every_seconds: 600 (auto "
       "picks the interval itself) (keep one of the two: every_steps: auto, or every_seconds: N)"},
      {"every_seconds_negative", With("every_steps: 5", "every_seconds: -1"),
       "spec.checkpoint.every_seconds: -1 is outside 0..315360000"},
      {"every_steps_word", With("every_steps: 5", "every_steps: often"),
       "spec.checkpoint.every_steps: 'often' is not an integer"},
      {"async_not_bool", With("keep_last: 2", "keep_last: 2, async: sometimes"),
       "spec.checkpoint.async: 'sometimes' is not a boolean (write true or false)"},
      {"no_data", With("{synthetic: {generator: random}}", "{}"),
       "spec.data: {} has no training data (set data.train to a uint32 token file, or "
       "data.synthetic.generator: random|needle)"},
      {"data_both",
       With("{synthetic: {generator: random}}", "{train: a.bin, synthetic: {generator: random}}"),
       "spec.data.train: 'a.bin' is given together with data.synthetic"},
      {"validation_without_train", With("{synthetic: {generator: random}}", "{validation: v.bin}"),
       "spec.data.validation: 'v.bin' is given without data.train"},
      {"generator", With("generator: random", "generator: zipf"),
       "spec.data.synthetic.generator: 'zipf' is not a supported generator (use random or "
       "needle)"},
      {"needle_small_vocab",
       With({{"{preset: tiny}", "{preset: tiny, vocab_size: 32}"},
             {"generator: random", "generator: needle"}}),
       "spec.data.synthetic.generator: 'needle' needs vocab_size >= 64, got 32"},
      {"needle_short_seq",
       With({{"generator: random", "generator: needle"},
             {base_stages, "  stages:\n    - {seq_len: 8, steps: 10}\n"}}),
       "spec.stages[0].seq_len: 8 is too short for the needle generator (use seq_len >= 16 or "
       "generator: random)"},
      {"huge_world", With("{sp_degree: 2, dp_degree: 1}", "{sp_degree: 2, dp_degree: 9000000}"),
       "spec.stages[0]: sp_degree 2 x dp_degree 9000000 is more than 1048576 ranks (use fewer "
       "ranks)"},
      {"huge_heads_do_not_hang",
       With("{preset: tiny}",
            "{preset: tiny, num_attention_heads: 9223372036854775807, "
            "num_key_value_heads: 3, hidden_size: 9223372036854775806}"),
       "spec.model.num_key_value_heads: 3 does not divide num_attention_heads 9223372036854775807 "
       "(each kv head serves a whole group of query heads; use one of the divisors of "
       "9223372036854775807)"},
      {"huge_seq_len_suggestion",
       With("{seq_len: 2048, steps: 5, sp_degree: 4}",
            "{seq_len: 9223372036854775807, steps: 5, sp_degree: 4}"),
       "spec.stages[1].seq_len: 9223372036854775807 is not divisible by sp_degree 4 (try "
       "9223372036854771712)"},
      {"max_failures", With("{max_failures: 3}", "{max_failures: -1}"),
       "spec.scheduling.max_failures: -1 must be >= 0"},
      {"max_failures_int32", With("{max_failures: 3}", "{max_failures: 2147483648}"),
       "spec.scheduling.max_failures: 2147483648 is more than 2147483647 (use e.g. 3)"},
      {"max_preemptions_int32", With("{max_failures: 3}", "{max_preemptions: 4294967296}"),
       "spec.scheduling.max_preemptions: 4294967296 is more than 2147483647 (use -1 for "
       "unlimited)"},
      {"max_infra_failures", With("{max_failures: 3}", "{max_infra_failures: -2}"),
       "spec.scheduling.max_infra_failures: -2 must be >= 0 (use e.g. 20, or 0 to fail on the "
       "first lost worker or killed rank)"},
      {"failure_window_s", With("{max_failures: 3}", "{failure_window_s: -1}"),
       "spec.scheduling.failure_window_s: -1 must be >= 0 (use e.g. 86400 (one day), or 0 for "
       "no window)"},
      {"failure_window_s_int32", With("{max_failures: 3}", "{failure_window_s: 2147483648}"),
       "spec.scheduling.failure_window_s: 2147483648 is more than 2147483647"},
      {"preemptible_type", With("{max_failures: 3}", "{preemptible: maybe}"),
       "spec.scheduling.preemptible"},
      {"loss_tile_tokens", With("{tiled_loss: true}", "{tiled_loss: true, loss_tile_tokens: 0}"),
       "spec.memory.loss_tile_tokens: 0 must be > 0"},
      {"attention_block_size", With("{tiled_loss: true}", "{attention_block_size: -4}"),
       "spec.memory.attention_block_size: -4 must be > 0"},
      {"data_format", With("{synthetic: {generator: random}}", "{train: t, format: megatron}"),
       "spec.data.format: 'megatron' is not a supported format (use flat or indexed)"},
      {"packing_flat", With("{synthetic: {generator: random}}", "{train: t, packing: false}"),
       "spec.data.packing: false needs format: indexed"},
      {"micro_batch_size", With("warmup_steps: 2}", "warmup_steps: 2, micro_batch_size: 0}"),
       "spec.optimizer.micro_batch_size: 0 is outside 1..4096"},
      {"eval_max_sequences", With("  seed: 7\n", "  eval: {max_sequences: -1}\n  seed: 7\n"),
       "spec.eval.max_sequences: -1 must be >= 0"},
      {"stage_eval_every_steps",
       With("{seq_len: 1024, steps: 10}", "{seq_len: 1024, steps: 10, eval: {every_steps: -2}}"),
       "spec.stages[0].eval.every_steps: -2 must be >= 0"},
  };
}

TEST(JobSpecParserTest, BadSpecsGiveExactMessages) {
  const std::vector<BadCase> cases = BadCases();
  ASSERT_GE(cases.size(), 25u);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<JobSpec> spec = ParseJobSpec(c.yaml);
    ASSERT_FALSE(spec.ok()) << c.yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(spec.status().message());
    EXPECT_THAT(message, HasSubstr(c.expected)) << c.yaml;
    for (absl::string_view line : absl::StrSplit(message, '\n')) {
      EXPECT_THAT(std::string(line), HasSubstr(": ")) << "every line names a path";
    }
  }
}

}  // namespace
}  // namespace ulysses::spec
