#include "worker/engine/data/sharding.h"

#include <set>

#include <gtest/gtest.h>

namespace ulysses::engine {
namespace {

std::vector<Sample> MakeSamples(int64_t b, int64_t s) {
  std::vector<Sample> samples;
  for (int64_t i = 0; i < b; ++i) {
    Sample sample;
    sample.tokens = torch::arange(1000 * i, 1000 * i + s + 1, torch::kInt64);
    sample.target_mask = torch::ones({s}, torch::kBool);
    sample.target_mask[s / 3] = false;  // one masked position in the middle
    samples.push_back(sample);
  }
  return samples;
}

// The deliberately wrong scheme: slice tokens first, then shift inside the shard
// (the boundary label becomes -100).
torch::Tensor PerShardShiftLabels(const std::vector<Sample>& samples, int64_t p) {
  const int64_t s = samples[0].tokens.size(0) - 1;
  std::vector<torch::Tensor> rows;
  for (const auto& sample : samples) {
    std::vector<torch::Tensor> parts;
    for (int64_t r = 0; r < p; ++r) {
      torch::Tensor ids = sample.tokens.slice(0, r * s / p, (r + 1) * s / p);
      torch::Tensor lab = torch::full_like(ids, kIgnoreIndex);
      lab.slice(0, 0, ids.size(0) - 1).copy_(ids.slice(0, 1));
      parts.push_back(lab);
    }
    torch::Tensor row = torch::cat(parts);
    row.masked_fill_(sample.target_mask.logical_not(), kIgnoreIndex);
    rows.push_back(row);
  }
  return torch::stack(rows);
}

TEST(ShardSamplesTest, ConcatenatedShardsReproduceFullSequence) {
  const int64_t b = 3, s = 64;
  const auto samples = MakeSamples(b, s);
  // Reference on the full sequence.
  std::vector<torch::Tensor> ref_in, ref_lab;
  for (const auto& sample : samples) {
    ref_in.push_back(sample.tokens.slice(0, 0, s));
    torch::Tensor lab = sample.tokens.slice(0, 1).clone();
    lab.masked_fill_(sample.target_mask.logical_not(), kIgnoreIndex);
    ref_lab.push_back(lab);
  }
  const torch::Tensor full_in = torch::stack(ref_in), full_lab = torch::stack(ref_lab);
  for (int64_t p : {1, 2, 4, 8}) {
    std::vector<torch::Tensor> ins, labs, pos;
    for (int64_t r = 0; r < p; ++r) {
      auto shard = ShardSamples(samples, r, p);
      ASSERT_TRUE(shard.ok()) << shard.status();
      EXPECT_EQ(shard->input_ids.sizes(), (std::vector<int64_t>{b, s / p}));
      EXPECT_EQ(shard->labels.sizes(), (std::vector<int64_t>{b, s / p}));
      EXPECT_EQ(shard->position_ids.sizes(), (std::vector<int64_t>{b, s / p}));
      EXPECT_EQ(shard->position_ids[0][0].item<int64_t>(), r * s / p);
      EXPECT_FALSE(shard->doc_ids.defined());  // one document per row: no layout to carry
      ins.push_back(shard->input_ids);
      labs.push_back(shard->labels);
      pos.push_back(shard->position_ids);
      if (r + 1 < p) {
        // The boundary label is the first input of the next shard.
        EXPECT_EQ(shard->labels[0][s / p - 1].item<int64_t>(),
                  samples[0].tokens[(r + 1) * s / p].item<int64_t>());
      }
    }
    EXPECT_TRUE(torch::equal(torch::cat(ins, 1), full_in)) << "p=" << p;
    EXPECT_TRUE(torch::equal(torch::cat(labs, 1), full_lab)) << "p=" << p;
    EXPECT_TRUE(torch::equal(torch::cat(pos, 1),
                             torch::arange(s, torch::kInt64).unsqueeze(0).expand({b, s})))
        << "p=" << p;
    // Exactly one masked label per row, none lost at shard boundaries.
    EXPECT_EQ(torch::cat(labs, 1).eq(kIgnoreIndex).sum().item<int64_t>(), b);
    if (p > 1) {
      // A per-shard shift differs: the test above would catch that bug.
      EXPECT_FALSE(torch::equal(PerShardShiftLabels(samples, p), full_lab)) << "p=" << p;
      EXPECT_EQ(PerShardShiftLabels(samples, p).eq(kIgnoreIndex).sum().item<int64_t>(),
                b * (p + 1));
    } else {
      // p=1: only the (absent) last-position label differs; ours keeps it.
      EXPECT_FALSE(torch::equal(PerShardShiftLabels(samples, p), full_lab));
    }
  }
}

TEST(ShardSamplesTest, UndefinedMaskScoresEverything) {
  Sample sample;
  sample.tokens = torch::arange(9, torch::kInt64);
  auto shard = ShardSamples({sample}, 1, 2);
  ASSERT_TRUE(shard.ok());
  EXPECT_TRUE(torch::equal(shard->labels[0], torch::arange(5, 9, torch::kInt64)));
  EXPECT_TRUE(torch::equal(shard->input_ids[0], torch::arange(4, 8, torch::kInt64)));
}

TEST(ShardSamplesTest, RejectsIndivisibleAndMismatched) {
  auto samples = MakeSamples(1, 30);
  auto bad = ShardSamples(samples, 0, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("30 is not divisible by sp_degree 4"), std::string::npos)
      << bad.status();
  auto mixed = MakeSamples(1, 32);
  mixed.push_back(MakeSamples(1, 16)[0]);
  EXPECT_FALSE(ShardSamples(mixed, 0, 2).ok());
  EXPECT_FALSE(ShardSamples(MakeSamples(1, 32), 2, 2).ok());
}

TEST(TrainSequenceIndexTest, ContiguousNoDuplicates) {
  for (int64_t dp : {1, 2, 4}) {
    for (int64_t accum : {1, 3}) {
      const int64_t steps = 5;
      std::set<int64_t> seen;
      for (int64_t step = 0; step < steps; ++step) {
        for (int64_t micro = 0; micro < accum; ++micro) {
          for (int64_t r = 0; r < dp; ++r) {
            EXPECT_TRUE(seen.insert(TrainSequenceIndex(step, micro, r, dp, accum)).second);
          }
        }
      }
      ASSERT_EQ(static_cast<int64_t>(seen.size()), steps * accum * dp);
      EXPECT_EQ(*seen.begin(), 0);
      EXPECT_EQ(*seen.rbegin(), steps * accum * dp - 1);
      // A step continues where the previous one ended (resume safety).
      EXPECT_EQ(TrainSequenceIndex(steps, 0, 0, dp, accum), steps * accum * dp);
    }
  }
}

}  // namespace
}  // namespace ulysses::engine
