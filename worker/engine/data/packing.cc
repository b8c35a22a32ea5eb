#include "worker/engine/data/packing.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"

namespace ulysses::engine {
namespace {

// Where a sequence starts: document `doc`, piece `piece` of it.
struct ItemRef {
  int64_t doc = 0;
  int64_t piece = 0;
};

// Pieces of a document of n tokens for sequence length s (>= 2): ceil((n-1)/(s-1)), at least 1.
int64_t PieceCount(int64_t n, int64_t s) {
  if (n <= s) return 1;
  return (n - 1 + (s - 2)) / (s - 1);
}
int64_t PieceBegin(int64_t piece, int64_t s) { return piece * (s - 1); }
int64_t PieceLength(int64_t n, int64_t piece, int64_t s) {
  return n <= s ? n : std::min(s, n - PieceBegin(piece, s));
}

class PackedDataset final : public TokenDataset {
 public:
  PackedDataset(std::shared_ptr<const IndexedTokens> tokens, Split split, int64_t vocab_size,
                uint64_t seed, bool packing)
      : tokens_(std::move(tokens)),
        split_(split),
        vocab_size_(vocab_size),
        seed_(seed),
        packing_(packing) {}

  int64_t NumSequences(int64_t seq_len) const override {
    if (seq_len < 2) return 0;
    return static_cast<int64_t>(Plan(seq_len).size());
  }

  absl::StatusOr<Sample> Get(int64_t index, int64_t seq_len) const override {
    if (seq_len < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("seq_len ", seq_len, " is too short for packed documents (needs >= 2)"));
    }
    if (index < 0) return absl::InvalidArgumentError(absl::StrCat("negative index ", index));
    const std::vector<ItemRef>& plan = Plan(seq_len);
    const int64_t count = static_cast<int64_t>(plan.size());
    int64_t which = index;
    if (split_ == Split::kTrain) {
      which = EpochWindow(index, count, seed_, static_cast<uint64_t>(seq_len));
    } else if (index >= count) {
      return absl::OutOfRangeError(absl::StrCat("validation index ", index, " >= ", count,
                                                " packed sequences of ", seq_len, " tokens in ",
                                                tokens_->prefix()));
    }
    return Build(plan[which], seq_len);
  }

 private:
  // Fills one sequence starting at `start`, by the packing rules.
  absl::StatusOr<Sample> Build(ItemRef start, int64_t s) const {
    Sample out;
    out.tokens = torch::zeros({s + 1}, torch::kInt64);
    out.target_mask = torch::zeros({s}, torch::kBool);
    out.position_ids = torch::zeros({s}, torch::kInt64);
    out.doc_ids = torch::zeros({s}, torch::kInt64);
    int64_t* tok = out.tokens.data_ptr<int64_t>();
    bool* target = out.target_mask.data_ptr<bool>();
    int64_t* pos = out.position_ids.data_ptr<int64_t>();
    int64_t* doc = out.doc_ids.data_ptr<int64_t>();
    std::unique_ptr<bool[]> mask(new bool[s]);
    int64_t used = 0, item = 0;
    ItemRef at = start;
    while (at.doc < tokens_->num_docs()) {
      const int64_t n = tokens_->DocLength(at.doc);
      const int64_t len = PieceLength(n, at.piece, s);
      if (used + len > s || (!packing_ && item > 0)) break;
      const int64_t begin = n <= s ? 0 : PieceBegin(at.piece, s);
      RETURN_IF_ERROR(tokens_->Read(at.doc, begin, len, vocab_size_, tok + used, mask.get()));
      for (int64_t i = 0; i < len; ++i) {
        pos[used + i] = begin + i;
        doc[used + i] = item;
        // Target of position used+i-1 is this token: same item only.
        if (i > 0) target[used + i - 1] = mask[i];
      }
      used += len;
      ++item;
      if (++at.piece >= PieceCount(n, s)) at = ItemRef{at.doc + 1, 0};
    }
    for (int64_t i = used; i < s; ++i) {  // padding: its own document, no target
      pos[i] = i - used;
      doc[i] = item;
    }
    return out;
  }

  // First item of every sequence for seq_len s, built on first use.
  const std::vector<ItemRef>& Plan(int64_t s) const {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(s);
    if (it != plans_.end()) return it->second;
    std::vector<ItemRef>& plan = plans_[s];
    int64_t used = s;  // "full": the first item opens a sequence
    for (int64_t d = 0; d < tokens_->num_docs(); ++d) {
      const int64_t n = tokens_->DocLength(d);
      for (int64_t k = 0, pieces = PieceCount(n, s); k < pieces; ++k) {
        const int64_t len = PieceLength(n, k, s);
        if (!packing_ || used + len > s) {
          plan.push_back(ItemRef{d, k});
          used = 0;
        }
        used += len;
      }
    }
    return plan;
  }

  const std::shared_ptr<const IndexedTokens> tokens_;
  const Split split_;
  const int64_t vocab_size_;
  const uint64_t seed_;
  const bool packing_;
  mutable absl::Mutex mu_;
  // Node-stable: the references Plan returns stay valid after the lock is released.
  mutable std::map<int64_t, std::vector<ItemRef>> plans_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<TokenDataset> PackedView(std::shared_ptr<const IndexedTokens> tokens, Split split,
                                         int64_t vocab_size, uint64_t seed, bool packing) {
  return std::make_unique<PackedDataset>(std::move(tokens), split, vocab_size, seed, packing);
}

absl::StatusOr<std::unique_ptr<TokenDataset>> OpenPackedDataset(const std::string& prefix,
                                                                Split split, int64_t vocab_size,
                                                                uint64_t seed, bool packing) {
  ASSIGN_OR_RETURN(std::unique_ptr<IndexedTokens> tokens, OpenIndexed(prefix));
  return PackedView(std::shared_ptr<const IndexedTokens>(std::move(tokens)), split, vocab_size,
                    seed, packing);
}

}  // namespace ulysses::engine
