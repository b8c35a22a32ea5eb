#include "worker/engine/data/dataset.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_parser.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::engine {
namespace {

using ::ulysses::testing::TempDir;

void WriteTokens(const std::string& path, const std::vector<uint32_t>& tokens) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
}

std::vector<uint32_t> Iota(uint32_t n, uint32_t mod) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = i % mod;
  return v;
}

TEST(FileTokenDatasetTest, TrainEpochIsAPermutationOfWindows) {
  TempDir dir;
  WriteTokens(dir.Sub("t.bin"), Iota(1001, 1 << 30));
  auto ds = OpenTokenFile(dir.Sub("t.bin"), Split::kTrain, 1 << 30, 7);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const int64_t s = 10;
  const int64_t count = (*ds)->NumSequences(s);
  ASSERT_EQ(count, 100);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> starts;
    for (int64_t i = 0; i < count; ++i) {
      auto sample = (*ds)->Get(epoch * count + i, s);
      ASSERT_TRUE(sample.ok());
      const int64_t start = sample->tokens[0].item<int64_t>();
      EXPECT_EQ(start % s, 0);
      EXPECT_TRUE(torch::equal(sample->tokens, torch::arange(start, start + s + 1, torch::kInt64)));
      EXPECT_FALSE(sample->target_mask.defined());
      starts.insert(start);
    }
    EXPECT_EQ(static_cast<int64_t>(starts.size()), count) << "epoch " << epoch;
  }
  // Shuffled, and differently per epoch, but deterministic.
  auto a = (*ds)->Get(0, s), b = (*ds)->Get(count, s), c = (*ds)->Get(0, s);
  int64_t in_order = 0;
  for (int64_t i = 0; i < count; ++i) {
    in_order += (*ds)->Get(i, s)->tokens[0].item<int64_t>() == i * s;
  }
  EXPECT_LT(in_order, count / 2);
  EXPECT_TRUE(torch::equal(a->tokens, c->tokens));
  std::vector<int64_t> e0, e1;
  for (int64_t i = 0; i < 10; ++i) {
    e0.push_back((*ds)->Get(i, s)->tokens[0].item<int64_t>());
    e1.push_back((*ds)->Get(count + i, s)->tokens[0].item<int64_t>());
  }
  EXPECT_NE(e0, e1);
  (void)b;
}

TEST(FileTokenDatasetTest, ValidationWindowsAndMaskedFinalTarget) {
  TempDir dir;
  WriteTokens(dir.Sub("v.bin"), Iota(40, 1000));
  auto ds = OpenTokenFile(dir.Sub("v.bin"), Split::kValidation, 1000, 7);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->NumSequences(10), 4);
  EXPECT_EQ((*ds)->NumSequences(16), 2);  // partial last window dropped
  auto first = (*ds)->Get(0, 10);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(torch::equal(first->tokens, torch::arange(0, 11, torch::kInt64)));
  EXPECT_FALSE(first->target_mask.defined());
  auto last = (*ds)->Get(3, 10);  // tokens [30, 41): token 40 does not exist
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->tokens[9].item<int64_t>(), 39);
  ASSERT_TRUE(last->target_mask.defined());
  EXPECT_EQ(last->target_mask.sum().item<int64_t>(), 9);
  EXPECT_FALSE(last->target_mask[9].item<bool>());
  auto past = (*ds)->Get(4, 10);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
}

TEST(FileTokenDatasetTest, Errors) {
  TempDir dir;
  auto missing = OpenTokenFile(dir.Sub("nope.bin"), Split::kTrain, 100, 1);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.bin"), std::string::npos);

  { std::ofstream(dir.Sub("odd.bin"), std::ios::binary) << "abcdefg"; }
  auto odd = OpenTokenFile(dir.Sub("odd.bin"), Split::kTrain, 100, 1);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("7 bytes, not a multiple of 4"), std::string::npos)
      << odd.status();

  std::vector<uint32_t> tokens = Iota(64, 50);
  tokens[37] = 5000;
  WriteTokens(dir.Sub("big.bin"), tokens);
  auto big = OpenTokenFile(dir.Sub("big.bin"), Split::kValidation, 100, 1);
  ASSERT_TRUE(big.ok());
  EXPECT_TRUE((*big)->Get(0, 32).ok());
  auto bad = (*big)->Get(1, 32);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("token 5000 at byte offset 148 is >= vocab_size 100"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("big.bin"), std::string::npos);

  WriteTokens(dir.Sub("short.bin"), Iota(8, 50));
  auto shrt = OpenTokenFile(dir.Sub("short.bin"), Split::kTrain, 100, 1);
  ASSERT_TRUE(shrt.ok());
  auto too_short = (*shrt)->Get(0, 8);
  ASSERT_FALSE(too_short.ok());
  EXPECT_NE(too_short.status().message().find("has 8 tokens, too short"), std::string::npos)
      << too_short.status();
  EXPECT_NE(too_short.status().message().find("needs 9"), std::string::npos);
}

TEST(SyntheticTest, RandomIsDeterministicAndInVocab) {
  auto a = OpenSynthetic("random", Split::kTrain, 97, 5, 4);
  auto b = OpenSynthetic("random", Split::kTrain, 97, 5, 4);
  auto v = OpenSynthetic("random", Split::kValidation, 97, 5, 4);
  ASSERT_TRUE(a.ok() && b.ok() && v.ok());
  EXPECT_EQ((*a)->NumSequences(64), -1);
  EXPECT_EQ((*v)->NumSequences(64), 4);
  auto x = (*a)->Get(3, 64), y = (*b)->Get(3, 64), z = (*a)->Get(4, 64), w = (*v)->Get(3, 64);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok() && w.ok());
  EXPECT_TRUE(torch::equal(x->tokens, y->tokens));
  EXPECT_FALSE(torch::equal(x->tokens, z->tokens));
  EXPECT_FALSE(torch::equal(x->tokens, w->tokens));  // splits are independent streams
  EXPECT_GE(x->tokens.min().item<int64_t>(), 0);
  EXPECT_LT(x->tokens.max().item<int64_t>(), 97);
  EXPECT_FALSE(x->target_mask.defined());
  EXPECT_EQ((*v)->Get(4, 64).status().code(), absl::StatusCode::kOutOfRange);
  auto unknown = OpenSynthetic("zipf", Split::kTrain, 97, 5, 4);
  EXPECT_NE(unknown.status().message().find("unknown value \"zipf\""), std::string::npos);
}

TEST(SyntheticTest, NeedleLayoutSplitsTheVocabulary) {
  const NeedleLayout l = NeedleLayout::For(256);
  EXPECT_EQ(l.num_keys, 8);
  EXPECT_EQ(l.values_per_key, 14);  // (248 / 2 - 8) / 8
  EXPECT_EQ(l.key_begin, 8);
  EXPECT_EQ(l.value_begin, 16);
  EXPECT_EQ(l.filler_begin, 16 + 8 * 14);
  const NeedleLayout small = NeedleLayout::For(NeedleVocab::kMinVocab);
  EXPECT_EQ(small.num_keys, 7);  // 56 free ids
  EXPECT_EQ(small.values_per_key, 3);
  EXPECT_LT(small.filler_begin, NeedleVocab::kMinVocab);
  EXPECT_EQ(l.NeedlesFor(16), 1);
  EXPECT_EQ(l.NeedlesFor(64), 4);
  EXPECT_EQ(l.NeedlesFor(4096), 8);
}

TEST(SyntheticTest, NeedleStructure) {
  const int64_t vocab = 256, s = 1024;
  auto ds = OpenSynthetic("needle", Split::kTrain, vocab, 11, 8);
  ASSERT_TRUE(ds.ok());
  const NeedleLayout l = NeedleLayout::For(vocab);
  std::set<int64_t> depths_seen;
  for (int64_t index = 0; index < 20; ++index) {
    auto sample = (*ds)->Get(index, s);
    ASSERT_TRUE(sample.ok());
    auto again = (*ds)->Get(index, s);
    EXPECT_TRUE(torch::equal(sample->tokens, again->tokens));
    EXPECT_TRUE(torch::equal(sample->target_mask, again->target_mask));
    const auto tok = sample->tokens;
    ASSERT_EQ(tok.size(0), s + 1);
    ASSERT_EQ(sample->target_mask.size(0), s);
    EXPECT_EQ(tok[0].item<int64_t>(), NeedleVocab::kBos);
    std::map<int64_t, int64_t> planted;  // key -> value
    std::set<int64_t> queried;
    std::vector<int64_t> query_order;
    for (int64_t i = 1; i <= s; ++i) {
      const int64_t t = tok[i].item<int64_t>();
      if (t == NeedleVocab::kKey) {
        const int64_t k = tok[i + 1].item<int64_t>(), v = tok[i + 2].item<int64_t>();
        ASSERT_GE(k, l.key_begin);
        ASSERT_LT(k, l.value_begin);
        EXPECT_TRUE(planted.emplace(k, v).second) << "key planted twice";
        EXPECT_GE(v, l.ValueBegin(k - l.key_begin)) << "value outside its key's range";
        EXPECT_LT(v, l.ValueBegin(k - l.key_begin + 1));
        EXPECT_TRUE(queried.empty()) << "needle after the first query";
        depths_seen.insert(i * 8 / s);
        i += 2;
      } else if (t == NeedleVocab::kQuery) {
        const int64_t k = tok[i + 1].item<int64_t>();
        ASSERT_TRUE(planted.count(k)) << "query for a key that was not planted";
        EXPECT_TRUE(queried.insert(k).second) << "key queried twice";
        query_order.push_back(k);
        EXPECT_EQ(tok[i + 2].item<int64_t>(), planted[k]);
        EXPECT_TRUE(sample->target_mask[i + 1].item<bool>());
        EXPECT_FALSE(sample->target_mask[i].item<bool>());
        i += 2;
      } else {
        EXPECT_GE(t, l.filler_begin) << "position " << i;
        EXPECT_LT(t, vocab);
        if (!queried.empty()) ADD_FAILURE() << "filler after the first query at " << i;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(planted.size()), l.num_keys);
    EXPECT_EQ(queried.size(), planted.size());
    EXPECT_EQ(sample->target_mask.sum().item<int64_t>(), l.num_keys);
    EXPECT_TRUE(sample->target_mask[s - 1].item<bool>());  // the last answer ends the sequence
    // Accuracy helper: perfect predictions score 1, shifted-by-one score < 1.
    EXPECT_DOUBLE_EQ(ScoredAccuracy(*sample, tok.slice(0, 1)), 1.0);
    EXPECT_LT(ScoredAccuracy(*sample, tok.slice(0, 0, s)), 1.0);
  }
  // Over 20 sequences the needles land in every eighth of the context.
  EXPECT_EQ(depths_seen.size(), 8u);
  // Different indices differ; too-small settings are rejected.
  EXPECT_FALSE(torch::equal((*ds)->Get(0, s)->tokens, (*ds)->Get(1, s)->tokens));
  EXPECT_FALSE((*ds)->Get(0, 8).ok());
  EXPECT_FALSE(OpenSynthetic("needle", Split::kTrain, 32, 1, 1).ok());
  auto small = (*ds)->Get(5, 16);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->target_mask.sum().item<int64_t>(), 1);
  // The smallest vocabulary still plants one needle per key.
  auto tiny_vocab = OpenSynthetic("needle", Split::kValidation, NeedleVocab::kMinVocab, 1, 1);
  ASSERT_TRUE(tiny_vocab.ok());
  auto capped = (*tiny_vocab)->Get(0, 2048);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->tokens.eq(NeedleVocab::kKey).sum().item<int64_t>(), 7);
  EXPECT_LT(capped->tokens.max().item<int64_t>(), NeedleVocab::kMinVocab);
}

TEST(SyntheticTest, NeedleValuesAreUniformOverTheKeysRange) {
  // Chance accuracy is 1/M only if every value of a key's range is equally likely.
  const int64_t vocab = 256;
  auto ds = OpenSynthetic("needle", Split::kTrain, vocab, 3, 0);
  ASSERT_TRUE(ds.ok());
  const NeedleLayout l = NeedleLayout::For(vocab);
  std::vector<int64_t> counts(l.values_per_key, 0);
  const int64_t n = 1400;
  for (int64_t index = 0; index < n; ++index) {
    auto sample = (*ds)->Get(index, 64);
    ASSERT_TRUE(sample.ok());
    const auto tok = sample->tokens;
    for (int64_t i = 1; i < 64; ++i) {
      if (tok[i].item<int64_t>() == NeedleVocab::kKey &&
          tok[i + 1].item<int64_t>() == l.key_begin) {
        ++counts[tok[i + 2].item<int64_t>() - l.ValueBegin(0)];
      }
    }
  }
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  ASSERT_GT(total, 400);  // key 0 is planted in about half of the 4-needle sequences
  for (int64_t c : counts) {
    EXPECT_GT(c, total / l.values_per_key / 2);
    EXPECT_LT(c, total / l.values_per_key * 2);
  }
}

// The validator and the generator hold the same needle limits (one definition,
// spec::SyntheticDataSpec): a spec the validator accepts at the limits opens and samples, one
// token or id below them both refuse.
TEST(SyntheticTest, NeedleLimitsAreTheValidators) {
  auto spec_at = [](int64_t vocab, int64_t seq_len) {
    return spec::ParseJobSpec(absl::StrCat(R"(apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: needle-limits}
spec:
  model: {preset: tiny, vocab_size: )",
                                           vocab, R"(}
  data: {synthetic: {generator: needle, validation_sequences: 1}}
  stages:
    - {seq_len: )",
                                           seq_len, R"(, steps: 1}
)"));
  };
  const int64_t vocab = NeedleVocab::kMinVocab, seq = NeedleVocab::kMinSeqLen;
  auto ok = spec_at(vocab, seq);
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto ds = OpenDataset(*ok, Split::kTrain, ok->model.vocab_size);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_TRUE((*ds)->Get(0, seq).ok());
  EXPECT_FALSE(spec_at(vocab, seq - 1).ok());
  EXPECT_FALSE((*ds)->Get(0, seq - 1).ok());
  EXPECT_FALSE(spec_at(vocab - 1, seq).ok());
  EXPECT_FALSE(OpenSynthetic("needle", Split::kTrain, vocab - 1, 1, 1).ok());
}

TEST(OpenDatasetTest, UsesSpec) {
  spec::JobSpec job;
  job.data.synthetic = spec::SyntheticDataSpec{"needle", 3};
  auto val = OpenDataset(job, Split::kValidation, 128);
  ASSERT_TRUE(val.ok());
  EXPECT_EQ((*val)->NumSequences(256), 3);
  spec::JobSpec files;
  auto none = OpenDataset(files, Split::kValidation, 128);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("spec.data.validation"), std::string::npos);
}

}  // namespace
}  // namespace ulysses::engine
