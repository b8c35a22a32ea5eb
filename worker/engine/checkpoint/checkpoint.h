// Topology-independent sharded checkpoints with an atomic manifest.
//
// Layout: <root>/step-<global_step, 8 digits>/{shard-<r>-of-<w>.bin..., manifest.json}.
// Every rank holds the same (replicated) state; rank r writes the tensors whose
// index % world == r into its shard; rank 0 writes manifest.json LAST (tmp + fsync
// + rename + dir fsync). A step directory is committed iff manifest.json exists,
// so a crash at any point leaves the previous committed checkpoint as the latest.
// The manifest records every entry's shard and byte offset, so a loader reads only the pieces that
// overlap what it keeps (LoadCheckpointShare): any sp/dp/ZeRO layout resumes any checkpoint. Format
// details: docs/CHECKPOINTS.md.
//
// Thread-safety: the functions hold no global state; concurrent saves into the
// same root from different jobs are not supported. Errors name the file and what
// is wrong; a failed save never removes or modifies a committed checkpoint other
// than the one being rewritten at the same step (which is un-committed first).
#ifndef ULYSSES_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_
#define ULYSSES_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ulysses::engine {

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
  // A PIECE of a larger tensor (ZeRO: each rank saves only the chunk it owns): when full_shape is
  // set, `tensor` holds the flat elements [offset, offset + tensor.numel()) of the tensor `name`
  // of shape *full_shape. Saved pieces of one name must tile it exactly (checked at commit);
  // LoadCheckpoint reassembles them, so loaded states only hold whole tensors.
  std::optional<std::vector<int64_t>> full_shape;
  int64_t offset = 0;
};

enum class SaveMode {
  kReplicated,  // every rank passes the same state; rank r writes tensors with index % world == r
  kOwned,       // every rank passes (and writes) only what it owns: pieces and whole tensors
};

// Who wrote a checkpoint (the manifest's "owner"): the coordinator's tenant and job id, which a
// rank gets from its assignment (ulysses-train rank --job-id/--tenant). Empty job_id: a run
// outside a coordinator (no identity; CheckCheckpointOwner lets it read anything).
struct CheckpointOwner {
  std::string tenant;
  std::string job_id;
};

// Whether `me` may resume from or prune a checkpoint `written` wrote (step_dir names it in the
// error): yes when `me` has no identity, when `written` has none (a manifest of a build before
// owners: the coordinator gives a directory with such files to no one else, docs/SECURITY.md),
// when it is `me`, or, with `adopt` (spec.checkpoint.adopt), another job of `me`'s tenant.
// Otherwise FAILED_PRECONDITION naming both jobs (another tenant's job is not named).
absl::Status CheckCheckpointOwner(const std::string& step_dir, const CheckpointOwner& written,
                                  const CheckpointOwner& me, bool adopt);

struct CheckpointState {
  int64_t stage = 0;            // Stage index the checkpoint belongs to.
  int64_t step_in_stage = 0;    // Optimizer steps completed in that stage.
  int64_t global_step = 0;      // Names the step directory.
  bool stage_complete = false;  // True for the stage-end checkpoint.
  std::string spec_hash;        // spec::SpecHash of the job that wrote it.
  CheckpointOwner owner;        // The job that wrote it (manifest "owner"; none when empty).
  // Saves only (not written): retention also prunes checkpoints of `owner`'s tenant's other jobs
  // (spec.checkpoint.adopt). Retention never removes a committed checkpoint CheckCheckpointOwner
  // refuses to `owner`.
  bool adopt = false;
  // "model/<hf name>", "optim/exp_avg/<hf name>", ... (no RNG state: training has
  // none, see docs/CHECKPOINTS.md). Names must be unique. Supported dtypes: float32/64, float16,
  // bfloat16, int64/32, int16, int8, uint8, bool. Loaded tensors are contiguous CPU tensors.
  std::vector<NamedTensor> tensors;
  nlohmann::json extra = nlohmann::json::object();  // Free-form metadata.
};

inline constexpr char kManifestName[] = "manifest.json";

// "step-00000042".
std::string StepDirName(int64_t global_step);

// Collective: every rank calls with the same state (same tensor names/shapes; kOwned: the same
// metadata, each with the tensors it owns) and a `barrier` that returns when all `world` ranks
// have called it (3 calls per save).
// Returns the step dir. On rank 0, after committing, keeps the newest `keep_last`
// (>= 1) committed checkpoints and removes uncommitted step dirs older than the
// newest committed one. Every rank returns an error if the manifest was not written.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& root, const CheckpointState& state,
                                           int rank, int world, int64_t keep_last,
                                           const std::function<absl::Status()>& barrier,
                                           SaveMode mode = SaveMode::kReplicated);

// The committed step dir with the highest global step under root; NotFound if none.
absl::StatusOr<std::string> LatestCommittedCheckpoint(const std::string& root);

// Reads and verifies (magic, version, sizes, crc32 of every tensor) a committed
// checkpoint: every tensor whole (LoadCheckpointShare requesting everything). expected_spec_hash ""
// skips the spec check; otherwise a mismatch is FailedPrecondition "checkpoint was written for spec
// hash X, this job is Y".
absl::StatusOr<CheckpointState> LoadCheckpoint(const std::string& step_dir,
                                               const std::string& expected_spec_hash);

// What a rank keeps of one checkpoint tensor (LoadCheckpointShare): the whole tensor's shape the
// caller expects, and the flat elements [begin, end) it keeps (end < 0: the whole tensor).
struct TensorShare {
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = -1;
};
// By checkpoint name. Names not listed are not read; listed names the checkpoint lacks are
// absent from the result (the caller decides whether that is an error).
using ShareRequest = std::map<std::string, TensorShare>;

// Bytes a load read from disk (deterministic: counted, not sampled).
struct LoadStats {
  int64_t metadata_bytes = 0;  // manifest, shard headers, and shard tables of old manifests
  int64_t data_bytes = 0;      // tensor bytes
};

// The manifest alone: the state's metadata (stage, step, spec hash, extra) without tensors. Reads
// no shard. Errors as LoadCheckpoint.
absl::StatusOr<CheckpointState> ReadCheckpointInfo(const std::string& step_dir,
                                                   const std::string& expected_spec_hash);

// A committed checkpoint opened for reading by tensor: the manifest is read and checked once (as
// LoadCheckpointShare does), then Read() fetches one tensor, or one range of it, at a time from the
// pieces that overlap it (`ulysses-train export` streams a model through it). Not thread-safe.
class CheckpointReader {
 public:
  struct TensorInfo {
    torch::ScalarType dtype = torch::kFloat32;
    std::vector<int64_t> shape;  // the whole tensor's
  };
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& step_dir, const std::string& expected_spec_hash);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // The manifest's metadata (no tensors).
  const CheckpointState& info() const;
  // Every tensor name, in the manifest's order, with its dtype and whole shape.
  const std::vector<std::pair<std::string, TensorInfo>>& tensors() const;
  // FAILED_PRECONDITION naming the tensor, its file, both shapes and the fix when a requested
  // tensor the checkpoint has is of another shape (or the range is outside it).
  absl::Status Check(const ShareRequest& request) const;
  // One tensor (whole, or the range of `share`); NOT_FOUND when the checkpoint lacks it.
  absl::StatusOr<NamedTensor> Read(const std::string& name, const TensorShare& share);
  // Bytes read so far, the manifest included.
  const LoadStats& stats() const;

 private:
  struct Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads only what `request` keeps, one tensor at a time, from the pieces that overlap it: a piece
// inside the kept range is read straight into the result; one that straddles its edge is streamed
// in bounded blocks (its CRC is still checked over every byte), so no whole tensor the rank does
// not keep is ever assembled. A whole request comes back as a tensor of its shape, a range as a
// piece (NamedTensor::full_shape, offset = begin) of end - begin elements, in the stored dtype.
// Before any tensor byte is read, the manifest is checked: every shard exists with the size it
// records, the pieces of every name tile it, every entry lies inside its shard, and every requested
// name has the requested shape (FAILED_PRECONDITION naming the tensor, both shapes and the fix).
// Manifests of older builds (no per-entry "offset") are read through each shard's table.
absl::StatusOr<CheckpointState> LoadCheckpointShare(const std::string& step_dir,
                                                    const std::string& expected_spec_hash,
                                                    const ShareRequest& request,
                                                    LoadStats* stats = nullptr);

// Total bytes of the shard files listed in a committed step dir's manifest.
absl::StatusOr<int64_t> CheckpointBytes(const std::string& step_dir);

// CRC-32 (IEEE 802.3, as zlib's crc32), continuing from `crc` (0 to start).
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0);

}  // namespace ulysses::engine

#endif  // ULYSSES_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_H_
