// The pieces of a checkpoint save (checkpoint.h) that an asynchronous save (async_checkpoint.h)
// runs on its own schedule. SaveCheckpoint is these in order with three barriers; the files they
// write are the same bytes whichever path calls them. Not for other callers: the format and the
// protocol are defined in checkpoint.h / docs/CHECKPOINTS.md.
#ifndef ULYSSES_WORKER_ENGINE_CHECKPOINT_SAVE_PARTS_H_
#define ULYSSES_WORKER_ENGINE_CHECKPOINT_SAVE_PARTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/checkpoint.h"

namespace ulysses::engine::checkpoint_internal {

// The tensors rank `rank` writes (kReplicated: index % world == rank; kOwned: all), after checking
// that names are unique and pieces are 1-D ranges inside their full shape.
absl::StatusOr<std::vector<const NamedTensor*>> TensorsOfRank(const CheckpointState& state,
                                                              int rank, int world, SaveMode mode);

// "shard-<rank>-of-<world>.bin".
std::string ShardFileName(int rank, int world);

// One shard: path.tmp, fsync, rename, directory fsync. Tensors may live on any device (each is
// copied to a contiguous CPU tensor first; a contiguous CPU tensor is written as it is).
absl::Status WriteShardFile(const std::string& path, const std::vector<const NamedTensor*>& tensors,
                            int rank, int world);

// Rank 0's commit: reads every shard's table, checks the tensors are all there, writes
// manifest.json atomically (the commit point).
absl::Status WriteManifest(const std::string& dir, const CheckpointState& state, int world,
                           SaveMode mode);

absl::Status SyncDirectory(const std::string& dir);
absl::Status WriteSmallFileAtomic(const std::string& path, const std::string& bytes);

// Rank 0 after a commit: removes shards of other world sizes from `dir`, then applies retention
// (keep the newest keep_last committed; remove uncommitted dirs older than the newest committed).
// `state`: the committed state (its owner and adopt decide which older checkpoints retention
// may remove).
void AfterCommit(const std::string& root, const std::string& dir, int world, int64_t keep_last,
                 const CheckpointState& state);

}  // namespace ulysses::engine::checkpoint_internal

#endif  // ULYSSES_WORKER_ENGINE_CHECKPOINT_SAVE_PARTS_H_
