// The indexed token dataset: documents of token ids, memory-mapped, with an optional per-token
// loss mask. Our own format, in the spirit of Megatron-LM's indexed dataset (docs/DATA.md):
//
//   PREFIX.idx   little-endian header, then the document offsets
//     bytes  0..8   magic "ULYSIDX\0"
//     bytes  8..12  uint32 version (kIndexVersion = 1)
//     bytes 12..16  uint32 token dtype: 4 = uint32 (the only one written today; 2 = uint16 read)
//     bytes 16..20  uint32 flags: bit 0 = PREFIX.mask exists
//     bytes 20..24  uint32 reserved (0)
//     bytes 24..32  uint64 number of documents D (>= 1)
//     bytes 32..40  uint64 number of tokens T
//     bytes 40..    uint64 offsets[D + 1]: document d is tokens [offsets[d], offsets[d+1]);
//                   offsets[0] = 0, strictly increasing (no empty document), offsets[D] = T
//   PREFIX.bin   T tokens of the dtype, little-endian
//   PREFIX.mask  T bytes, 0 or 1: 1 = the token counts as a target in the loss (absent = all 1)
//
// OpenIndexed validates the structure on open (sizes, magic, version, offsets in range and
// monotone, mask length); token ids and mask bytes are checked when a document is read (a file of
// many GiB is never scanned whole), and `ulysses-train data pack --vocab-size V` checks them once
// at pack time. Every error names the file, the document and the fix.
//
// Thread-safety: an IndexedTokens is immutable after open; reads are safe from any thread.
// Ownership: it owns its read-only mappings until destroyed.
#ifndef ULYSSES_WORKER_ENGINE_DATA_INDEXED_H_
#define ULYSSES_WORKER_ENGINE_DATA_INDEXED_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ulysses::engine {

inline constexpr char kIndexMagic[8] = {'U', 'L', 'Y', 'S', 'I', 'D', 'X', '\0'};
inline constexpr uint32_t kIndexVersion = 1;
inline constexpr uint32_t kDtypeUint16 = 2;
inline constexpr uint32_t kDtypeUint32 = 4;
inline constexpr uint32_t kFlagHasMask = 1;
inline constexpr int64_t kIndexHeaderBytes = 40;

// The three file names of a dataset prefix.
std::string IndexPath(const std::string& prefix);
std::string TokensPath(const std::string& prefix);
std::string MaskPath(const std::string& prefix);

class IndexedTokens {
 public:
  ~IndexedTokens();
  IndexedTokens(const IndexedTokens&) = delete;
  IndexedTokens& operator=(const IndexedTokens&) = delete;

  const std::string& prefix() const { return prefix_; }
  int64_t num_docs() const { return num_docs_; }
  int64_t num_tokens() const { return num_tokens_; }
  bool has_mask() const { return mask_ != nullptr; }
  int64_t DocBegin(int64_t doc) const { return static_cast<int64_t>(offsets_[doc]); }
  int64_t DocLength(int64_t doc) const {
    return static_cast<int64_t>(offsets_[doc + 1] - offsets_[doc]);
  }
  // Copies tokens [begin, begin + n) of document `doc` (relative to the document start) into
  // tokens[0, n) and their loss mask into mask[0, n) (1 when there is no mask stream). Checks
  // every id < vocab_size (when > 0) and every mask byte is 0/1: INVALID_ARGUMENT naming the file,
  // the document, the token and the fix.
  absl::Status Read(int64_t doc, int64_t begin, int64_t n, int64_t vocab_size, int64_t* tokens,
                    bool* mask) const;

 private:
  friend absl::StatusOr<std::unique_ptr<IndexedTokens>> OpenIndexed(const std::string& prefix);
  IndexedTokens() = default;
  struct Mapping {
    const void* data = nullptr;
    size_t bytes = 0;
  };
  std::string prefix_;
  Mapping idx_map_, bin_map_, mask_map_;
  const uint64_t* offsets_ = nullptr;
  const uint8_t* tokens_ = nullptr;
  const uint8_t* mask_ = nullptr;
  uint32_t dtype_ = kDtypeUint32;
  int64_t num_docs_ = 0, num_tokens_ = 0;
};

// Maps and validates PREFIX.{idx,bin[,mask]}: NOT_FOUND for a missing file, INVALID_ARGUMENT /
// DATA_LOSS naming the file, the field (or document) and the fix otherwise.
absl::StatusOr<std::unique_ptr<IndexedTokens>> OpenIndexed(const std::string& prefix);

// Streams documents into PREFIX.{idx,bin,mask}. Files are written as PREFIX.*.tmp and renamed by
// Finish(); an abandoned writer (error, or destroyed before Finish) removes its temporaries, so a
// failed pack never leaves a half dataset under the final names. Memory: O(1) in the data size.
class IndexWriter {
 public:
  static absl::StatusOr<std::unique_ptr<IndexWriter>> Create(const std::string& prefix);
  ~IndexWriter();
  // One document (>= 1 token). mask: empty (all 1) or one 0/1 byte per token.
  absl::Status Add(const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& mask);
  // Writes the header, drops the mask stream when every byte was 1, renames into place.
  absl::Status Finish();
  int64_t num_docs() const { return num_docs_; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  explicit IndexWriter(std::string prefix) : prefix_(std::move(prefix)) {}
  void RemoveTemporaries();
  std::string prefix_;
  std::ofstream idx_, bin_, mask_;
  int64_t num_docs_ = 0, num_tokens_ = 0;
  bool any_masked_ = false, finished_ = false;
};

struct PackStats {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t bytes_read = 0;
  bool has_mask = false;
};

// JSONL, one document per line: {"ids": [int, ...], "mask": [0|1, ...]} ("mask" optional, same
// length as "ids"; blank lines skipped). vocab_size > 0 bounds the ids. Errors name the file, the
// line, the field and the fix; on error nothing is left under PREFIX.*.
absl::StatusOr<PackStats> PackJsonl(const std::string& jsonl, const std::string& prefix,
                                    int64_t vocab_size);

// A flat little-endian uint32 token file (the format of spec.data.train today), cut into documents
// after every `eos` token (eos >= 0), or into documents of doc_len tokens (doc_len > 0; the last
// may be shorter). Exactly one of the two. Streams in fixed-size chunks.
absl::StatusOr<PackStats> PackFlat(const std::string& flat, const std::string& prefix,
                                   int64_t doc_len, int64_t eos, int64_t vocab_size);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_DATA_INDEXED_H_
