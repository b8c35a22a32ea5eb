// Token datasets for the training engine: flat uint32 token files (mmap) and
// seeded synthetic generators ("random", "needle"). A dataset maps a sequence
// index and a sequence length to one Sample, deterministically: the same
// (index, seq_len) always yields the same tokens, on every rank and every run,
// so resuming only needs the step counters.
//
// Thread-safety: Get()/NumSequences() are const and safe to call concurrently.
// Ownership: a FileTokenDataset owns its read-only mapping until destroyed.
// Errors: a bad file or an out-of-vocabulary token returns a Status naming the
// file, byte offset, token and vocabulary size; nothing is cached on error.
//
// Synthetic "needle" task (long-range retrieval), token ids:
//   0 PAD (unused)   1 BOS   2 KEY   3 (reserved)   4 QUERY   5..7 reserved
//   keys    : [8, 8 + K)                       K = NeedleLayout::num_keys (8 at vocab >= 72)
//   values  : key k owns [value_begin + k*M, value_begin + (k+1)*M)   M = values_per_key
//   filler  : [filler_begin, vocab_size)       (about half of the ids)
// A sequence of s+1 tokens is: BOS, uniform random filler with n = min(K, s/16) needles
// "KEY k v" planted at random depths (distinct keys, v uniform over key k's M values), and,
// at the END, n queries "QUERY k v", one per planted key in an independent random order.
// target_mask marks exactly the n positions whose input is a queried key (target: its
// value), so loss and accuracy on this task measure retrieval only; training also learns
// from these positions only (filler is random by construction). The value exists once in
// the sequence, at a random depth, so nothing beats chance (1/M; ln M loss) without
// attending back across the context. Giving every key its own value range keeps the task to
// one attention hop (find the token of key k's type) instead of an induction circuit, which
// a small model learns from scratch in minutes on a CPU (docs/ENGINE.md has the numbers).
// Accuracy = fraction of masked positions where argmax == target.
#ifndef ULYSSES_WORKER_ENGINE_DATA_DATASET_H_
#define ULYSSES_WORKER_ENGINE_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "common/spec/needle_limits.h"

namespace ulysses::engine {

enum class Split { kTrain, kValidation };

struct Sample {
  torch::Tensor tokens;       // [s + 1] int64: inputs are tokens[0:s], targets tokens[1:s+1].
  torch::Tensor target_mask;  // [s] bool: which positions are scored; undefined = all.
  // Packed documents (indexed datasets, docs/DATA.md); both undefined for one document:
  torch::Tensor position_ids;  // [s] int64 RoPE position of each input (restarts per document).
  torch::Tensor doc_ids;       // [s] int64 document of each input, non-decreasing.
};

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  // The sample at `index` (>= 0) for sequence length `seq_len` (>= 1).
  virtual absl::StatusOr<Sample> Get(int64_t index, int64_t seq_len) const = 0;
  // Distinct sequences of length seq_len: train files report windows per epoch
  // (Get wraps into later, reshuffled epochs beyond it); validation reports the
  // window count; synthetic train reports -1 (unbounded).
  virtual int64_t NumSequences(int64_t seq_len) const = 0;
};

// Needle-task vocabulary layout (see the header comment).
struct NeedleVocab {
  static constexpr int64_t kPad = 0, kBos = 1, kKey = 2, kQuery = 4;
  static constexpr int64_t kFirstFree = 8;
  // The validator's limits too (one definition, common/spec/needle_limits.h).
  static constexpr int64_t kMinVocab = spec::kNeedleMinVocab;
  static constexpr int64_t kMinSeqLen = spec::kNeedleMinSeqLen;
};

// Where keys, values and filler live for a vocabulary size (>= NeedleVocab::kMinVocab).
struct NeedleLayout {
  static constexpr int64_t kMaxKeys = 8;
  int64_t num_keys = 0;        // K: distinct keys; a sequence plants each at most once.
  int64_t values_per_key = 0;  // M: chance accuracy is 1/M.
  int64_t key_begin = 0, value_begin = 0, filler_begin = 0;
  int64_t ValueBegin(int64_t key) const { return value_begin + key * values_per_key; }
  static NeedleLayout For(int64_t vocab_size);
  // Needles (and queries) in one sequence of seq_len tokens: min(K, seq_len / 16), >= 1.
  int64_t NeedlesFor(int64_t seq_len) const;
};

// Flat little-endian uint32 token file. Train: sequence i is window k = perm_e(i % W)
// of epoch e = i / W, covering tokens [k*s, k*s+s+1), W = (n-1)/s windows, perm a
// seed-determined permutation per epoch. Validation: window k = [k*s, k*s+s+1) for
// k < n/s (a partial last window is dropped); when the last window's final target
// lies past the end of the file it is masked.
absl::StatusOr<std::unique_ptr<TokenDataset>> OpenTokenFile(const std::string& path, Split split,
                                                            int64_t vocab_size, uint64_t seed);

// Synthetic generator "random" or "needle"; never stored. Seeded by (seed, split, index).
// validation_sequences bounds the validation split.
absl::StatusOr<std::unique_ptr<TokenDataset>> OpenSynthetic(const std::string& generator,
                                                            Split split, int64_t vocab_size,
                                                            uint64_t seed,
                                                            int64_t validation_sequences);

// Opens spec.data for `split`: the synthetic generator when spec.data.synthetic is set,
// else spec.data.train / spec.data.validation: a flat token file (format: flat) or an indexed
// dataset prefix packed per spec.data.packing (format: indexed, packing.h). vocab_size bounds
// token ids.
absl::StatusOr<std::unique_ptr<TokenDataset>> OpenDataset(const spec::JobSpec& spec, Split split,
                                                          int64_t vocab_size);

// The train order shared by file datasets: sequence `index` of a dataset of n >= 1 sequences reads
// sequence EpochWindow(...) of epoch index / n, a seeded permutation of [0, n) per (epoch, salt).
int64_t EpochWindow(int64_t index, int64_t n, uint64_t seed, uint64_t salt);

// Fraction of scored positions (target_mask, or all when undefined) where
// predictions[i] == tokens[i+1]. predictions: [s] int64 (argmax of logits).
double ScoredAccuracy(const Sample& sample, const torch::Tensor& predictions);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_DATA_DATASET_H_
