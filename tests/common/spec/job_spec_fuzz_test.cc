// Randomized-corpus robustness test: mutates the shipped specs (byte flips,
// deletions, duplications, line and key swaps) with a fixed seed and checks that
// ParseJobSpec never crashes and answers OK or InvalidArgument with a message of
// non-empty `path: ...` lines. A fixed number of inputs (no wall-clock budget).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/spec/job_spec_parser.h"
#include "gtest/gtest.h"
#include "tests/common/spec/spec_test_util.h"

namespace ulysses::spec {
namespace {

std::string Mutate(const std::string& input, std::mt19937_64& rng) {
  std::string s = input;
  const int edits = 1 + static_cast<int>(rng() % 4);
  static const char* kTokens[] = {
      ":",  "- ", "[",         "]",      "{",         "}",       "&a ",     "*a",    "\n",
      "  ", "'",  "\"",        "#",      "!!int ",    "? ",      "-1",      "1e999", "0x10",
      "~",  "\t", "optimizer", "stages", "sp_degree", "seq_len", "\xff\xfe"};
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t pos = rng() % s.size();
    switch (rng() % 6) {
      case 0:  // flip a byte
        s[pos] = static_cast<char>(s[pos] ^ (1u << (rng() % 8)));
        break;
      case 1:  // delete a run
        s.erase(pos, 1 + rng() % 16);
        break;
      case 2: {  // duplicate a run
        const std::string run = s.substr(pos, 1 + rng() % 64);
        s.insert(rng() % s.size(), run);
        break;
      }
      case 3:  // insert a YAML-significant token
        s.insert(pos, kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))]);
        break;
      case 4: {  // swap two lines
        std::vector<std::string> lines = absl::StrSplit(s, '\n');
        if (lines.size() > 2) {
          std::swap(lines[rng() % lines.size()], lines[rng() % lines.size()]);
        }
        s = absl::StrJoin(lines, "\n");
        break;
      }
      default: {  // swap the key of one line with another line's key
        std::vector<std::string> lines = absl::StrSplit(s, '\n');
        const size_t a = rng() % lines.size(), b = rng() % lines.size();
        const size_t ca = lines[a].find(':'), cb = lines[b].find(':');
        if (ca != std::string::npos && cb != std::string::npos) {
          const std::string ka = lines[a].substr(0, ca), kb = lines[b].substr(0, cb);
          lines[a] = kb + lines[a].substr(ca);
          lines[b] = ka + lines[b].substr(cb);
        }
        s = absl::StrJoin(lines, "\n");
        break;
      }
    }
  }
  return s;
}

void CheckAnswer(const std::string& input, const absl::StatusOr<JobSpec>& spec) {
  if (spec.ok()) {
    return;
  }
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << input;
  const std::string message(spec.status().message());
  ASSERT_FALSE(message.empty()) << input;
  for (absl::string_view line : absl::StrSplit(message, '\n')) {
    ASSERT_FALSE(line.empty()) << "empty line in: " << message;
    ASSERT_NE(line.find(": "), absl::string_view::npos) << line;
  }
}

TEST(JobSpecFuzzTest, MutatedShippedSpecsNeverCrash) {
  std::vector<std::string> corpus;
  for (const std::string& path : testing::ShippedSpecs()) {
    corpus.push_back(testing::ReadFile(path));
    ASSERT_FALSE(corpus.back().empty()) << path;
  }
  // ULYSSES_FUZZ_TRACE=FILE writes each input to FILE before parsing it.
  const char* trace = std::getenv("ULYSSES_FUZZ_TRACE");
  std::mt19937_64 rng(20261121);
  // A fixed number of inputs from a fixed seed: every run checks the same inputs,
  // however fast the machine is.
  constexpr int kRuns = 10000;
  int accepted = 0;
  for (int run = 0; run < kRuns; ++run) {
    std::string input = corpus[rng() % corpus.size()];
    // Mutations stack: half the time, mutate a mutant.
    do {
      input = Mutate(input, rng);
    } while (rng() % 2 == 0);
    if (trace != nullptr) {  // Keep the input being parsed, to reproduce a hang or crash.
      std::ofstream(trace, std::ios::binary | std::ios::trunc) << input;
    }
    absl::StatusOr<JobSpec> spec = ParseJobSpec(input);
    CheckAnswer(input, spec);
    if (HasFatalFailure()) {
      return;
    }
    if (spec.ok()) {
      ++accepted;
      // An accepted spec must survive its own canonical form.
      absl::StatusOr<JobSpec> again = ParseJobSpec(ToYaml(*spec));
      ASSERT_TRUE(again.ok()) << again.status() << "\n" << input;
      EXPECT_EQ(ToYaml(*again), ToYaml(*spec));
    }
  }
  EXPECT_GT(accepted, 0) << "the mutations should leave some specs valid";
  std::printf("fuzz: %d inputs, %d accepted\n", kRuns, accepted);
}

TEST(JobSpecFuzzTest, HostileDocumentsNeverCrash) {
  const std::string deep(5000, '[');
  const std::vector<std::string> inputs = {
      "",
      std::string("\0\0\0", 3),  // NUL bytes (a plain "\0..." literal would be "").
      "~",
      "[]",
      "{}",
      "- - - -",
      deep,
      "a: &a [*a]\n",
      "spec: &s {model: *s}\n",
      "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata: {name: x}\nspec: &s\n  stages: *s\n",
      "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata: &m {name: x, labels: *m}\nspec: {}\n",
      "? [a, b]\n: c\n",
      "apiVersion: !!binary aGVsbG8=\n",
      "%YAML 1.2\n---\nfoo: bar\n",
      "spec: {stages: [{seq_len: 99999999999999999999999}]}\n",
      "\xef\xbb\xbf"
      "apiVersion: ulysses/v1\n",
      "\"a\\nb\": 1\n",
      "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata: {name: x}\nspec: {\"mo\\ndel\": 1}\n",
  };
  std::vector<std::string> all = inputs;
  // Regression inputs found by spec_fuzzer (e.g. yaml-cpp messages quoting a raw newline).
  const std::string testdata = testing::SourceDir() + "/tests/common/spec/testdata";
  int regressions = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testdata)) {
    all.push_back(testing::ReadFile(entry.path().string()));
    ++regressions;
  }
  EXPECT_GE(regressions, 2);
  for (const std::string& input : all) {
    SCOPED_TRACE(input.substr(0, 60));
    absl::StatusOr<JobSpec> spec = ParseJobSpec(input);
    EXPECT_FALSE(spec.ok());
    CheckAnswer(input, spec);
    ParseOptions options;
    options.overrides = {"spec.stages[0].steps=1", "metadata.name=x"};
    CheckAnswer(input, ParseJobSpec(input, options));
  }
}

}  // namespace
}  // namespace ulysses::spec
