// Helpers shared by the spec tests: paths of the shipped examples and a
// field-by-field JobSpec comparison.
#ifndef ULYSSES_TESTS_COMMON_SPEC_SPEC_TEST_UTIL_H_
#define ULYSSES_TESTS_COMMON_SPEC_SPEC_TEST_UTIL_H_

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"

namespace ulysses::spec::testing {

inline std::string SourceDir() {
  const char* dir = std::getenv("ULYSSES_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

// configs/jobs/<file>.
inline std::string ShippedSpec(const std::string& file) {
  return SourceDir() + "/configs/jobs/" + file;
}

// Every *.yaml under configs/jobs, sorted: read from the directory, so a new
// example is checked without anyone listing it here.
inline std::vector<std::string> ShippedSpecs() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(SourceDir() + "/configs/jobs")) {
    if (entry.is_regular_file() && entry.path().extension() == ".yaml") {
      paths.push_back(SourceDir() + "/configs/jobs/" + entry.path().filename().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

using ::ulysses::testing::ReadFile;

// Every field of `a` equals the one of `b` (reports each difference).
inline void ExpectSpecEq(const JobSpec& a, const JobSpec& b) {
  EXPECT_EQ(a.api_version, b.api_version);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.metadata.name, b.metadata.name);
  EXPECT_EQ(a.metadata.labels, b.metadata.labels);
  const ModelSpec &m = a.model, &n = b.model;
  EXPECT_EQ(m.preset, n.preset);
  for (const std::string& key : ShapeFieldKeys()) {
    EXPECT_TRUE(ShapeFieldEquals(m, n, key))
        << key << ": " << ShapeFieldText(m, key) << " != " << ShapeFieldText(n, key);
  }
  EXPECT_EQ(m.from_init, n.from_init);
  EXPECT_EQ(m.init_from, n.init_from);
  EXPECT_EQ(m.dtype, n.dtype);
  EXPECT_EQ(a.data.train, b.data.train);
  EXPECT_EQ(a.data.validation, b.data.validation);
  ASSERT_EQ(a.data.synthetic.has_value(), b.data.synthetic.has_value());
  if (a.data.synthetic) {
    EXPECT_EQ(a.data.synthetic->generator, b.data.synthetic->generator);
    EXPECT_EQ(a.data.synthetic->validation_sequences, b.data.synthetic->validation_sequences);
  }
  EXPECT_EQ(a.parallelism.sp_degree, b.parallelism.sp_degree);
  EXPECT_EQ(a.parallelism.dp_degree, b.parallelism.dp_degree);
  EXPECT_EQ(a.parallelism.zero_stage, b.parallelism.zero_stage);
  EXPECT_EQ(a.parallelism.offload_optimizer, b.parallelism.offload_optimizer);
  EXPECT_EQ(a.parallelism.offload_activations, b.parallelism.offload_activations);
  EXPECT_EQ(a.memory.activation_checkpointing, b.memory.activation_checkpointing);
  EXPECT_EQ(a.memory.tiled_mlp, b.memory.tiled_mlp);
  EXPECT_EQ(a.memory.tiled_loss, b.memory.tiled_loss);
  EXPECT_EQ(a.memory.loss_tile_tokens, b.memory.loss_tile_tokens);
  EXPECT_EQ(a.memory.attention_block_size, b.memory.attention_block_size);
  const OptimizerSpec &o = a.optimizer, &p = b.optimizer;
  EXPECT_EQ(o.type, p.type);
  EXPECT_EQ(o.lr, p.lr);
  EXPECT_EQ(o.beta1, p.beta1);
  EXPECT_EQ(o.beta2, p.beta2);
  EXPECT_EQ(o.weight_decay, p.weight_decay);
  EXPECT_EQ(o.eps, p.eps);
  EXPECT_EQ(o.grad_clip, p.grad_clip);
  EXPECT_EQ(o.warmup_steps, p.warmup_steps);
  EXPECT_EQ(o.schedule, p.schedule);
  EXPECT_EQ(o.min_lr_ratio, p.min_lr_ratio);
  EXPECT_EQ(o.grad_accum_steps, p.grad_accum_steps);
  ASSERT_EQ(a.stages.size(), b.stages.size());
  for (size_t i = 0; i < a.stages.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a.stages[i].seq_len, b.stages[i].seq_len);
    EXPECT_EQ(a.stages[i].steps, b.stages[i].steps);
    EXPECT_EQ(a.stages[i].lr, b.stages[i].lr);
    EXPECT_EQ(a.stages[i].warmup_steps, b.stages[i].warmup_steps);
    EXPECT_EQ(a.stages[i].sp_degree, b.stages[i].sp_degree);
    EXPECT_EQ(a.stages[i].dp_degree, b.stages[i].dp_degree);
  }
  EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
  EXPECT_EQ(a.checkpoint.every_steps, b.checkpoint.every_steps);
  EXPECT_EQ(a.checkpoint.keep_last, b.checkpoint.keep_last);
  EXPECT_EQ(a.checkpoint.async, b.checkpoint.async);
  EXPECT_EQ(a.scheduling.priority, b.scheduling.priority);
  EXPECT_EQ(a.scheduling.max_failures, b.scheduling.max_failures);
  EXPECT_EQ(a.scheduling.max_preemptions, b.scheduling.max_preemptions);
  EXPECT_EQ(a.scheduling.node_label, b.scheduling.node_label);
  EXPECT_EQ(a.seed, b.seed);
}

}  // namespace ulysses::spec::testing

#endif  // ULYSSES_TESTS_COMMON_SPEC_SPEC_TEST_UTIL_H_
