// The indexed dataset (format, pack from JSONL and flat files, validation on open) and packing
// with document boundaries, micro-batches and the data cursor.
#include "worker/engine/data/indexed.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/files.h"
#include "tests/testing/temp_dir.h"
#include "worker/engine/data/batches.h"
#include "worker/engine/data/packing.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;
using ::ulysses::testing::ReadFile;
using ::ulysses::testing::TempDir;

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Docs "ids" lines; doc d has lengths[d] tokens with ids 10*d + i (mod 1000) and, when masked,
// mask 0 on its first half.
std::string Jsonl(const std::vector<int>& lengths, bool masked) {
  std::string out;
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::string ids, mask;
    for (int i = 0; i < lengths[d]; ++i) {
      ids += (i ? "," : "") + std::to_string((10 * d + i) % 1000);
      mask += (i ? "," : "") + std::string(i < lengths[d] / 2 ? "0" : "1");
    }
    out += "{\"ids\": [" + ids + "]" + (masked ? ", \"mask\": [" + mask + "]" : "") + "}\n";
  }
  return out;
}

absl::Status PackError(const std::string& jsonl_text, int64_t vocab = 0) {
  TempDir dir;
  WriteText(dir.Sub("in.jsonl"), jsonl_text);
  auto st = PackJsonl(dir.Sub("in.jsonl"), dir.Sub("ds"), vocab);
  // A failed pack leaves nothing behind under the prefix (no final files, no temporaries).
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string(), "in.jsonl") << "left behind: " << e.path().string();
  }
  return st.status();
}

TEST(IndexedDatasetTest, PackJsonlRoundTripsIdsAndMasks) {
  TempDir dir;
  WriteText(dir.Sub("in.jsonl"), Jsonl({3, 5, 1}, /*masked=*/true) + "\n");  // blank line ok
  auto stats = PackJsonl(dir.Sub("in.jsonl"), dir.Sub("ds"), 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 3);
  EXPECT_EQ(stats->tokens, 9);
  auto t = OpenIndexed(dir.Sub("ds"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ((*t)->num_docs(), 3);
  EXPECT_TRUE((*t)->has_mask());
  EXPECT_EQ((*t)->DocLength(1), 5);
  EXPECT_EQ((*t)->DocBegin(2), 8);
  int64_t ids[5];
  bool mask[5];
  ASSERT_TRUE((*t)->Read(1, 0, 5, 0, ids, mask).ok());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(ids[i], 10 + i);
    EXPECT_EQ(mask[i], i >= 2) << i;
  }
}

TEST(IndexedDatasetTest, UnmaskedJsonlWritesNoMaskStream) {
  TempDir dir;
  WriteText(dir.Sub("in.jsonl"), Jsonl({4, 4}, /*masked=*/false));
  ASSERT_TRUE(PackJsonl(dir.Sub("in.jsonl"), dir.Sub("ds"), 0).ok());
  EXPECT_FALSE(fs::exists(MaskPath(dir.Sub("ds"))));
  auto t = OpenIndexed(dir.Sub("ds"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE((*t)->has_mask());
}

TEST(IndexedDatasetTest, PackFlatByEosAndByLength) {
  TempDir dir;
  const std::vector<uint32_t> flat = {5, 6, 0, 7, 0, 8, 9, 10};
  std::ofstream(dir.Sub("flat.bin"), std::ios::binary)
      .write(reinterpret_cast<const char*>(flat.data()), flat.size() * 4);
  auto eos = PackFlat(dir.Sub("flat.bin"), dir.Sub("eos"), 0, /*eos=*/0, 0);
  ASSERT_TRUE(eos.ok()) << eos.status();
  auto t = OpenIndexed(dir.Sub("eos"));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ((*t)->num_docs(), 3);  // [5 6 0] [7 0] [8 9 10]
  EXPECT_EQ((*t)->DocLength(0), 3);
  EXPECT_EQ((*t)->DocLength(1), 2);
  EXPECT_EQ((*t)->DocLength(2), 3);
  auto len = PackFlat(dir.Sub("flat.bin"), dir.Sub("len"), /*doc_len=*/3, -1, 0);
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(len->documents, 3);  // 3 + 3 + 2
  auto both = PackFlat(dir.Sub("flat.bin"), dir.Sub("both"), 3, 0, 0);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  auto vocab = PackFlat(dir.Sub("flat.bin"), dir.Sub("vocab"), 3, -1, /*vocab=*/10);
  ASSERT_FALSE(vocab.ok());
  EXPECT_NE(vocab.status().message().find("token 7 (document 2): id 10 >= --vocab-size 10"),
            std::string::npos)
      << vocab.status();
}

TEST(IndexedDatasetTest, BadJsonlNamesTheLineTheFieldAndTheFix) {
  absl::Status s = PackError(Jsonl({2}, false) + "{\"ids\": [1, 2], \"mask\": [1]}\n");
  EXPECT_NE(s.message().find("line 2: field \"mask\" has 1 entries but \"ids\" has 2"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("mask length mismatch"), std::string::npos) << s;
  s = PackError("{\"ids\": [1, \"x\"]}\n");
  EXPECT_NE(s.message().find("line 1: field \"ids\"[1] = \"x\" is not an integer"),
            std::string::npos)
      << s;
  s = PackError("{\"ids\": [1, 2, 99]}\n", /*vocab=*/50);
  EXPECT_NE(s.message().find("field \"ids\"[2] = 99 is not an integer in [0, 50)"),
            std::string::npos)
      << s;
  s = PackError("{\"ids\": [1], \"mask\": [2]}\n");
  EXPECT_NE(s.message().find("field \"mask\"[0] = 2"), std::string::npos) << s;
  s = PackError("{\"tokens\": [1]}\n");
  EXPECT_NE(s.message().find("line 1: field \"ids\" is missing"), std::string::npos) << s;
  s = PackError("[1, 2]\n");
  EXPECT_NE(s.message().find("line 1: not a JSON object"), std::string::npos) << s;
  s = PackError("{\"ids\": []}\n");
  EXPECT_NE(s.message().find("field \"ids\" is empty"), std::string::npos) << s;
}

class BadFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteText(dir_.Sub("in.jsonl"), Jsonl({3, 4, 5}, /*masked=*/true));
    ASSERT_TRUE(PackJsonl(dir_.Sub("in.jsonl"), prefix_, 0).ok());
  }
  std::string Open() {
    auto t = OpenIndexed(prefix_);
    return t.ok() ? "OK" : std::string(t.status().message());
  }
  // Overwrites the uint64 at byte `at` of the index.
  void PatchIndex(size_t at, uint64_t value) {
    std::string idx = ReadFile(IndexPath(prefix_));
    std::memcpy(idx.data() + at, &value, 8);
    WriteBytes(IndexPath(prefix_), idx);
  }
  TempDir dir_;
  std::string prefix_ = dir_.Sub("ds");
};

TEST_F(BadFilesTest, TruncatedIndex) {
  const std::string idx = ReadFile(IndexPath(prefix_));
  WriteBytes(IndexPath(prefix_), idx.substr(0, idx.size() - 4));
  const std::string e = Open();
  EXPECT_NE(e.find("truncated index"), std::string::npos) << e;
  EXPECT_NE(e.find(IndexPath(prefix_)), std::string::npos) << e;
  EXPECT_NE(e.find("ulysses-train data pack"), std::string::npos) << e;
  WriteBytes(IndexPath(prefix_), idx.substr(0, 20));
  EXPECT_NE(Open().find("shorter than the 40-byte header"), std::string::npos) << Open();
}

TEST_F(BadFilesTest, OffsetsOutOfRange) {
  PatchIndex(kIndexHeaderBytes + 8 * 2, 1000);  // offsets[2] past the 12 tokens
  const std::string e = Open();
  EXPECT_NE(e.find("document 1: offset out of range (offsets[2] = 1000 > 12 tokens)"),
            std::string::npos)
      << e;
}

TEST_F(BadFilesTest, OffsetsNotMonotone) {
  PatchIndex(kIndexHeaderBytes + 8 * 2, 2);  // offsets[2] = 2 < offsets[1] = 3
  const std::string e = Open();
  EXPECT_NE(e.find("document 1: offsets not increasing"), std::string::npos) << e;
}

TEST_F(BadFilesTest, MaskLengthMismatch) {
  WriteBytes(MaskPath(prefix_), ReadFile(MaskPath(prefix_)).substr(0, 7));
  const std::string e = Open();
  EXPECT_NE(e.find("mask length mismatch: 7 bytes, but the index lists 12 tokens"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find(MaskPath(prefix_)), std::string::npos) << e;
}

TEST_F(BadFilesTest, TokensFileOfTheWrongSize) {
  WriteBytes(TokensPath(prefix_), ReadFile(TokensPath(prefix_)) + "xxxx");
  EXPECT_NE(Open().find("the files do not belong together"), std::string::npos) << Open();
}

TEST_F(BadFilesTest, BadMagicAndVersion) {
  std::string idx = ReadFile(IndexPath(prefix_));
  idx[8] = 9;  // version 9
  WriteBytes(IndexPath(prefix_), idx);
  EXPECT_NE(Open().find("version 9 is not supported"), std::string::npos) << Open();
  idx[0] = 'X';
  WriteBytes(IndexPath(prefix_), idx);
  EXPECT_NE(Open().find("magic is not"), std::string::npos) << Open();
}

TEST_F(BadFilesTest, TokenAtLeastVocabNamesFileDocumentAndFix) {
  auto ds = OpenPackedDataset(prefix_, Split::kValidation, /*vocab_size=*/22, 1, true);
  ASSERT_TRUE(ds.ok()) << ds.status();
  // Document 2 holds ids 20..24: id 22 is token 2 of document 2.
  auto sample = (*ds)->Get(0, 16);
  ASSERT_FALSE(sample.ok());
  const std::string e(sample.status().message());
  EXPECT_NE(e.find(TokensPath(prefix_) + ": document 2 token 2: id 22 >= vocab_size 22"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("fix spec.model.vocab_size"), std::string::npos) << e;
}

TEST_F(BadFilesTest, MissingFilesAreNotFound) {
  fs::remove(TokensPath(prefix_));
  auto t = OpenIndexed(prefix_);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(OpenIndexed(dir_.Sub("nothing")).status().code(), absl::StatusCode::kNotFound);
}

// ---- packing ----

std::unique_ptr<TokenDataset> Packed(const TempDir& dir, const std::vector<int>& lengths,
                                     bool masked, bool packing, Split split = Split::kValidation) {
  WriteText(dir.Sub("p.jsonl"), Jsonl(lengths, masked));
  EXPECT_TRUE(PackJsonl(dir.Sub("p.jsonl"), dir.Sub("p"), 0).ok());
  auto ds = OpenPackedDataset(dir.Sub("p"), split, 1000, 3, packing);
  EXPECT_TRUE(ds.ok()) << ds.status();
  return std::move(*ds);
}

std::vector<int64_t> Vec(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kInt64).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(PackingTest, WholeDocumentsPositionsRestartAndNoLabelCrossesABoundary) {
  TempDir dir;
  // seq_len 8: [3 4] fill 7 -> seq 0 (+1 pad); [5] -> seq 1 (the 2 does not fit after it? 5+2=7
  // fits) -> seq 1 = [5 2] + 1 pad.
  auto ds = Packed(dir, {3, 4, 5, 2}, /*masked=*/false, /*packing=*/true);
  ASSERT_EQ(ds->NumSequences(8), 2);
  auto s0 = ds->Get(0, 8);
  ASSERT_TRUE(s0.ok()) << s0.status();
  EXPECT_EQ(Vec(s0->tokens), (std::vector<int64_t>{0, 1, 2, 10, 11, 12, 13, 0, 0}));
  EXPECT_EQ(Vec(s0->position_ids), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(Vec(s0->doc_ids), (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 2}));
  // Targets: inside doc 0 (positions 0, 1), inside doc 1 (3, 4, 5); not 2 (-> doc 1), not 6
  // (-> padding), not the padding.
  EXPECT_EQ(Vec(s0->target_mask), (std::vector<int64_t>{1, 1, 0, 1, 1, 1, 0, 0}));
  auto s1 = ds->Get(1, 8);
  ASSERT_TRUE(s1.ok());
  EXPECT_EQ(Vec(s1->doc_ids), (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 1, 2}));
  EXPECT_EQ(ds->Get(2, 8).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(PackingTest, LongDocumentsSplitWithEveryTargetOnce) {
  TempDir dir;
  // One document of 20 tokens at seq_len 8: pieces [0,8) [7,15) [14,20) -> 7 + 7 + 5 = 19 targets.
  auto ds = Packed(dir, {20}, /*masked=*/false, /*packing=*/true);
  ASSERT_EQ(ds->NumSequences(8), 3);
  std::multiset<int64_t> targets;  // target token ids trained
  for (int64_t i = 0; i < 3; ++i) {
    auto s = ds->Get(i, 8);
    ASSERT_TRUE(s.ok()) << s.status();
    auto tok = Vec(s->tokens), mask = Vec(s->target_mask), pos = Vec(s->position_ids);
    EXPECT_EQ(pos[0], 7 * i);  // a piece continues its document's positions
    for (int j = 0; j < 8; ++j) {
      if (mask[j]) targets.insert(tok[j + 1]);
    }
  }
  std::multiset<int64_t> want;
  for (int t = 1; t < 20; ++t) want.insert(t);
  EXPECT_EQ(targets, want);
}

TEST(PackingTest, PackingFalseIsOneDocumentPerSequenceAndMasksApply) {
  TempDir dir;
  auto ds = Packed(dir, {3, 4, 6}, /*masked=*/true, /*packing=*/false);
  ASSERT_EQ(ds->NumSequences(8), 3);
  auto s = ds->Get(2, 8);  // doc 2: ids 20..25, mask 0 on the first 3 tokens
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Vec(s->tokens), (std::vector<int64_t>{20, 21, 22, 23, 24, 25, 0, 0, 0}));
  EXPECT_EQ(Vec(s->doc_ids), (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1}));
  // Target j is token j+1: counted only when token j+1's mask is 1 (tokens 3, 4, 5).
  EXPECT_EQ(Vec(s->target_mask), (std::vector<int64_t>{0, 0, 1, 1, 1, 0, 0, 0}));
}

TEST(PackingTest, TrainOrderIsAPermutationPerEpochAndDeterministic) {
  TempDir dir;
  auto ds = Packed(dir, {3, 4, 5, 2, 7, 1, 6, 8, 2, 2}, false, true, Split::kTrain);
  const int64_t n = ds->NumSequences(8);
  ASSERT_GT(n, 3);
  std::set<std::vector<int64_t>> seen;
  for (int64_t i = 0; i < n; ++i) seen.insert(Vec(ds->Get(i, 8)->tokens));
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
  auto again = OpenPackedDataset(dir.Sub("p"), Split::kTrain, 1000, 3, true);
  ASSERT_TRUE(again.ok());
  for (int64_t i = 0; i < 2 * n; ++i) {
    EXPECT_EQ(Vec(ds->Get(i, 8)->tokens), Vec((*again)->Get(i, 8)->tokens)) << i;
  }
}

// ---- micro-batches and the data cursor ----

TEST(BatchesTest, LayoutsWithTheSameGlobalBatchReadTheSameSequences) {
  TempDir dir;
  auto ds = Packed(dir, {3, 4, 5, 2, 7, 1, 6, 8, 2, 2, 5, 5, 5, 5}, false, true, Split::kTrain);
  // The token rows of step 1 (cursor 4) under: mb 4; grad_accum 4 x mb 1; dp 2 x mb 2; dp 4.
  auto rows = [&](BatchLayout l) {
    std::multiset<std::vector<int64_t>> out;
    for (l.dp_rank = 0; l.dp_rank < l.dp; ++l.dp_rank) {
      auto mbs = StepMicroBatches(*ds, l, /*cursor=*/4);
      EXPECT_TRUE(mbs.ok()) << mbs.status();
      for (const LocalShard& m : *mbs) {
        EXPECT_EQ(m.input_ids.size(0), l.micro_batch);
        EXPECT_EQ(m.doc_ids.sizes().vec(), (std::vector<int64_t>{l.micro_batch, 8}));
        for (int64_t r = 0; r < m.input_ids.size(0); ++r) out.insert(Vec(m.input_ids[r]));
      }
    }
    return out;
  };
  BatchLayout mb4{8, 0, 1, 0, 1, 1, 4};
  BatchLayout ga4{8, 0, 1, 0, 1, 4, 1};
  BatchLayout dp2{8, 0, 1, 0, 2, 1, 2};
  BatchLayout dp4{8, 0, 1, 0, 4, 1, 1};
  const auto want = rows(mb4);
  EXPECT_EQ(want.size(), 4u);
  EXPECT_EQ(rows(ga4), want);
  EXPECT_EQ(rows(dp2), want);
  EXPECT_EQ(rows(dp4), want);
  // DP replicas read disjoint sequences.
  std::set<int64_t> indices;
  for (int64_t r = 0; r < 4; ++r) {
    dp4.dp_rank = r;
    indices.insert(CursorSequenceIndex(dp4, 4, 0, 0));
  }
  EXPECT_EQ(indices, (std::set<int64_t>{4, 5, 6, 7}));
}

}  // namespace
}  // namespace ulysses::engine
