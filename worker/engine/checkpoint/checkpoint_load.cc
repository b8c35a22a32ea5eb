// The read side of checkpoint.h: the manifest, then only the byte ranges a rank keeps.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_internal.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;
namespace ci = checkpoint_internal;

// A straddling piece is streamed through a buffer of at most this many bytes.
constexpr int64_t kStreamBlockBytes = int64_t{4} << 20;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// One manifest entry: a whole tensor, or the flat elements [begin, end) of one.
struct Entry {
  std::string name;
  int shard = 0;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> full_shape;  // the whole tensor's shape
  bool piece = false;
  int64_t begin = 0, end = 0;  // flat elements of the whole tensor
  int64_t offset = -1;         // byte offset in the shard (-1: not in the manifest)
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// The manifest, checked: shards present with their recorded sizes, entries inside them, pieces
// tiling every name. Names keep the manifest's order.
struct Layout {
  std::vector<std::string> shard_paths;
  std::vector<int64_t> shard_bytes;
  std::vector<std::string> order;
  std::map<std::string, std::vector<Entry>> by_name;  // sorted by begin
};

absl::Status ParseState(const nlohmann::json& manifest, const std::string& step_dir,
                        const std::string& expected_spec_hash, CheckpointState& state) {
  try {
    state.stage = manifest.at("stage").get<int64_t>();
    state.step_in_stage = manifest.at("step_in_stage").get<int64_t>();
    state.global_step = manifest.at("global_step").get<int64_t>();
    state.stage_complete = manifest.at("stage_complete").get<bool>();
    state.spec_hash = manifest.at("spec_hash").get<std::string>();
    state.extra = manifest.value("extra", nlohmann::json::object());
    state.owner = ci::ManifestOwner(manifest);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest in ", step_dir, " is malformed: ", e.what()));
  }
  if (!expected_spec_hash.empty() && state.spec_hash != expected_spec_hash) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", step_dir, " was written for spec hash ", state.spec_hash, ", this job is ",
        expected_spec_hash, "; use a fresh checkpoint dir or the original spec"));
  }
  return absl::OkStatus();
}

// The manifest's shards (into layout) and tensor entries, each checked against its shard and
// its byte size.
absl::Status ParseEntries(const nlohmann::json& manifest, const std::string& where,
                          const std::string& step_dir, Layout& layout,
                          std::vector<Entry>& entries) {
  try {
    for (const auto& shard : manifest.at("shards")) {
      const std::string file = shard.at("file").get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
        return absl::DataLossError(absl::StrCat("checkpoint manifest ", where,
                                                " names shard file '", file,
                                                "', which is not a file name inside the step dir"));
      }
      layout.shard_paths.push_back((fs::path(step_dir) / file).string());
      layout.shard_bytes.push_back(shard.at("bytes").get<int64_t>());
    }
    for (const auto& t : manifest.at("tensors")) {
      Entry e;
      e.name = t.at("name").get<std::string>();
      e.shard = t.at("shard").get<int>();
      ASSIGN_OR_RETURN(e.dtype, ci::DtypeFromString(t.at("dtype").get<std::string>()));
      const auto shape = t.at("shape").get<std::vector<int64_t>>();
      e.piece = t.contains("full_shape");
      e.full_shape = e.piece ? t.at("full_shape").get<std::vector<int64_t>>() : shape;
      e.begin = e.piece ? t.at("elem_offset").get<int64_t>() : 0;
      e.end = e.begin + Numel(shape);
      e.offset = t.value("offset", int64_t{-1});
      e.bytes = t.at("bytes").get<int64_t>();
      e.crc32 = t.at("crc32").get<uint32_t>();
      if (e.shard < 0 || e.shard >= static_cast<int>(layout.shard_paths.size())) {
        return absl::DataLossError(absl::StrCat("checkpoint manifest ", where, ": tensor ", e.name,
                                                " names shard ", e.shard, " of ",
                                                layout.shard_paths.size()));
      }
      if (e.bytes != (e.end - e.begin) * static_cast<int64_t>(c10::elementSize(e.dtype))) {
        return absl::DataLossError(absl::StrCat("checkpoint manifest ", where, ": tensor ", e.name,
                                                " has ", e.bytes, " bytes, its shape ",
                                                ShapeText(shape), " needs another size"));
      }
      entries.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", where, " is malformed: ", e.what()));
  }
  return absl::OkStatus();
}

// Every shard present with the size the manifest records.
absl::Status CheckShardSizes(const Layout& layout, const std::vector<Entry>& entries) {
  // Every shard present with the size the manifest records (a stat: no byte is read).
  for (size_t r = 0; r < layout.shard_paths.size(); ++r) {
    const std::string& path = layout.shard_paths[r];
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return absl::DataLossError(absl::StrCat("checkpoint shard ", path, " is missing"));
    }
    if (st.st_size != layout.shard_bytes[r]) {
      // The first tensor whose bytes the file no longer holds (offsets of older manifests are
      // only in the shard's table: then the shard alone is named).
      const Entry* cut = nullptr;
      for (const Entry& e : entries) {
        if (e.shard != static_cast<int>(r) || e.offset < 0 || e.offset + e.bytes <= st.st_size) {
          continue;
        }
        if (cut == nullptr || e.offset < cut->offset) cut = &e;
      }
      return absl::DataLossError(absl::StrCat(
          "checkpoint shard ", path, " has ", st.st_size, " bytes, the manifest says ",
          layout.shard_bytes[r],
          cut != nullptr ? absl::StrCat(": tensor ", cut->name, " (bytes [", cut->offset, ", ",
                                        cut->offset + cut->bytes, ")) is cut")
                         : "",
          " (truncated or replaced; resume from an older step dir or remove this one)"));
    }
  }
  return absl::OkStatus();
}

// Entries without an offset (older manifests) take it from their shard's table.
absl::Status FillOffsets(const std::string& step_dir, const Layout& layout,
                         std::vector<Entry>& entries, LoadStats& stats) {
  // Manifests of older builds do not record offsets: take them from the shards' tables.
  std::map<int, std::map<std::string, int64_t>> tables;
  for (Entry& e : entries) {
    if (e.offset >= 0) continue;
    auto it = tables.find(e.shard);
    if (it == tables.end()) {
      ASSIGN_OR_RETURN(auto offsets,
                       ci::ShardTableOffsets(layout.shard_paths[e.shard], &stats.metadata_bytes));
      it = tables.emplace(e.shard, std::move(offsets)).first;
    }
    auto found = it->second.find(ci::PieceKeyOf(e.name, e.piece, e.begin));
    if (found == it->second.end()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": tensor ", e.name,
                                              " listed in the manifest is not in shard ",
                                              layout.shard_paths[e.shard]));
    }
    e.offset = found->second;
  }
  return absl::OkStatus();
}

// Each entry within its shard's bytes, grouped by name in manifest order.
absl::Status IndexEntries(std::vector<Entry>& entries, Layout& layout) {
  for (Entry& e : entries) {
    if (e.offset < ci::kShardPrefixBytes || e.offset + e.bytes > layout.shard_bytes[e.shard]) {
      return absl::DataLossError(absl::StrCat("checkpoint shard ", layout.shard_paths[e.shard],
                                              " is truncated: tensor ", e.name, " needs bytes [",
                                              e.offset, ", ", e.offset + e.bytes, ") of a ",
                                              layout.shard_bytes[e.shard], "-byte file"));
    }
    auto [it, fresh] = layout.by_name.try_emplace(e.name);
    if (fresh) layout.order.push_back(e.name);
    it->second.push_back(std::move(e));
  }
  return absl::OkStatus();
}

// The pieces of every name tile it.
absl::Status CheckTiling(const std::string& where, Layout& layout) {
  // The pieces of every name tile it: one whole entry, or pieces [0, n) without gap or overlap.
  for (auto& [name, list] : layout.by_name) {
    std::sort(list.begin(), list.end(),
              [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
    const Entry& first = list.front();
    int64_t next = 0;
    for (const Entry& e : list) {
      if (e.piece != first.piece || (!e.piece && list.size() > 1) ||
          e.full_shape != first.full_shape || e.dtype != first.dtype || e.begin != next) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", where, ": the pieces of tensor ", name,
                         " do not tile it (overlap, gap, ", "or mismatched shape/dtype at element ",
                         next, ", in ", layout.shard_paths[e.shard],
                         "); the checkpoint is damaged: resume from an older step dir"));
      }
      next = e.end;
    }
    if (next != Numel(first.full_shape)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", where, ": the pieces of tensor ", name, " cover ", next,
                       " of its ", Numel(first.full_shape),
                       " elements; the checkpoint is damaged: resume from an older ", "step dir"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Layout> ParseLayout(const nlohmann::json& manifest, const std::string& step_dir,
                                   LoadStats& stats) {
  Layout layout;
  const std::string where = (fs::path(step_dir) / kManifestName).string();
  std::vector<Entry> entries;
  RETURN_IF_ERROR(ParseEntries(manifest, where, step_dir, layout, entries));
  RETURN_IF_ERROR(CheckShardSizes(layout, entries));
  RETURN_IF_ERROR(FillOffsets(step_dir, layout, entries, stats));
  RETURN_IF_ERROR(IndexEntries(entries, layout));
  RETURN_IF_ERROR(CheckTiling(where, layout));
  return layout;
}

// pread of exactly `size` bytes at `offset`.
absl::Status ReadAt(int fd, const std::string& path, void* data, int64_t size, int64_t offset) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = pread(fd, p, static_cast<size_t>(size), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("checkpoint shard ", path,
                                              " is truncated (unexpected end of file at byte ",
                                              offset, ")"));
    }
    p += n;
    size -= n;
    offset += n;
  }
  return absl::OkStatus();
}

// Shard files opened on first use; each one's header is checked once.
class Shards {
 public:
  Shards(const Layout& layout, LoadStats& stats) : layout_(layout), stats_(stats) {
    fds_.assign(layout.shard_paths.size(), -1);
  }
  ~Shards() {
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  Shards(const Shards&) = delete;
  Shards& operator=(const Shards&) = delete;

  absl::StatusOr<int> Fd(int shard) {
    if (fds_[shard] >= 0) return fds_[shard];
    const std::string& path = layout_.shard_paths[shard];
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
    }
    fds_[shard] = fd;
    std::array<char, ci::kShardPrefixBytes> prefix;
    RETURN_IF_ERROR(ReadAt(fd, path, prefix.data(), ci::kShardPrefixBytes, 0));
    stats_.metadata_bytes += ci::kShardPrefixBytes;
    RETURN_IF_ERROR(ci::CheckShardPrefix(path, prefix.data()));
    return fd;
  }

 private:
  const Layout& layout_;
  LoadStats& stats_;
  std::vector<int> fds_;
};

// Copies the elements [begin, end) of entry `e`'s tensor that fall in [want_begin, want_end) into
// `out` (the flat kept range, which starts at want_begin), verifying the entry's CRC over all of
// its bytes. Reads straight into `out` when the entry lies inside the kept range.
absl::Status ReadEntry(const Entry& e, const std::string& path, int fd, int64_t want_begin,
                       int64_t want_end, char* out, LoadStats& stats) {
  const int64_t esize = static_cast<int64_t>(c10::elementSize(e.dtype));
  uint32_t crc = 0;
  if (e.begin >= want_begin && e.end <= want_end) {
    char* dst = out + (e.begin - want_begin) * esize;
    RETURN_IF_ERROR(ReadAt(fd, path, dst, e.bytes, e.offset));
    stats.data_bytes += e.bytes;
    crc = Crc32(dst, static_cast<size_t>(e.bytes));
  } else {
    const int64_t block_elems = std::max<int64_t>(1, kStreamBlockBytes / esize);
    std::vector<char> buffer(static_cast<size_t>(std::min(e.end - e.begin, block_elems) * esize));
    for (int64_t b = e.begin; b < e.end; b += block_elems) {
      const int64_t n = std::min(block_elems, e.end - b);
      RETURN_IF_ERROR(ReadAt(fd, path, buffer.data(), n * esize, e.offset + (b - e.begin) * esize));
      stats.data_bytes += n * esize;
      crc = Crc32(buffer.data(), static_cast<size_t>(n * esize), crc);
      const int64_t lo = std::max(b, want_begin), hi = std::min(b + n, want_end);
      if (lo < hi) {
        std::memcpy(out + (lo - want_begin) * esize, buffer.data() + (lo - b) * esize,
                    static_cast<size_t>((hi - lo) * esize));
      }
    }
  }
  if (crc != e.crc32) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path,
                                            ": crc32 mismatch in tensor ", e.name,
                                            " (corrupted data; resume from an older step dir)"));
  }
  return absl::OkStatus();
}

}  // namespace

struct CheckpointReader::Impl {
  std::string step_dir;
  CheckpointState info;
  Layout layout;
  LoadStats stats;
  std::vector<std::pair<std::string, CheckpointReader::TensorInfo>> tensors;
  std::unique_ptr<Shards> shards;
};

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& step_dir, const std::string& expected_spec_hash) {
  auto impl = std::make_unique<Impl>();
  impl->step_dir = step_dir;
  ASSIGN_OR_RETURN(nlohmann::json manifest, ci::ReadManifestJson(step_dir));
  {
    std::error_code ec;
    const auto size = fs::file_size(fs::path(step_dir) / kManifestName, ec);
    if (!ec) impl->stats.metadata_bytes += static_cast<int64_t>(size);
  }
  RETURN_IF_ERROR(ParseState(manifest, step_dir, expected_spec_hash, impl->info));
  ASSIGN_OR_RETURN(impl->layout, ParseLayout(manifest, step_dir, impl->stats));
  for (const std::string& name : impl->layout.order) {
    const Entry& first = impl->layout.by_name.at(name).front();
    impl->tensors.push_back({name, TensorInfo{first.dtype, first.full_shape}});
  }
  impl->shards = std::make_unique<Shards>(impl->layout, impl->stats);
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(impl)));
}

const CheckpointState& CheckpointReader::info() const { return impl_->info; }

const std::vector<std::pair<std::string, CheckpointReader::TensorInfo>>& CheckpointReader::tensors()
    const {
  return impl_->tensors;
}

const LoadStats& CheckpointReader::stats() const { return impl_->stats; }

absl::Status CheckpointReader::Check(const ShareRequest& request) const {
  const Layout& layout = impl_->layout;
  for (const auto& [name, want] : request) {
    auto it = layout.by_name.find(name);
    if (it == layout.by_name.end()) continue;
    const Entry& first = it->second.front();
    const int64_t n = Numel(first.full_shape);
    if (want.shape != first.full_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", impl_->step_dir, ": tensor ", name, " is ", ShapeText(first.full_shape),
          " in ", layout.shard_paths[first.shard], ", the model needs ", ShapeText(want.shape),
          "; resume with the model shape that wrote it (its extra.model_config) or use a fresh "
          "checkpoint dir"));
    }
    const int64_t end = want.end < 0 ? n : want.end;
    if (want.begin < 0 || want.begin > end || end > n) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint read: range [", want.begin, ", ",
                                                     end, ") of tensor ", name, " is outside its ",
                                                     n, " elements"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<NamedTensor> CheckpointReader::Read(const std::string& name,
                                                   const TensorShare& share) {
  auto it = impl_->layout.by_name.find(name);
  if (it == impl_->layout.by_name.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", impl_->step_dir, " has no tensor ", name));
  }
  TensorShare want = share;
  if (want.shape.empty() && want.end < 0) want.shape = it->second.front().full_shape;
  RETURN_IF_ERROR(Check({{name, want}}));
  const std::vector<Entry>& entries = it->second;
  const Entry& first = entries.front();
  const bool whole = want.end < 0;
  const int64_t begin = whole ? 0 : want.begin;
  const int64_t end = whole ? Numel(first.full_shape) : want.end;
  NamedTensor nt;
  nt.name = name;
  nt.tensor = torch::empty({end - begin}, torch::TensorOptions().dtype(first.dtype));  // [kept]
  for (const Entry& e : entries) {
    if (e.end <= begin || e.begin >= end) continue;  // no overlap: never read
    ASSIGN_OR_RETURN(int fd, impl_->shards->Fd(e.shard));
    RETURN_IF_ERROR(ReadEntry(e, impl_->layout.shard_paths[e.shard], fd, begin, end,
                              static_cast<char*>(nt.tensor.data_ptr()), impl_->stats));
  }
  if (whole) {
    nt.tensor = nt.tensor.view(first.full_shape);  // [n] -> the tensor's shape
  } else {
    nt.full_shape = first.full_shape;
    nt.offset = begin;
  }
  return nt;
}

absl::StatusOr<CheckpointState> ReadCheckpointInfo(const std::string& step_dir,
                                                   const std::string& expected_spec_hash) {
  ASSIGN_OR_RETURN(nlohmann::json manifest, ci::ReadManifestJson(step_dir));
  CheckpointState state;
  RETURN_IF_ERROR(ParseState(manifest, step_dir, expected_spec_hash, state));
  return state;
}

absl::StatusOr<CheckpointState> LoadCheckpointShare(const std::string& step_dir,
                                                    const std::string& expected_spec_hash,
                                                    const ShareRequest& request,
                                                    LoadStats* stats_out) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                   CheckpointReader::Open(step_dir, expected_spec_hash));
  // Every request is checked against the checkpoint before any tensor byte is read.
  RETURN_IF_ERROR(reader->Check(request));
  CheckpointState state = reader->info();
  for (const auto& [name, info] : reader->tensors()) {
    auto want = request.find(name);
    if (want == request.end()) continue;
    ASSIGN_OR_RETURN(NamedTensor nt, reader->Read(name, want->second));
    state.tensors.push_back(std::move(nt));
  }
  if (stats_out != nullptr) *stats_out = reader->stats();
  return state;
}

absl::StatusOr<CheckpointState> LoadCheckpoint(const std::string& step_dir,
                                               const std::string& expected_spec_hash) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                   CheckpointReader::Open(step_dir, expected_spec_hash));
  CheckpointState state = reader->info();
  for (const auto& [name, info] : reader->tensors()) {
    ASSIGN_OR_RETURN(NamedTensor nt, reader->Read(name, TensorShare{info.shape}));
    state.tensors.push_back(std::move(nt));
  }
  return state;
}

}  // namespace ulysses::engine
