// Shard-format helpers checkpoint.cc (the writer) shares with checkpoint_load.cc (the reader), so
// the format is defined once. Not part of the checkpoint API.
#ifndef ULYSSES_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INTERNAL_H_
#define ULYSSES_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INTERNAL_H_

#include <cstdint>
#include <map>
#include <string>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/checkpoint/checkpoint.h"

namespace ulysses::engine::checkpoint_internal {

// Bytes of a shard's fixed header (magic, version, table crc and length, data offset).
inline constexpr int64_t kShardPrefixBytes = 32;

// <step_dir>/manifest.json parsed; format and version checked (NOT_FOUND when uncommitted).
absl::StatusOr<nlohmann::json> ReadManifestJson(const std::string& step_dir);
// The manifest's "owner" (empty when it has none or it is malformed: a build before owners).
CheckpointOwner ManifestOwner(const nlohmann::json& manifest);
// "float32" -> kFloat32, ...; INVALID_ARGUMENT for a name the format does not know.
absl::StatusOr<torch::ScalarType> DtypeFromString(const std::string& name);
// Key of an entry: its name, plus "@<elem_offset>" for a piece.
std::string PieceKeyOf(const std::string& name, bool piece, int64_t elem_offset);
// Checks the magic and format version of a shard's first kShardPrefixBytes bytes.
absl::Status CheckShardPrefix(const std::string& path, const char* prefix);
// Reads a shard's header and table (verified): each entry's byte offset by key. Adds the header
// and table bytes to *bytes_read. For manifests written before entries recorded their offset.
absl::StatusOr<std::map<std::string, int64_t>> ShardTableOffsets(const std::string& path,
                                                                 int64_t* bytes_read);

}  // namespace ulysses::engine::checkpoint_internal

#endif  // ULYSSES_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_INTERNAL_H_
