// Sequences of seq_len tokens cut from an indexed dataset (indexed.h) along document boundaries.
//
// Packing rules (docs/DATA.md):
//  - Documents are taken in file order and cut into items: a document of n <= seq_len tokens is
//    one item; a longer one is split into pieces of seq_len tokens that overlap by one token
//    (piece k is tokens [k*(s-1), min(n, k*(s-1)+s))), so each of its n-1 targets is trained
//    exactly once.
//  - packing: true fills each sequence with whole items in order (next-fit: an item that does not
//    fit in what is left starts the next sequence); packing: false puts one item per sequence.
//    The unused tail is padding (token 0, its own document, no target).
//  - position_ids restart at 0 at each document (a piece continues its document's positions);
//    doc_ids number the items of the sequence 0, 1, ... (padding last); the target of position i
//    is token i+1 only when both are in the same item and token i+1's loss mask is 1, so no label
//    crosses a document and masked tokens never count.
//  - Train: sequence `index` is packed sequence EpochWindow(index, W, seed, seq_len) of epoch
//    index / W (W sequences per epoch). Validation: sequence index in file order, < W.
// The plan (first item of every sequence, 16 bytes per sequence) is built once per seq_len on
// first use by one pass over the document index; Get() is then O(seq_len).
// Thread-safe: Get/NumSequences may be called concurrently (the plan cache is locked).
#ifndef ULYSSES_WORKER_ENGINE_DATA_PACKING_H_
#define ULYSSES_WORKER_ENGINE_DATA_PACKING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/data/dataset.h"
#include "worker/engine/data/indexed.h"

namespace ulysses::engine {

// Opens PREFIX.{idx,bin[,mask]} (OpenIndexed) as a TokenDataset. vocab_size > 0 bounds token
// ids (checked as sequences are read; errors name the file and the document).
absl::StatusOr<std::unique_ptr<TokenDataset>> OpenPackedDataset(const std::string& prefix,
                                                                Split split, int64_t vocab_size,
                                                                uint64_t seed, bool packing);

// The same over an already open dataset (shared: several views may read one mapping).
std::unique_ptr<TokenDataset> PackedView(std::shared_ptr<const IndexedTokens> tokens, Split split,
                                         int64_t vocab_size, uint64_t seed, bool packing);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_DATA_PACKING_H_
