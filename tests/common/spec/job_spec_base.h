// The small valid TrainJob the parser tests edit (job_spec_parser_test.cc,
// job_spec_bad_cases_test.cc): each case replaces one piece of it.
#ifndef ULYSSES_TESTS_COMMON_SPEC_JOB_SPEC_BASE_H_
#define ULYSSES_TESTS_COMMON_SPEC_JOB_SPEC_BASE_H_

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ulysses::spec::testing {

// A small valid spec; bad cases replace one piece of it.
inline constexpr char kBase[] = R"(apiVersion: ulysses/v1
kind: TrainJob
metadata:
  name: unit-test
  labels: {team: research}
spec:
  model: {preset: tiny}
  data: {synthetic: {generator: random}}
  parallelism: {sp_degree: 2, dp_degree: 1}
  memory: {tiled_loss: true}
  optimizer: {lr: 1.0e-3, betas: [0.9, 0.95], warmup_steps: 2}
  stages:
    - {seq_len: 1024, steps: 10}
    - {seq_len: 2048, steps: 5, sp_degree: 4}
  checkpoint: {every_steps: 5, keep_last: 2}
  scheduling: {max_failures: 3}
  seed: 7
)";

// kBase with the first occurrence of each `from` replaced by its `to` (fails if absent).
inline std::string With(std::vector<std::pair<std::string, std::string>> edits) {
  std::string text = kBase;
  for (const auto& [from, to] : edits) {
    const size_t pos = text.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    if (pos != std::string::npos) {
      text.replace(pos, from.size(), to);
    }
  }
  return text;
}
inline std::string With(const std::string& from, const std::string& to) {
  return With({{from, to}});
}

}  // namespace ulysses::spec::testing

#endif  // ULYSSES_TESTS_COMMON_SPEC_JOB_SPEC_BASE_H_
