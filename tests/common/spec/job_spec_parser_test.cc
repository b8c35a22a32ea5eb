// Parser, validator, overrides, ToYaml round trip, SpecHash and the data-file
// check of common/spec, on the shipped examples (the table of bad specs is in
// job_spec_bad_cases_test.cc, same executable).
#include "common/spec/job_spec_parser.h"
#include "common/file_tree.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/spec/job_spec_base.h"
#include "tests/common/spec/spec_test_util.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::spec {
namespace {

using testing::ExpectSpecEq;
using ::testing::HasSubstr;
using testing::kBase;
using testing::ReadFile;
using testing::ShippedSpec;
using testing::ShippedSpecs;
using testing::With;

TEST(JobSpecParserTest, ShippedExamplesParseAndValidate) {
  const std::vector<std::string> paths = ShippedSpecs();
  // The directory scan finds the demo and the main job (and whatever else is there).
  EXPECT_THAT(paths, ::testing::Contains(ShippedSpec("tiny-demo.yaml")));
  EXPECT_THAT(paths, ::testing::Contains(ShippedSpec("needle-retrieval.yaml")));
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_FALSE(spec->stages.empty());
    EXPECT_GT(spec->model.vocab_size, 0);
  }
}

TEST(JobSpecParserTest, TinyDemoHasTheAgreedShape) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(ShippedSpec("tiny-demo.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->metadata.name, "tiny-demo");
  EXPECT_EQ(spec->model.hidden_size, 256);
  EXPECT_EQ(spec->model.num_key_value_heads, 4);
  ASSERT_TRUE(spec->data.synthetic.has_value());
  EXPECT_EQ(spec->data.synthetic->generator, "needle");
  ASSERT_EQ(spec->stages.size(), 3u);
  const int64_t seq[] = {1024, 2048, 4096}, sp[] = {1, 2, 4};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(spec->stages[i].seq_len, seq[i]);
    EXPECT_EQ(spec->StageSp(i), sp[i]);
  }
  EXPECT_EQ(spec->checkpoint.every_steps, 10);
  EXPECT_EQ(spec->checkpoint.keep_last, 2);
  EXPECT_FALSE(spec->checkpoint.async.has_value());  // unset: decided from host memory
  EXPECT_EQ(spec->seed, 1234u);
}

TEST(JobSpecParserTest, BaseParsesWithDefaults) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kBase);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->metadata.labels.at("team"), "research");
  EXPECT_EQ(spec->optimizer.schedule, "cosine");  // default
  EXPECT_DOUBLE_EQ(spec->optimizer.lr, 1e-3);
  EXPECT_EQ(spec->StageSp(0), 2);  // inherited
  EXPECT_EQ(spec->StageSp(1), 4);  // overridden
  EXPECT_FALSE(spec->stages[0].lr.has_value());
  EXPECT_EQ(spec->seed, 7u);
}

TEST(JobSpecParserTest, PresetsFillShapeAndExplicitFieldsWin) {
  struct Case {
    const char* preset;
    int64_t vocab, hidden, inter, layers, heads, kv;
    double theta;
    bool tied;
    RopeScaling rope;
  } cases[] = {
      {"tiny", 256, 256, 688, 4, 8, 4, 10000.0, false, {}},
      // Meta's config.json of Llama-3.2-1B and Llama-3.1-8B.
      {"llama3-1b",
       128256,
       2048,
       8192,
       16,
       32,
       8,
       500000.0,
       true,
       {"llama3", 32.0, 1.0, 4.0, 8192}},
      {"llama3-8b",
       128256,
       4096,
       14336,
       32,
       32,
       8,
       500000.0,
       false,
       {"llama3", 8.0, 1.0, 4.0, 8192}},
      // Meta's config.json of Llama-3.1-70B.
      {"llama3-70b",
       128256,
       8192,
       28672,
       80,
       64,
       8,
       500000.0,
       false,
       {"llama3", 8.0, 1.0, 4.0, 8192}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.preset);
    ModelSpec m;
    m.preset = c.preset;
    ASSERT_TRUE(ApplyModelPreset(m).ok());
    EXPECT_EQ(m.vocab_size, c.vocab);
    EXPECT_EQ(m.hidden_size, c.hidden);
    EXPECT_EQ(m.intermediate_size, c.inter);
    EXPECT_EQ(m.num_hidden_layers, c.layers);
    EXPECT_EQ(m.num_attention_heads, c.heads);
    EXPECT_EQ(m.num_key_value_heads, c.kv);
    EXPECT_EQ(m.rope_theta, c.theta);
    EXPECT_EQ(m.rms_norm_eps, 1e-5);
    EXPECT_EQ(m.tie_word_embeddings, c.tied);
    EXPECT_EQ(m.rope_scaling.rope_type, c.rope.rope_type);
    EXPECT_EQ(m.rope_scaling.factor, c.rope.factor);
    EXPECT_EQ(m.rope_scaling.low_freq_factor, c.rope.low_freq_factor);
    EXPECT_EQ(m.rope_scaling.high_freq_factor, c.rope.high_freq_factor);
    EXPECT_EQ(m.rope_scaling.original_max_position_embeddings,
              c.rope.original_max_position_embeddings);
  }
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(With("{preset: tiny}", "{preset: tiny, num_hidden_layers: 2, vocab_size: 512}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.num_hidden_layers, 2);
  EXPECT_EQ(spec->model.vocab_size, 512);
  EXPECT_EQ(spec->model.hidden_size, 256);
  ModelSpec unknown;
  unknown.preset = "llama9";
  EXPECT_THAT(std::string(ApplyModelPreset(unknown).message()),
              HasSubstr("'llama9' is not a known preset (use tiny, llama3-1b, llama3-8b, "
                        "llama3-70b, mistral-7b-v0.3, qwen2.5-7b, qwen3-4b or qwen3-8b"));
}

TEST(JobSpecParserTest, KvHeadsDefaultToQueryHeads) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(With("{preset: tiny}",
                        "{vocab_size: 128, hidden_size: 64, intermediate_size: 128, "
                        "num_hidden_layers: 1, num_attention_heads: 4}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.num_key_value_heads, 4);
}

TEST(JobSpecParserTest, InitFromWithoutShapeSkipsShapeChecks) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(With("{preset: tiny}", "{init_from: /models/Llama-3.2-1B, dtype: bfloat16}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.hidden_size, 0);
  EXPECT_EQ(spec->model.init_from, "/models/Llama-3.2-1B");
  // Every shape field is left to config.json, none is defaulted.
  EXPECT_EQ(spec->model.from_init,
            std::set<std::string>(ShapeFieldKeys().begin(), ShapeFieldKeys().end()));
  // Without init_from the same document must name the missing shape.
  absl::StatusOr<JobSpec> bare = ParseJobSpec(With("{preset: tiny}", "{dtype: bfloat16}"));
  ASSERT_FALSE(bare.ok());
  EXPECT_THAT(std::string(bare.status().message()),
              HasSubstr("spec.model.hidden_size: 0 must be > 0 (set it, or use a preset"));
}

TEST(JobSpecParserTest, InitFromKeepsWhatTheDocumentGives) {
  // Given fields are claims about config.json; the rest is read from it.
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      With("{preset: tiny}", "{init_from: /m, rope_theta: 500000, num_attention_heads: 32}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.from_init.count("rope_theta"), 0u);
  EXPECT_EQ(spec->model.from_init.count("num_attention_heads"), 0u);
  EXPECT_EQ(spec->model.from_init.count("num_key_value_heads"), 1u);  // not defaulted to Hq
  EXPECT_EQ(spec->model.from_init.count("rope_scaling.factor"), 1u);
  EXPECT_EQ(spec->model.rope_theta, 500000.0);
  // An explicit "no scaling" settles the scaling numbers too.
  spec = ParseJobSpec(With("{preset: tiny}", "{init_from: /m, rope_scaling: {rope_type: none}}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const std::string& key : ShapeFieldKeys()) {
    EXPECT_EQ(spec->model.from_init.count(key), key.rfind("rope_scaling.", 0) == 0 ? 0u : 1u)
        << key;
  }
  // A preset gives every field: nothing is left to config.json.
  spec = ParseJobSpec(With("{preset: tiny}", "{preset: tiny, init_from: /m}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->model.from_init.empty());
  // An explicit 0 is not "unset".
  absl::StatusOr<JobSpec> zero =
      ParseJobSpec(With("{preset: tiny}", "{init_from: /m, hidden_size: 0}"));
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(std::string(zero.status().message()),
              HasSubstr("spec.model.hidden_size: 0 must be > 0 (set it > 0, or leave it out to "
                        "read it from init_from)"));
}

TEST(JobSpecParserTest, RopeScalingIsReadAndNoneDropsThePresetsNumbers) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(With("{preset: tiny}",
                        "{preset: tiny, rope_scaling: {rope_type: llama3, factor: 16, "
                        "low_freq_factor: 1, high_freq_factor: 4, "
                        "original_max_position_embeddings: 2048}}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(spec->model.rope_scaling.factor, 16.0);
  EXPECT_EQ(spec->model.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(spec->model.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(spec->model.rope_scaling.original_max_position_embeddings, 2048);
  // Overriding one number of a preset's scaling keeps the others.
  ParseOptions options;
  options.overrides = {"spec.model.preset=llama3-8b", "spec.model.rope_scaling.factor=4"};
  spec = ParseJobSpec(kBase, options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.rope_scaling.factor, 4.0);
  EXPECT_EQ(spec->model.rope_scaling.original_max_position_embeddings, 8192);
  // rope_type none on a scaled preset means no scaling, not an error about its numbers.
  options.overrides = {"spec.model.preset=llama3-8b", "spec.model.rope_scaling.rope_type=none"};
  spec = ParseJobSpec(kBase, options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.rope_scaling.factor, 0.0);
  EXPECT_EQ(spec->model.rope_scaling.original_max_position_embeddings, 0);
}

// stages[i].rope: read, emitted and applied from its stage on (a later stage without one keeps
// it); a bad value names the stage's field and the fix.
TEST(JobSpecParserTest, StageRopeAppliesFromItsStageOnAndBadValuesNameTheField) {
  const std::string text =
      With("    - {seq_len: 2048, steps: 5, sp_degree: 4}",
           "    - {seq_len: 2048, steps: 5, sp_degree: 4, rope: {rope_theta: 2000000.0, "
           "rope_scaling: {rope_type: llama3, factor: 4, low_freq_factor: 1, "
           "high_freq_factor: 4, original_max_position_embeddings: 1024}}}\n"
           "    - {seq_len: 4096, steps: 5, sp_degree: 4}");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->stages.size(), 3u);
  EXPECT_TRUE(spec->HasStageRope());
  ModelShape first = spec->model, second = spec->model, third = spec->model;
  spec->ApplyStageRope(0, &first);
  spec->ApplyStageRope(1, &second);
  spec->ApplyStageRope(2, &third);
  EXPECT_EQ(first.rope_theta, spec->model.rope_theta);
  EXPECT_EQ(first.rope_scaling.rope_type, spec->model.rope_scaling.rope_type);
  for (const ModelShape* later : {&second, &third}) {
    EXPECT_EQ(later->rope_theta, 2.0e6);
    EXPECT_EQ(later->rope_scaling.rope_type, "llama3");
    EXPECT_EQ(later->rope_scaling.factor, 4.0);
    EXPECT_EQ(later->rope_scaling.original_max_position_embeddings, 1024);
  }
  // The canonical document keeps it (the coordinator sends the emitted spec to the ranks).
  absl::StatusOr<JobSpec> again = ParseJobSpec(ToYaml(*spec));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << ToYaml(*spec);
  ASSERT_TRUE(again->stages[1].rope.has_value());
  EXPECT_EQ(again->stages[1].rope->rope_theta, 2.0e6);
  EXPECT_EQ(SpecHash(*again), SpecHash(*spec));
  // Like every stage field it is not part of SpecHash (stages are not): a job may change a
  // later stage's RoPE and still resume from an earlier stage's checkpoint.
  EXPECT_EQ(SpecHash(*spec), SpecHash(*ParseJobSpec(kBase)));
  EXPECT_EQ(ToYaml(*ParseJobSpec(kBase)).find("rope:"), std::string::npos);
  // Overrides reach it like any other stage field.
  ParseOptions options;
  options.overrides = {"spec.stages[0].rope.rope_theta=750000"};
  absl::StatusOr<JobSpec> set = ParseJobSpec(kBase, options);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_TRUE(set->stages[0].rope && set->stages[0].rope->rope_theta);
  EXPECT_EQ(*set->stages[0].rope->rope_theta, 750000.0);

  for (const auto& [rope, want] : std::vector<std::pair<std::string, std::string>>{
           {"{rope_theta: -1}", "spec.stages[1].rope.rope_theta: -1.0 must be > 0"},
           {"{rope_scaling: {rope_type: yarn, factor: 4}}",
            "spec.stages[1].rope.rope_scaling.rope_type: 'yarn' is not supported (use none, "
            "llama3 or linear)"},
           {"{rope_scaling: {factor: 4}}",
            "spec.stages[1].rope.rope_scaling.rope_type: 'none' takes no factors"},
           {"{rope_scaling: {rope_type: llama3, factor: 0.5, low_freq_factor: 1, "
            "high_freq_factor: 4, original_max_position_embeddings: 8192}}",
            "spec.stages[1].rope.rope_scaling.factor: 0.5 must be >= 1"}}) {
    SCOPED_TRACE(rope);
    absl::StatusOr<JobSpec> bad =
        ParseJobSpec(With("    - {seq_len: 2048, steps: 5, sp_degree: 4}",
                          "    - {seq_len: 2048, steps: 5, sp_degree: 4, rope: " + rope + "}"));
    ASSERT_FALSE(bad.ok());
    EXPECT_TRUE(absl::StrContains(bad.status().message(), want)) << bad.status();
  }
}

// every_steps: auto and every_seconds parse, survive ToYaml (the coordinator stores and sends
// the emitted spec) and leave the spec hash alone (an interval is not training).
TEST(JobSpecParserTest, CheckpointIntervalByTimeAndAutoRoundTrip) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(With("every_steps: 5", "every_steps: auto"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->checkpoint.every_steps_auto);
  EXPECT_EQ(spec->checkpoint.every_seconds, 0);
  absl::StatusOr<JobSpec> again = ParseJobSpec(ToYaml(*spec));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << ToYaml(*spec);
  EXPECT_TRUE(again->checkpoint.every_steps_auto);
  absl::StatusOr<JobSpec> timed = ParseJobSpec(With("every_steps: 5", "every_seconds: 1800"));
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_FALSE(timed->checkpoint.every_steps_auto);
  EXPECT_EQ(timed->checkpoint.every_seconds, 1800);
  absl::StatusOr<JobSpec> timed_again = ParseJobSpec(ToYaml(*timed));
  ASSERT_TRUE(timed_again.ok()) << timed_again.status();
  EXPECT_EQ(timed_again->checkpoint.every_seconds, 1800);
  EXPECT_EQ(SpecHash(*spec), SpecHash(*timed));
}

TEST(JobSpecParserTest, DataEvalAndBatchFieldsParseAndRoundTrip) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(With(
      {{"{synthetic: {generator: random}}",
        "{train: data/t, validation: data/v, "
        "format: indexed, packing: false}"},
       {"warmup_steps: 2}", "warmup_steps: 2, micro_batch_size: 4}"},
       {"  seed: 7\n", "  eval: {max_sequences: 16, every_steps: 5}\n  seed: 7\n"},
       {"{seq_len: 1024, steps: 10}", "{seq_len: 1024, steps: 10, eval: {max_sequences: 2}}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.format, "indexed");
  EXPECT_FALSE(spec->data.packing);
  EXPECT_EQ(spec->optimizer.micro_batch_size, 4);
  EXPECT_EQ(spec->eval.max_sequences, 16);
  EXPECT_EQ(spec->StageEval(0).max_sequences, 2);
  EXPECT_EQ(spec->StageEval(0).every_steps, 0);
  EXPECT_EQ(spec->StageEval(1).max_sequences, 16);
  EXPECT_EQ(spec->StageEval(1).every_steps, 5);
  const std::string yaml = ToYaml(*spec);
  absl::StatusOr<JobSpec> again = ParseJobSpec(yaml);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_EQ(ToYaml(*again), yaml);
  EXPECT_EQ(again->StageEval(0).max_sequences, 2);
  EXPECT_EQ(again->optimizer.micro_batch_size, 4);
  EXPECT_FALSE(again->data.packing);
  // The data layout is part of the training hash (a resume must read the same sequences).
  JobSpec packed = *spec;
  packed.data.packing = true;
  EXPECT_NE(SpecHash(packed), SpecHash(*spec));
  // The batch cut is layout: the data cursor keeps the stream exact under another one.
  packed.data.packing = false;
  packed.optimizer.micro_batch_size = 1;
  EXPECT_EQ(SpecHash(packed), SpecHash(*spec));
}

TEST(JobSpecParserTest, SchedulingBudgetsParseDefaultAndRoundTrip) {
  absl::StatusOr<JobSpec> plain = ParseJobSpec(With("{max_failures: 3}", "{max_failures: 3}"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->scheduling.max_infra_failures, 20);
  EXPECT_EQ(plain->scheduling.failure_window_s, 86400);
  EXPECT_TRUE(plain->scheduling.preemptible);
  // At their defaults they are not printed (older canonical specs stay byte-identical).
  EXPECT_EQ(ToYaml(*plain).find("max_infra_failures"), std::string::npos);
  EXPECT_EQ(ToYaml(*plain).find("preemptible"), std::string::npos);
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      With("{max_failures: 3}",
           "{max_failures: 2, max_infra_failures: 50, failure_window_s: 600, preemptible: false}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->scheduling.max_failures, 2);
  EXPECT_EQ(spec->scheduling.max_infra_failures, 50);
  EXPECT_EQ(spec->scheduling.failure_window_s, 600);
  EXPECT_FALSE(spec->scheduling.preemptible);
  const std::string yaml = ToYaml(*spec);
  absl::StatusOr<JobSpec> again = ParseJobSpec(yaml);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_EQ(ToYaml(*again), yaml);
  EXPECT_EQ(again->scheduling.max_infra_failures, 50);
  EXPECT_EQ(again->scheduling.failure_window_s, 600);
  EXPECT_FALSE(again->scheduling.preemptible);
}

TEST(JobSpecParserTest, SeqLenOnlyNeedsToDivideBySp) {
  // 100000 = 8 * 12500: valid, even though the suggestions for a bad length are
  // multiples of sp_degree * 1024.
  absl::StatusOr<JobSpec> spec = ParseJobSpec(With(
      {{"{sp_degree: 2, dp_degree: 1}", "{sp_degree: 8}"},
       {"{seq_len: 2048, steps: 5, sp_degree: 4}", "{seq_len: 100000, steps: 5, sp_degree: 8}"}}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->stages[1].seq_len, 100000);
}

TEST(JobSpecParserTest, CollectsEveryErrorOnePerLine) {
  std::string text = With("{seq_len: 1024, steps: 10}", "{seq_len: 1024, steps: 0}");
  text.replace(text.find("keep_last: 2"), 12, "keep_last: 0");
  text.replace(text.find("lr: 1.0e-3"), 10, "lr: -1.0");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
  ASSERT_FALSE(spec.ok());
  const std::vector<std::string> lines = absl::StrSplit(spec.status().message(), '\n');
  ASSERT_EQ(lines.size(), 3u) << spec.status();
  EXPECT_THAT(lines[0], HasSubstr("spec.optimizer.lr: -1.0 must be > 0"));
  EXPECT_THAT(lines[1], HasSubstr("spec.stages[0].steps: 0 must be > 0"));
  EXPECT_THAT(lines[2], HasSubstr("spec.checkpoint.keep_last: 0 must be >= 1"));
}

TEST(JobSpecParserTest, TypeErrorsAreAllReported) {
  std::string text = With("{seq_len: 1024, steps: 10}", "{seq_len: 1k, steps: ten}");
  text.replace(text.find("  optimizer:"), 12, "  optimzer:");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
  ASSERT_FALSE(spec.ok());
  const std::string message(spec.status().message());
  EXPECT_THAT(message, HasSubstr("spec.stages[0].seq_len: '1k' is not an integer"));
  EXPECT_THAT(message, HasSubstr("spec.stages[0].steps: 'ten' is not an integer"));
  EXPECT_THAT(message, HasSubstr("spec.optimzer: unknown key (did you mean 'optimizer'?)"));
}

TEST(JobSpecParserTest, OverridesApplyBeforeConversion) {
  ParseOptions options;
  options.overrides = {"spec.stages[1].steps=5000",        "spec.parallelism.sp_degree=4",
                       "spec.memory.tiled_mlp=true",       "metadata.labels.owner=alice",
                       "spec.optimizer.betas=[0.8, 0.99]", "spec.stages[0].lr=2.0e-4",
                       "spec.checkpoint.dir=/tmp/ck",      "spec.checkpoint.async=false"};
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kBase, options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->stages[1].steps, 5000);
  EXPECT_EQ(spec->parallelism.sp_degree, 4);
  EXPECT_TRUE(spec->memory.tiled_mlp);
  EXPECT_TRUE(spec->memory.tiled_loss);  // sibling kept
  EXPECT_EQ(spec->metadata.labels.at("owner"), "alice");
  EXPECT_EQ(spec->metadata.labels.at("team"), "research");
  EXPECT_DOUBLE_EQ(spec->optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(spec->optimizer.beta2, 0.99);
  EXPECT_EQ(spec->stages[0].lr, 2.0e-4);
  EXPECT_EQ(spec->checkpoint.dir, "/tmp/ck");
  EXPECT_EQ(spec->checkpoint.async, std::optional<bool>(false));
}

TEST(JobSpecParserTest, OverrideCreatesMissingSection) {
  std::string text = kBase;
  text.erase(text.find("  memory: {tiled_loss: true}\n"), 29);
  ParseOptions options;
  options.overrides = {"spec.memory.activation_checkpointing=yes"};
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->memory.activation_checkpointing);
  EXPECT_FALSE(spec->memory.tiled_loss);
}

TEST(JobSpecParserTest, BadOverridesNameThePath) {
  struct Case {
    std::string set;
    const char* expected;
  } cases[] = {
      {"spec.stages[0].stpes=1",
       "--set spec.stages[0].stpes=1: spec.stages[0].stpes is not a known field (did you mean "
       "'steps'?)"},
      {"spec.optimzer.lr=1", "spec.optimzer is not a known field (did you mean 'optimizer'?)"},
      {"spec.stages[5].steps=1", "spec.stages[5] does not exist (spec.stages has 2 entries"},
      {"spec.model[0]=1", "spec.model is not a list"},
      {"spec.seed", "--set spec.seed: missing '='"},
      {"spec..seed=1", "is not a field path"},
      {"spec.stages[x].steps=1", "is not a field path"},
      {"spec.seed=[1, 2", "the value is not valid YAML"},
      {"spec.stages[0].steps=ten", "spec.stages[0].steps: 'ten' is not an integer"},
      {"spec.stages[2].seq_len=1", "spec.stages[2] does not exist"},
      {"spec.stages[0].seq_len=1001",
       "spec.stages[0].seq_len: 1001 is not divisible by sp_degree 2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.set);
    ParseOptions options;
    options.overrides = {c.set};
    absl::StatusOr<JobSpec> spec = ParseJobSpec(kBase, options);
    ASSERT_FALSE(spec.ok());
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.expected));
  }
}

TEST(JobSpecParserTest, ToYamlRoundTrips) {
  std::vector<JobSpec> specs;
  for (const std::string& path : ShippedSpecs()) {
    absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    specs.push_back(*spec);
  }
  absl::StatusOr<JobSpec> base = ParseJobSpec(kBase);
  ASSERT_TRUE(base.ok()) << base.status();
  // Awkward strings and every optional stage field.
  JobSpec odd = *base;
  odd.metadata.labels = {{"empty", ""},   {"null", "null"},  {"tilde", "~"},         {"yes", "yes"},
                         {"num", "0123"}, {"colon", "a: b"}, {"quote", "it's \"x\""}};
  odd.stages[0].lr = 1.0 / 3.0;
  odd.stages[0].warmup_steps = 0;
  odd.stages[1].dp_degree = 2;
  odd.optimizer.eps = 1e-12;
  odd.model.rope_theta = 123456.789;
  odd.checkpoint.dir = "/tmp/with space/#hash";
  odd.checkpoint.async = false;
  odd.scheduling.node_label = "gpu=h100";
  odd.seed = 18446744073709551615ULL;
  specs.push_back(odd);
  // init_from: given fields kept, the rest left to config.json; scaled RoPE.
  for (const char* model :
       {"{init_from: /m}", "{init_from: /m, rope_theta: 500000.0}",
        "{init_from: /m, rope_scaling: {rope_type: none}}", "{preset: tiny, init_from: /m}",
        "{init_from: /m, rope_scaling: {rope_type: llama3, factor: 8}}", "{preset: llama3-1b}"}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(With("{preset: tiny}", model));
    ASSERT_TRUE(spec.ok()) << model << ": " << spec.status();
    specs.push_back(*spec);
  }
  JobSpec files = *base;
  files.data.synthetic.reset();
  files.data.train = "data/train.bin";
  files.data.validation = "data/val.bin";
  specs.push_back(files);
  for (const JobSpec& s : specs) {
    SCOPED_TRACE(s.metadata.name);
    const std::string yaml = ToYaml(s);
    absl::StatusOr<JobSpec> again = ParseJobSpec(yaml);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
    ExpectSpecEq(*again, s);
    EXPECT_EQ(ToYaml(*again), yaml);
  }
}

TEST(JobSpecParserTest, SpecHashIsStableAndCoversTrainingFieldsOnly) {
  absl::StatusOr<JobSpec> base = ParseJobSpec(kBase);
  ASSERT_TRUE(base.ok()) << base.status();
  const std::string hash = SpecHash(*base);
  ASSERT_EQ(hash.size(), 16u);
  EXPECT_EQ(hash.find_first_not_of("0123456789abcdef"), std::string::npos);
  // Pinned: the hash is stored in checkpoints and must not drift across builds.
  EXPECT_EQ(hash, "4e9a191e8dd38e6a");
  EXPECT_EQ(SpecHash(*ParseJobSpec(kBase)), hash);

  auto changed = [&](auto mutate) {
    JobSpec s = *base;
    mutate(s);
    return SpecHash(s) != hash;
  };
  EXPECT_TRUE(changed([](JobSpec& s) { s.optimizer.lr *= 2; }));
  EXPECT_TRUE(changed([](JobSpec& s) { s.seed += 1; }));
  EXPECT_TRUE(changed([](JobSpec& s) { s.model.hidden_size = 512; }));
  EXPECT_TRUE(changed([](JobSpec& s) { s.data.synthetic->generator = "needle"; }));
  EXPECT_TRUE(changed([](JobSpec& s) { s.optimizer.beta2 = 0.999; }));
  EXPECT_FALSE(changed([](JobSpec& s) { s.stages.push_back({8192, 3}); }));
  EXPECT_FALSE(changed([](JobSpec& s) { s.stages[0].steps = 99; }));
  EXPECT_FALSE(changed([](JobSpec& s) { s.checkpoint.keep_last = 9; }));
  EXPECT_FALSE(changed([](JobSpec& s) { s.scheduling.priority = 5; }));
  EXPECT_FALSE(changed([](JobSpec& s) { s.metadata.name = "other"; }));
  EXPECT_FALSE(changed([](JobSpec& s) { s.parallelism.sp_degree = 8; }));
  // Layout: how a step's global batch is cut (resumes across it, docs/DATA.md).
  EXPECT_FALSE(changed([](JobSpec& s) { s.parallelism.dp_degree = 4; }));
  EXPECT_FALSE(changed([](JobSpec& s) { s.optimizer.grad_accum_steps = 4; }));
  EXPECT_FALSE(changed([](JobSpec& s) { s.optimizer.micro_batch_size = 2; }));
}

class CheckFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ulysses_spec_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { ulysses::RemoveTree(dir_).IgnoreError(); }

  std::string WriteTokens(const std::string& name, size_t bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    out << std::string(bytes, '\x01');
    return path;
  }

  absl::StatusOr<JobSpec> Parse(const std::string& train, const std::string& validation) {
    std::string data = "{train: '" + train + "'";
    if (!validation.empty()) {
      data += ", validation: '" + validation + "'";
    }
    data += "}";
    ParseOptions options;
    options.check_files = true;
    return ParseJobSpec(With("{synthetic: {generator: random}}", data), options);
  }

  std::filesystem::path dir_;
};

TEST_F(CheckFilesTest, AcceptsLongEnoughFiles) {
  const std::string train = WriteTokens("train.bin", 1025 * 4);
  const std::string val = WriteTokens("val.bin", 2000 * 4);
  absl::StatusOr<JobSpec> spec = Parse(train, val);
  EXPECT_TRUE(spec.ok()) << spec.status();
}

TEST_F(CheckFilesTest, NamesShortTruncatedAndMissingFiles) {
  const std::string train = WriteTokens("train.bin", 100 * 4);
  const std::string val = WriteTokens("val.bin", 10);
  absl::StatusOr<JobSpec> spec = Parse(train, val);
  ASSERT_FALSE(spec.ok());
  const std::string message(spec.status().message());
  EXPECT_THAT(message, HasSubstr("spec.data.train: '" + train +
                                 "' holds 100 tokens, needs at least 1025 (stages[0].seq_len + 1"));
  EXPECT_THAT(message,
              HasSubstr("spec.data.validation: '" + val + "' has 10 bytes, not a multiple of 4"));
  spec = Parse((dir_ / "missing.bin").string(), "");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("missing.bin' cannot be read (No such file or directory"));
  // Without check_files the same spec is fine: nothing touches the disk.
  EXPECT_TRUE(ParseJobSpec(With("{synthetic: {generator: random}}", "{train: /nonexistent}")).ok());
}

TEST(LoadJobSpecFileTest, MissingFileAndDirectory) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile("/nonexistent/job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(),
            "/nonexistent/job.yaml: cannot read (No such file or directory)");
  spec = LoadJobSpecFile("/tmp");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("/tmp: is not a regular file"));
}

// kMaxStages stages of increasing seq_len at sp 1, as one flow list per line.
std::string StagesYaml(int count) {
  std::string stages = "  stages:\n";
  for (int i = 1; i <= count; ++i) {
    stages += absl::StrCat("    - {seq_len: ", 1024 * i, ", steps: 1, sp_degree: 1}\n");
  }
  return stages;
}

TEST(JobSpecParserTest, AtMostMaxStagesAndOneLineForTooMany) {
  const std::string base_stages =
      "  stages:\n    - {seq_len: 1024, steps: 10}\n    - {seq_len: 2048, steps: 5, "
      "sp_degree: 4}\n";
  absl::StatusOr<JobSpec> spec = ParseJobSpec(With(base_stages, StagesYaml(kMaxStages)));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->stages.size(), static_cast<size_t>(kMaxStages));
  // One stage more is refused with one line (not one per stage), even when every
  // stage is also wrong on its own.
  std::string too_many = StagesYaml(kMaxStages + 1);
  for (size_t pos = 0; (pos = too_many.find("steps: 1,", pos)) != std::string::npos;) {
    too_many.replace(pos, 9, "steps: 0,");
  }
  spec = ParseJobSpec(With(base_stages, too_many));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "spec.stages: 65 stages is more than 64 (split the run into jobs of at most 64 "
            "stages, each resuming from the last one's checkpoint)");
}

TEST(ValidateJobSpecTest, TooManyStagesIsOneLine) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kBase);
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->stages.resize(111005);  // Built in code, not read: the validator has the same rule.
  absl::Status status = ValidateJobSpec(*spec);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(),
            "spec.stages: 111005 stages is more than 64 (split the run into jobs of at most 64 "
            "stages, each resuming from the last one's checkpoint)");
}

TEST(JobSpecParserTest, DocumentLargerThanMaxSpecBytesIsRefusedBeforeParsing) {
  // Valid YAML padded with a comment up to one byte over the limit.
  std::string text = kBase;
  text += "#";
  text.append(static_cast<size_t>(kMaxSpecBytes) - text.size(), 'x');
  ASSERT_TRUE(ParseJobSpec(text).ok()) << "exactly kMaxSpecBytes is allowed";
  text += "x";
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "(document): 262145 bytes is more than 262144 (a TrainJob is at most 256 KiB; a real "
            "one is a few KiB: drop generated content)");
  // ulyssesctl reads files through LoadJobSpecFile: same limit, named by the file.
  ::ulysses::testing::TempDir dir;
  const std::string path = dir.path() + "/big.yaml";
  std::ofstream(path) << text;
  spec = LoadJobSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(),
            path + ": 262145 bytes is too large for a job spec (at most 256 KiB)");
}

TEST(ValidateJobSpecTest, DefaultStructNamesWhatIsMissing) {
  JobSpec spec;
  absl::Status status = ValidateJobSpec(spec);
  ASSERT_FALSE(status.ok());
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("metadata.name: '' is missing"));
  EXPECT_THAT(message, HasSubstr("spec.stages: [] is empty"));
  EXPECT_THAT(message, HasSubstr("spec.data: {} has no training data"));
}

}  // namespace
}  // namespace ulysses::spec
