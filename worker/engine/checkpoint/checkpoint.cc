#include "worker/engine/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#ifdef ULYSSES_HAVE_ZLIB
#include <zlib.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/failpoint.h"
#include "common/file_tree.h"
#include "common/logging.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"
#include "worker/engine/checkpoint/checkpoint_internal.h"
#include "worker/engine/checkpoint/save_parts.h"
#include "worker/engine/checkpoint/shard_writer.h"
#include "worker/engine/model/torch_dtype.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;

// Shard file header (little-endian), see docs/CHECKPOINTS.md:
//   [0, 8)   magic "ULYSCKPT"        [8, 12)  u32 format version
//   [12, 16) u32 crc32 of the table  [16, 24) u64 table length in bytes
//   [24, 32) u64 data offset (64-aligned)
//   [32, 32 + table length) JSON table: {"rank","world","tensors":[{name, dtype, shape,
//                                        offset (absolute), bytes, crc32}]}
constexpr char kMagic[8] = {'U', 'L', 'Y', 'S', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
// Manifest version of a checkpoint holding pieces (NamedTensor::full_shape); readers take both.
constexpr int kPieceManifestVersion = 2;
constexpr int64_t kPrefixBytes = checkpoint_internal::kShardPrefixBytes;
constexpr int64_t kAlign = 64;

int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

std::string ShardName(int rank, int world) {
  return absl::StrCat("shard-", rank, "-of-", world, ".bin");
}

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::StatusOr<std::string> DtypeName(torch::ScalarType t) {
  const DtypeInfo* d = DtypeOf(t);
  if (d == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", c10::toString(t)));
  }
  return std::string(d->name);
}

absl::StatusOr<torch::ScalarType> DtypeFromName(const std::string& name) {
  const DtypeInfo* d = FindDtype(name);
  if (d == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", name));
  return TorchType(*d);
}

class File {
 public:
  File() = default;
  ~File() {
    if (fd_ >= 0) close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  absl::Status Open(const std::string& path, int flags) {
    path_ = path;
    fd_ = open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoError("cannot open", path);
    return absl::OkStatus();
  }
  absl::Status Write(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = write(fd_, p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("cannot write", path_);
      p += n;
      size -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status ReadAt(void* data, size_t size, int64_t offset) {
    char* p = static_cast<char*>(data);
    while (size > 0) {
      ssize_t n = pread(fd_, p, size, offset);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("cannot read", path_);
      if (n == 0) {
        return absl::DataLossError(absl::StrCat("checkpoint shard ", path_,
                                                " is truncated (unexpected end of file at byte ",
                                                offset, ")"));
      }
      p += n;
      size -= static_cast<size_t>(n);
      offset += n;
    }
    return absl::OkStatus();
  }
  absl::Status Sync() {
    if (fsync(fd_) != 0) return ErrnoError("cannot fsync", path_);
    return absl::OkStatus();
  }
  absl::Status Close() {
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) return ErrnoError("cannot close", path_);
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_ = -1;
};

absl::Status SyncDir(const std::string& dir) {
  File f;
  RETURN_IF_ERROR(f.Open(dir, O_RDONLY | O_DIRECTORY));
  return f.Sync();
}

// Writes `bytes` to path via path.tmp + fsync + rename + directory fsync.
absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    File f;
    RETURN_IF_ERROR(f.Open(tmp, O_WRONLY | O_CREAT | O_TRUNC));
    RETURN_IF_ERROR(f.Write(bytes.data(), bytes.size()));
    RETURN_IF_ERROR(f.Sync());
    RETURN_IF_ERROR(f.Close());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename to", path);
  return SyncDir(fs::path(path).parent_path().string());
}

struct TableEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
  std::optional<std::vector<int64_t>> full_shape;  // set for a piece
  int64_t elem_offset = 0;                         // a piece's first flat element
};

// Key of a tensor or piece in a checkpoint: the name, plus "@offset" for a piece.
std::string PieceKey(const std::string& name, bool piece, int64_t offset) {
  return piece ? absl::StrCat(name, "@", offset) : name;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status WriteShard(const std::string& path, const std::vector<const NamedTensor*>& tensors,
                        int rank, int world) {
  std::vector<torch::Tensor> cpu;
  nlohmann::json table = {{"rank", rank}, {"world", world}, {"tensors", nlohmann::json::array()}};
  std::vector<int64_t> sizes;
  for (const NamedTensor* nt : tensors) {
    cpu.push_back(nt->tensor.detach().to(torch::kCPU).contiguous());
    ASSIGN_OR_RETURN(std::string dtype, DtypeName(cpu.back().scalar_type()));
    const int64_t bytes = cpu.back().numel() * static_cast<int64_t>(cpu.back().element_size());
    sizes.push_back(bytes);
    table["tensors"].push_back({{"name", nt->name},
                                {"dtype", dtype},
                                {"shape", cpu.back().sizes().vec()},
                                {"bytes", bytes},
                                {"crc32", Crc32(cpu.back().data_ptr(), bytes)}});
    if (nt->full_shape) {
      table["tensors"].back()["full_shape"] = *nt->full_shape;
      table["tensors"].back()["elem_offset"] = nt->offset;
    }
  }
  // Offsets depend on the table length, which depends on the offsets' digits: fix the
  // table size by padding offsets with a first pass at a generous data offset.
  int64_t data_offset = 0;
  std::string table_text;
  for (int pass = 0; pass < 3; ++pass) {
    int64_t offset = AlignUp(kPrefixBytes + static_cast<int64_t>(table_text.size()));
    data_offset = offset;
    for (size_t i = 0; i < cpu.size(); ++i) {
      table["tensors"][i]["offset"] = offset;
      offset = AlignUp(offset + sizes[i]);
    }
    std::string next = table.dump();
    if (next.size() == table_text.size()) {
      table_text = next;
      break;
    }
    table_text = next;
  }
  if (AlignUp(kPrefixBytes + static_cast<int64_t>(table_text.size())) != data_offset) {
    return absl::InternalError("checkpoint table layout did not converge");
  }
  std::array<char, kPrefixBytes> prefix{};
  std::memcpy(prefix.data(), kMagic, 8);
  const uint32_t table_crc = Crc32(table_text.data(), table_text.size());
  const uint64_t table_len = table_text.size(), data_off = static_cast<uint64_t>(data_offset);
  std::memcpy(prefix.data() + 8, &kVersion, 4);
  std::memcpy(prefix.data() + 12, &table_crc, 4);
  std::memcpy(prefix.data() + 16, &table_len, 8);
  std::memcpy(prefix.data() + 24, &data_off, 8);

  const std::string tmp = path + ".tmp";
  ASSIGN_OR_RETURN(std::unique_ptr<SequentialFileWriter> f, SequentialFileWriter::Create(tmp));
  RETURN_IF_ERROR(f->Append(prefix.data(), prefix.size()));
  RETURN_IF_ERROR(f->Append(table_text.data(), table_text.size()));
  for (size_t i = 0; i < cpu.size(); ++i) {
    const int64_t offset = table["tensors"][i]["offset"].get<int64_t>();
    RETURN_IF_ERROR(f->AppendZeros(static_cast<size_t>(offset - f->bytes())));
    RETURN_IF_ERROR(f->Append(cpu[i].data_ptr(), static_cast<size_t>(sizes[i])));
  }
  RETURN_IF_ERROR(f->Finish());
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename to", path);
  return SyncDir(fs::path(path).parent_path().string());
}

struct ShardInfo {
  int64_t file_bytes = 0;
  std::vector<TableEntry> entries;
};

absl::StatusOr<ShardInfo> ReadShardTable(const std::string& path, File& f) {
  RETURN_IF_ERROR(f.Open(path, O_RDONLY));
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoError("cannot stat", path);
  ShardInfo info;
  info.file_bytes = st.st_size;
  if (info.file_bytes < kPrefixBytes) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path, " is truncated (",
                                            info.file_bytes, " bytes, header needs ", kPrefixBytes,
                                            ")"));
  }
  std::array<char, kPrefixBytes> prefix;
  RETURN_IF_ERROR(f.ReadAt(prefix.data(), prefix.size(), 0));
  if (std::memcmp(prefix.data(), kMagic, 8) != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path,
                                            " has a bad magic (not a Ulysses checkpoint shard)"));
  }
  uint32_t version, table_crc;
  uint64_t table_len, data_offset;
  std::memcpy(&version, prefix.data() + 8, 4);
  std::memcpy(&table_crc, prefix.data() + 12, 4);
  std::memcpy(&table_len, prefix.data() + 16, 8);
  std::memcpy(&data_offset, prefix.data() + 24, 8);
  if (version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint shard ", path,
                                                      " has format version ", version,
                                                      "; this build reads version ", kVersion));
  }
  if (table_len > static_cast<uint64_t>(info.file_bytes - kPrefixBytes)) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path,
                                            " is truncated (tensor table of ", table_len,
                                            " bytes does not fit in ", info.file_bytes, ")"));
  }
  std::string table_text(table_len, '\0');
  RETURN_IF_ERROR(f.ReadAt(table_text.data(), table_len, kPrefixBytes));
  if (Crc32(table_text.data(), table_text.size()) != table_crc) {
    return absl::DataLossError(
        absl::StrCat("checkpoint shard ", path, ": tensor table crc32 mismatch"));
  }
  nlohmann::json table = nlohmann::json::parse(table_text, nullptr, /*allow_exceptions=*/false);
  if (!table.is_object() || !table.contains("tensors")) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path, ": malformed tensor table"));
  }
  try {
    for (const auto& t : table["tensors"]) {
      TableEntry e;
      e.name = t.at("name").get<std::string>();
      e.dtype = t.at("dtype").get<std::string>();
      e.shape = t.at("shape").get<std::vector<int64_t>>();
      e.offset = t.at("offset").get<int64_t>();
      e.bytes = t.at("bytes").get<int64_t>();
      e.crc32 = t.at("crc32").get<uint32_t>();
      if (t.contains("full_shape")) {
        e.full_shape = t.at("full_shape").get<std::vector<int64_t>>();
        e.elem_offset = t.at("elem_offset").get<int64_t>();
      }
      if (e.offset + e.bytes > info.file_bytes) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint shard ", path, " is truncated: tensor ", e.name, " needs bytes [", e.offset,
            ", ", e.offset + e.bytes, ") of a ", info.file_bytes, "-byte file"));
      }
      info.entries.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint shard ", path, ": malformed tensor table: ", e.what()));
  }
  (void)data_offset;
  return info;
}

absl::StatusOr<nlohmann::json> ReadManifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / kManifestName).string();
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", step_dir, " is not committed: ", path, " is missing"));
  }
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  nlohmann::json manifest = nlohmann::json::parse(text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object() ||
      manifest.value("format", "") != "ulysses-checkpoint") {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, " is malformed"));
  }
  const int version = manifest.value("version", 0);
  if (version != static_cast<int>(kVersion) && version != kPieceManifestVersion) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint manifest ", path, " has version ",
                                                      version, "; this build reads versions ",
                                                      kVersion, " and ", kPieceManifestVersion));
  }
  return manifest;
}

// Step number of a "step-XXXXXXXX" directory name, or -1.
int64_t ParseStepDir(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// (step, path, committed) for every step dir under root, ascending by step.
std::vector<std::tuple<int64_t, std::string, bool>> ListStepDirs(const std::string& root) {
  std::vector<std::tuple<int64_t, std::string, bool>> dirs;
  auto entries = ListDirectory(root);  // Not fs::directory_iterator: see common/file_tree.h.
  if (!entries.ok()) return dirs;
  for (const DirEntry& entry : *entries) {
    if (!entry.is_directory) continue;
    const int64_t step = ParseStepDir(entry.name);
    if (step < 0) continue;
    const fs::path path = fs::path(root) / entry.name;
    dirs.emplace_back(step, path.string(), fs::exists(path / kManifestName));
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// kOwned: every tensor of every shard is listed; the pieces of each name must tile it exactly.
absl::Status ListOwnedTensors(const std::string& dir,
                              const std::map<std::string, std::pair<int, TableEntry>>& by_key,
                              nlohmann::json& tensors, bool& has_pieces) {
  std::map<std::string, std::vector<const std::pair<int, TableEntry>*>> by_name;
  for (const auto& [key, entry] : by_key) by_name[entry.second.name].push_back(&entry);
  for (auto& [name, entries] : by_name) {
    std::sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
      return a->second.elem_offset < b->second.elem_offset;
    });
    const TableEntry& first = entries.front()->second;
    int64_t next = 0;
    for (const auto* entry : entries) {
      const TableEntry& e = entry->second;
      const bool piece = e.full_shape.has_value();
      if (piece != first.full_shape.has_value() || (piece && *e.full_shape != *first.full_shape) ||
          (!piece && entries.size() > 1) || e.dtype != first.dtype ||
          (piece && e.elem_offset != next)) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint ", dir, ": the shards' pieces of tensor ", name,
            " do not tile it (overlap, gap, or mismatched shape/dtype at element ", next, ")"));
      }
      if (piece) next += Numel(e.shape);
      nlohmann::json j = {{"name", e.name},   {"shard", entry->first}, {"dtype", e.dtype},
                          {"shape", e.shape}, {"bytes", e.bytes},      {"crc32", e.crc32}};
      j["offset"] = e.offset;  // byte offset in the shard: loaders read only what they keep
      if (piece) {
        j["full_shape"] = *e.full_shape;
        j["elem_offset"] = e.elem_offset;
        has_pieces = true;
      }
      tensors.push_back(std::move(j));
    }
    if (first.full_shape && next != Numel(*first.full_shape)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": the pieces of tensor ", name,
                                              " cover ", next, " of its ", Numel(*first.full_shape),
                                              " elements"));
    }
  }
  return absl::OkStatus();
}

absl::Status CommitManifest(const std::string& dir, const CheckpointState& state, int world,
                            SaveMode mode) {
  nlohmann::json shards = nlohmann::json::array();
  nlohmann::json tensors = nlohmann::json::array();
  std::map<std::string, std::pair<int, TableEntry>> by_name;
  int64_t total = 0;
  for (int r = 0; r < world; ++r) {
    const std::string path = (fs::path(dir) / ShardName(r, world)).string();
    if (!fs::exists(path)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint shard ", path, " is missing (rank ", r, " did not write it)"));
    }
    File f;
    ASSIGN_OR_RETURN(ShardInfo info, ReadShardTable(path, f));
    shards.push_back({{"file", ShardName(r, world)}, {"bytes", info.file_bytes}});
    total += info.file_bytes;
    for (auto& e : info.entries) {
      by_name[PieceKey(e.name, e.full_shape.has_value(), e.elem_offset)] = {r, e};
    }
  }
  bool has_pieces = false;
  if (mode == SaveMode::kOwned) {
    RETURN_IF_ERROR(ListOwnedTensors(dir, by_name, tensors, has_pieces));
  }
  for (const NamedTensor& nt : state.tensors) {
    if (mode == SaveMode::kOwned) break;
    auto it = by_name.find(nt.name);
    if (it == by_name.end()) {
      return absl::DataLossError(
          absl::StrCat("tensor ", nt.name, " is missing from every shard in ", dir));
    }
    const TableEntry& e = it->second.second;
    tensors.push_back({{"name", e.name},
                       {"shard", it->second.first},
                       {"dtype", e.dtype},
                       {"shape", e.shape},
                       {"bytes", e.bytes},
                       {"crc32", e.crc32},
                       {"offset", e.offset}});  // byte offset in the shard (LoadCheckpointShare)
  }
  nlohmann::json manifest = {
      {"format", "ulysses-checkpoint"},
      {"version", has_pieces ? kPieceManifestVersion : static_cast<int>(kVersion)},
      {"stage", state.stage},
      {"step_in_stage", state.step_in_stage},
      {"global_step", state.global_step},
      {"stage_complete", state.stage_complete},
      {"spec_hash", state.spec_hash},
      {"world", world},
      {"total_bytes", total},
      {"shards", shards},
      {"tensors", tensors},
      {"extra", state.extra}};
  if (!state.owner.job_id.empty()) {
    manifest["owner"] = {{"tenant", state.owner.tenant}, {"job", state.owner.job_id}};
  }
  return WriteFileAtomic((fs::path(dir) / kManifestName).string(), manifest.dump(1));
}

// Whether retention may remove the committed checkpoint in `path` on behalf of `state`'s owner.
bool MayPrune(const std::string& path, const CheckpointState& state) {
  if (state.owner.job_id.empty()) return true;
  absl::StatusOr<nlohmann::json> manifest = ReadManifest(path);
  if (!manifest.ok()) return false;  // Unreadable: nobody's to delete.
  absl::Status may = CheckCheckpointOwner(path, checkpoint_internal::ManifestOwner(*manifest),
                                          state.owner, state.adopt);
  if (!may.ok()) ULOG(WARNING) << "checkpoint retention keeps " << path << ": " << may.message();
  return may.ok();
}

void ApplyRetention(const std::string& root, int64_t keep_last, const CheckpointState& state) {
  keep_last = std::max<int64_t>(keep_last, 1);
  auto dirs = ListStepDirs(root);
  int64_t newest_committed = -1, committed_seen = 0;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const auto& [step, path, committed] = *it;
    bool remove = false;
    if (committed) {
      // Another job's checkpoint (the coordinator never gives its directory to this job
      // unless adopted; defence in depth) is neither counted nor removed.
      if (!MayPrune(path, state)) continue;
      if (newest_committed < 0) newest_committed = step;
      remove = ++committed_seen > keep_last;
    } else {
      remove = newest_committed >= 0 && step < newest_committed;
    }
    if (remove) {
      std::error_code ec;
      // Un-commit first so a crash mid-delete never leaves a half-deleted "committed" dir.
      fs::remove(fs::path(path) / kManifestName, ec);
      if (absl::Status removed = RemoveTree(path); !removed.ok())
        ULOG(WARNING) << "checkpoint retention: " << removed.message();
    }
  }
}

}  // namespace

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320; zlib's crc32). With zlib (the build
// links it where found) its crc32_z, which runs several bytes per cycle; without, eight bytes
// at a time ("slicing by 8": table k gives the CRC of a byte followed by k zero bytes). Both
// give the values of the byte-at-a-time definition; every save and load checksums every tensor
// byte (docs/BENCHMARKS.md "Checkpoint stall"). Little-endian loads; big-endian hosts without
// zlib take the byte loop.
uint32_t Crc32(const void* data, size_t size, uint32_t crc) {
#ifdef ULYSSES_HAVE_ZLIB
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), size));
#else
  static const auto kTables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    }
    return t;
  }();
  const auto& t = kTables;
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  for (; size >= 8; p += 8, size -= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
  }
#endif
  for (; size > 0; ++p, --size) crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return ~crc;
#endif
}

absl::Status CheckCheckpointOwner(const std::string& step_dir, const CheckpointOwner& written,
                                  const CheckpointOwner& me, bool adopt) {
  if (me.job_id.empty() || written.job_id.empty()) return absl::OkStatus();
  if (written.tenant == me.tenant) {
    if (written.job_id == me.job_id || adopt) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", step_dir, " was written by job ", written.job_id, ", this is job ",
        me.job_id, " (set ", spec::fields::PathOf(&spec::CheckpointSpec::adopt),
        ": true to resume from and prune your tenant's other job's checkpoints, or "
        "use an empty ",
        spec::fields::PathOf(&spec::CheckpointSpec::dir), ")"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("checkpoint ", step_dir, " was written by another tenant's job, this is job ",
                   me.job_id, " of tenant ", me.tenant,
                   " (it is neither resumed nor pruned: use an empty checkpoint.dir)"));
}

std::string StepDirName(int64_t global_step) { return absl::StrFormat("step-%08d", global_step); }

absl::StatusOr<std::string> SaveCheckpoint(const std::string& root, const CheckpointState& state,
                                           int rank, int world, int64_t keep_last,
                                           const std::function<absl::Status()>& barrier,
                                           SaveMode mode) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("SaveCheckpoint: rank ", rank, " not in [0, ", world, ")"));
  }
  const std::string dir = (fs::path(root) / StepDirName(state.global_step)).string();
  const std::string manifest = (fs::path(dir) / kManifestName).string();
  std::error_code ec;
  fs::create_directories(dir, ec);  // Every rank: the root may be shared or per node.
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create checkpoint dir ", dir, ": ", ec.message()));

  // 1. Rank 0 un-commits a previous save of the same step before anyone rewrites shards.
  absl::Status status;
  if (rank == 0 && fs::exists(manifest)) {
    if (std::remove(manifest.c_str()) != 0) status = ErrnoError("cannot remove", manifest);
    if (status.ok()) status = SyncDir(dir);
  }
  RETURN_IF_ERROR(Annotate(barrier(), "checkpoint barrier (before shards)"));

  // 2. Each rank writes its subset; the barrier is reached even on failure so that
  // rank 0 does not wait forever (it then finds the shard missing and does not commit).
  if (status.ok()) {
    absl::StatusOr<std::vector<const NamedTensor*>> mine =
        checkpoint_internal::TensorsOfRank(state, rank, world, mode);
    status = mine.status();
    const std::string shard = (fs::path(dir) / ShardName(rank, world)).string();
    if (status.ok()) {
      fs::remove(shard, ec);
      status = WriteShard(shard, *mine, rank, world);
    }
  }
  RETURN_IF_ERROR(Annotate(barrier(), "checkpoint barrier (after shards)"));

  // 3. Rank 0 commits: the manifest is the last file written. The failpoint (tests only,
  // off unless ULYSSES_FAILPOINT arms it; common/failpoint.h) blocks rank 0 here so a test
  // can kill the job with every shard on disk and no manifest.
  if (rank == 0 && status.ok()) {
    HangAtFailpoint("checkpoint.before_manifest", state.global_step);
    status = CommitManifest(dir, state, world, mode);
  }
  RETURN_IF_ERROR(Annotate(barrier(), "checkpoint barrier (after manifest)"));
  if (!status.ok()) return status;
  if (!fs::exists(manifest)) {
    return absl::InternalError(absl::StrCat("checkpoint ", dir, " was not committed by rank 0 (",
                                            manifest, " missing); see rank 0's log"));
  }
  if (rank == 0) checkpoint_internal::AfterCommit(root, dir, world, keep_last, state);
  return dir;
}

absl::StatusOr<std::string> LatestCommittedCheckpoint(const std::string& root) {
  auto dirs = ListStepDirs(root);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (std::get<2>(*it)) return std::get<1>(*it);
  }
  return absl::NotFoundError(absl::StrCat("no committed checkpoint under ", root));
}

absl::StatusOr<int64_t> CheckpointBytes(const std::string& step_dir) {
  ASSIGN_OR_RETURN(nlohmann::json manifest, ReadManifest(step_dir));
  return manifest.value("total_bytes", int64_t{0});
}

// LoadCheckpoint, ReadCheckpointInfo, LoadCheckpointShare: checkpoint_load.cc.

namespace checkpoint_internal {

CheckpointOwner ManifestOwner(const nlohmann::json& manifest) {
  CheckpointOwner owner;
  auto it = manifest.find("owner");
  if (it == manifest.end() || !it->is_object()) return owner;
  const nlohmann::json& o = *it;
  if (o.contains("tenant") && o["tenant"].is_string())
    owner.tenant = o["tenant"].get<std::string>();
  if (o.contains("job") && o["job"].is_string()) owner.job_id = o["job"].get<std::string>();
  return owner;
}

absl::StatusOr<nlohmann::json> ReadManifestJson(const std::string& step_dir) {
  return ReadManifest(step_dir);
}

absl::StatusOr<torch::ScalarType> DtypeFromString(const std::string& name) {
  return DtypeFromName(name);
}

std::string PieceKeyOf(const std::string& name, bool piece, int64_t elem_offset) {
  return PieceKey(name, piece, elem_offset);
}

absl::Status CheckShardPrefix(const std::string& path, const char* prefix) {
  if (std::memcmp(prefix, kMagic, 8) != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path,
                                            " has a bad magic (not a Ulysses checkpoint shard)"));
  }
  uint32_t version;
  std::memcpy(&version, prefix + 8, 4);
  if (version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint shard ", path,
                                                      " has format version ", version,
                                                      "; this build reads version ", kVersion));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, int64_t>> ShardTableOffsets(const std::string& path,
                                                                 int64_t* bytes_read) {
  File f;
  ASSIGN_OR_RETURN(ShardInfo info, ReadShardTable(path, f));
  std::map<std::string, int64_t> out;
  int64_t header = info.file_bytes;  // the header and table end where the first tensor starts
  for (const TableEntry& e : info.entries) {
    out[PieceKey(e.name, e.full_shape.has_value(), e.elem_offset)] = e.offset;
    header = std::min(header, e.offset);
  }
  if (bytes_read != nullptr) *bytes_read += header;
  return out;
}

// The building blocks an asynchronous save shares with SaveCheckpoint (save_parts.h).

absl::StatusOr<std::vector<const NamedTensor*>> TensorsOfRank(const CheckpointState& state,
                                                              int rank, int world, SaveMode mode) {
  std::set<std::string> names;
  std::vector<const NamedTensor*> mine;
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    const NamedTensor& nt = state.tensors[i];
    if (!names.insert(PieceKey(nt.name, nt.full_shape.has_value(), nt.offset)).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate checkpoint tensor name ", nt.name));
    }
    if (nt.full_shape && (nt.tensor.dim() != 1 || nt.offset < 0 ||
                          nt.offset + nt.tensor.numel() > Numel(*nt.full_shape))) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint piece ", nt.name, " at element ",
                                                     nt.offset, " is not a 1-D range inside ",
                                                     "its full shape"));
    }
    if (mode == SaveMode::kOwned || static_cast<int>(i % world) == rank) mine.push_back(&nt);
  }
  return mine;
}

std::string ShardFileName(int rank, int world) { return ShardName(rank, world); }

absl::Status WriteShardFile(const std::string& path, const std::vector<const NamedTensor*>& tensors,
                            int rank, int world) {
  return WriteShard(path, tensors, rank, world);
}

absl::Status WriteManifest(const std::string& dir, const CheckpointState& state, int world,
                           SaveMode mode) {
  return CommitManifest(dir, state, world, mode);
}

absl::Status SyncDirectory(const std::string& dir) { return SyncDir(dir); }

absl::Status WriteSmallFileAtomic(const std::string& path, const std::string& bytes) {
  return WriteFileAtomic(path, bytes);
}

void AfterCommit(const std::string& root, const std::string& dir, int world, int64_t keep_last,
                 const CheckpointState& state) {
  std::error_code ec;
  // Files of an earlier, uncommitted attempt with another world size are not in the manifest.
  auto entries = ListDirectory(dir);
  for (const DirEntry& entry : entries.ok() ? *entries : std::vector<DirEntry>{}) {
    const std::string& name = entry.name;
    if (name.rfind("shard-", 0) == 0 &&
        name.find(absl::StrCat("-of-", world, ".bin")) == std::string::npos) {
      fs::remove(fs::path(dir) / name, ec);
    }
  }
  ApplyRetention(root, keep_last, state);
}

}  // namespace checkpoint_internal

}  // namespace ulysses::engine
