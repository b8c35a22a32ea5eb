#include "worker/engine/data/indexed.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;

struct Mapped {
  const void* data = nullptr;
  size_t bytes = 0;
};

// Maps `path` read-only (an empty file maps to nullptr, 0 bytes).
absl::StatusOr<Mapped> MapFile(const std::string& path, const char* what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", what, " ", path, ": ",
                                            std::strerror(errno),
                                            " (build the dataset with `ulysses-train data pack`)"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  Mapped m;
  m.bytes = static_cast<size_t>(st.st_size);
  if (m.bytes > 0) {
    void* p = mmap(nullptr, m.bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(err)));
    }
    m.data = p;
  }
  close(fd);
  return m;
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian host (x86-64 / aarch64)
  return v;
}

constexpr char kRepack[] = "rebuild it with `ulysses-train data pack`";

}  // namespace

std::string IndexPath(const std::string& prefix) { return prefix + ".idx"; }
std::string TokensPath(const std::string& prefix) { return prefix + ".bin"; }
std::string MaskPath(const std::string& prefix) { return prefix + ".mask"; }

IndexedTokens::~IndexedTokens() {
  for (const Mapping* m : {&idx_map_, &bin_map_, &mask_map_}) {
    if (m->bytes > 0) munmap(const_cast<void*>(m->data), m->bytes);
  }
}

absl::StatusOr<std::unique_ptr<IndexedTokens>> OpenIndexed(const std::string& prefix) {
  std::unique_ptr<IndexedTokens> t(new IndexedTokens());
  t->prefix_ = prefix;
  const std::string idx = IndexPath(prefix), bin = TokensPath(prefix);
  ASSIGN_OR_RETURN(Mapped im, MapFile(idx, "dataset index"));
  t->idx_map_ = {im.data, im.bytes};
  const auto* h = static_cast<const uint8_t*>(im.data);
  if (im.bytes < static_cast<size_t>(kIndexHeaderBytes)) {
    return absl::DataLossError(absl::StrCat("dataset index ", idx, ": truncated index: ", im.bytes,
                                            " bytes, shorter than the ", kIndexHeaderBytes,
                                            "-byte header; ", kRepack));
  }
  if (std::memcmp(h, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset index ", idx,
                     ": magic is not \"ULYSIDX\" (not an index written by `ulysses-train data "
                     "pack`; a flat uint32 token file goes in ",
                     spec::fields::PathOf(&spec::DataSpec::train), " with format: flat)"));
  }
  const uint32_t version = Load<uint32_t>(h + 8), dtype = Load<uint32_t>(h + 12),
                 flags = Load<uint32_t>(h + 16);
  if (version != kIndexVersion) {
    return absl::InvalidArgumentError(absl::StrCat("dataset index ", idx, ": version ", version,
                                                   " is not supported (this engine reads ",
                                                   kIndexVersion, "); ", kRepack));
  }
  if (dtype != kDtypeUint32 && dtype != kDtypeUint16) {
    return absl::InvalidArgumentError(absl::StrCat("dataset index ", idx, ": token dtype ", dtype,
                                                   " is not 2 (uint16) or 4 (uint32); ", kRepack));
  }
  t->dtype_ = dtype;
  const uint64_t docs = Load<uint64_t>(h + 24), tokens = Load<uint64_t>(h + 32);
  if (docs < 1 || docs > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("dataset index ", idx, ": document count ", docs,
                                                   " is not in [1, 2^40]; ", kRepack));
  }
  const uint64_t want = kIndexHeaderBytes + 8 * (docs + 1);
  if (im.bytes != want) {
    return absl::DataLossError(absl::StrCat(
        "dataset index ", idx, ": ", im.bytes < want ? "truncated index: " : "trailing bytes: ",
        im.bytes, " bytes, but ", docs, " documents need ", want, "; ", kRepack));
  }
  t->offsets_ = reinterpret_cast<const uint64_t*>(h + kIndexHeaderBytes);  // 8-aligned: 40 % 8
  if (t->offsets_[0] != 0) {
    return absl::DataLossError(absl::StrCat("dataset index ", idx, ": offsets[0] is ",
                                            t->offsets_[0], ", must be 0; ", kRepack));
  }
  for (uint64_t d = 0; d < docs; ++d) {
    if (t->offsets_[d + 1] <= t->offsets_[d]) {
      return absl::DataLossError(absl::StrCat(
          "dataset index ", idx, ": document ", d, ": offsets not increasing (offsets[", d,
          "] = ", t->offsets_[d], ", offsets[", d + 1, "] = ", t->offsets_[d + 1],
          "; every document needs >= 1 token); ", kRepack));
    }
    if (t->offsets_[d + 1] > tokens) {
      return absl::DataLossError(
          absl::StrCat("dataset index ", idx, ": document ", d, ": offset out of range (offsets[",
                       d + 1, "] = ", t->offsets_[d + 1], " > ", tokens, " tokens); ", kRepack));
    }
  }
  if (t->offsets_[docs] != tokens) {
    return absl::DataLossError(absl::StrCat("dataset index ", idx, ": the last offset ",
                                            t->offsets_[docs], " != the token count ", tokens, "; ",
                                            kRepack));
  }
  t->num_docs_ = static_cast<int64_t>(docs);
  t->num_tokens_ = static_cast<int64_t>(tokens);
  ASSIGN_OR_RETURN(Mapped bm, MapFile(bin, "dataset tokens"));
  t->bin_map_ = {bm.data, bm.bytes};
  if (bm.bytes != tokens * dtype) {
    return absl::DataLossError(absl::StrCat("dataset tokens ", bin, ": ", bm.bytes,
                                            " bytes, but the index ", idx, " lists ", tokens,
                                            " tokens of ", dtype, " bytes (", tokens * dtype,
                                            "): the files do not belong together; ", kRepack));
  }
  t->tokens_ = static_cast<const uint8_t*>(bm.data);
  if (flags & kFlagHasMask) {
    const std::string mask = MaskPath(prefix);
    ASSIGN_OR_RETURN(Mapped mm, MapFile(mask, "dataset loss mask"));
    t->mask_map_ = {mm.data, mm.bytes};
    if (mm.bytes != tokens) {
      return absl::DataLossError(absl::StrCat(
          "dataset loss mask ", mask, ": mask length mismatch: ", mm.bytes,
          " bytes, but the index lists ", tokens, " tokens (one 0/1 byte per token); ", kRepack));
    }
    t->mask_ = static_cast<const uint8_t*>(mm.data);
  } else if (fs::exists(MaskPath(prefix))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset ", prefix, ": ", MaskPath(prefix),
        " exists but the index says there is no mask (flags bit 0 unset); remove the stray file "
        "or ",
        kRepack));
  }
  return t;
}

absl::Status IndexedTokens::Read(int64_t doc, int64_t begin, int64_t n, int64_t vocab_size,
                                 int64_t* tokens, bool* mask) const {
  if (doc < 0 || doc >= num_docs_ || begin < 0 || n < 0 || begin + n > DocLength(doc)) {
    return absl::OutOfRangeError(absl::StrCat("dataset ", prefix_, ": read of document ", doc,
                                              " tokens [", begin, ", ", begin + n,
                                              ") is out of range"));
  }
  const int64_t at = DocBegin(doc) + begin;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = dtype_ == kDtypeUint32
                           ? static_cast<int64_t>(Load<uint32_t>(tokens_ + 4 * (at + i)))
                           : static_cast<int64_t>(Load<uint16_t>(tokens_ + 2 * (at + i)));
    if (vocab_size > 0 && id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset tokens ", TokensPath(prefix_), ": document ", doc, " token ",
                       begin + i, ": id ", id, " >= vocab_size ", vocab_size,
                       " (the data was tokenized for a larger vocabulary: fix ",
                       spec::fields::ShapePathOf("vocab_size"), " or re-tokenize)"));
    }
    tokens[i] = id;
    const uint8_t m = mask_ ? mask_[at + i] : 1;
    if (m > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset loss mask ", MaskPath(prefix_), ": document ", doc, " token ",
                       begin + i, ": byte ", int{m}, " is not 0 or 1; ", kRepack));
    }
    mask[i] = m == 1;
  }
  return absl::OkStatus();
}

// ---- writing ----

absl::StatusOr<std::unique_ptr<IndexWriter>> IndexWriter::Create(const std::string& prefix) {
  if (prefix.empty()) return absl::InvalidArgumentError("--out: empty dataset prefix");
  const fs::path parent = fs::path(prefix).parent_path();
  if (!parent.empty() && !fs::is_directory(parent)) {
    return absl::NotFoundError(absl::StrCat("--out ", prefix, ": directory ", parent.string(),
                                            " does not exist (create it first)"));
  }
  for (const std::string& p : {IndexPath(prefix), TokensPath(prefix), MaskPath(prefix)}) {
    if (fs::exists(p)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "--out ", prefix, ": ", p, " already exists (remove it or pick another prefix)"));
    }
  }
  std::unique_ptr<IndexWriter> w(new IndexWriter(prefix));
  w->idx_.open(IndexPath(prefix) + ".tmp", std::ios::binary | std::ios::trunc);
  w->bin_.open(TokensPath(prefix) + ".tmp", std::ios::binary | std::ios::trunc);
  w->mask_.open(MaskPath(prefix) + ".tmp", std::ios::binary | std::ios::trunc);
  if (!w->idx_ || !w->bin_ || !w->mask_) {
    return absl::PermissionDeniedError(
        absl::StrCat("--out ", prefix, ": cannot create ", prefix, ".*.tmp (check permissions)"));
  }
  char header[kIndexHeaderBytes] = {};
  w->idx_.write(header, sizeof(header));  // patched by Finish()
  const uint64_t zero = 0;
  w->idx_.write(reinterpret_cast<const char*>(&zero), 8);  // offsets[0]
  return w;
}

IndexWriter::~IndexWriter() {
  if (!finished_) RemoveTemporaries();
}

void IndexWriter::RemoveTemporaries() {
  idx_.close();
  bin_.close();
  mask_.close();
  std::error_code ec;
  for (const std::string& p : {IndexPath(prefix_), TokensPath(prefix_), MaskPath(prefix_)}) {
    fs::remove(p + ".tmp", ec);
  }
}

absl::Status IndexWriter::Add(const std::vector<uint32_t>& tokens,
                              const std::vector<uint8_t>& mask) {
  if (tokens.empty()) return absl::InvalidArgumentError("a document needs at least one token");
  if (!mask.empty() && mask.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mask has ", mask.size(), " entries but ids has ", tokens.size(), " (one 0/1 per id)"));
  }
  bin_.write(reinterpret_cast<const char*>(tokens.data()),
             static_cast<std::streamsize>(4 * tokens.size()));
  if (mask.empty()) {
    const std::vector<char> ones(tokens.size(), 1);
    mask_.write(ones.data(), static_cast<std::streamsize>(ones.size()));
  } else {
    for (uint8_t m : mask) any_masked_ = any_masked_ || m == 0;
    mask_.write(reinterpret_cast<const char*>(mask.data()),
                static_cast<std::streamsize>(mask.size()));
  }
  num_tokens_ += static_cast<int64_t>(tokens.size());
  ++num_docs_;
  const uint64_t end = static_cast<uint64_t>(num_tokens_);
  idx_.write(reinterpret_cast<const char*>(&end), 8);
  if (!idx_ || !bin_ || !mask_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--out ", prefix_, ": write failed (disk full?)"));
  }
  return absl::OkStatus();
}

absl::Status IndexWriter::Finish() {
  if (num_docs_ == 0) {
    RemoveTemporaries();
    return absl::InvalidArgumentError("no documents in the input: nothing to pack");
  }
  char header[kIndexHeaderBytes] = {};
  std::memcpy(header, kIndexMagic, 8);
  const uint32_t version = kIndexVersion, dtype = kDtypeUint32,
                 flags = any_masked_ ? kFlagHasMask : 0;
  const uint64_t docs = num_docs_, tokens = num_tokens_;
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &dtype, 4);
  std::memcpy(header + 16, &flags, 4);
  std::memcpy(header + 24, &docs, 8);
  std::memcpy(header + 32, &tokens, 8);
  idx_.seekp(0);
  idx_.write(header, sizeof(header));
  idx_.close();
  bin_.close();
  mask_.close();
  if (idx_.fail() || bin_.fail() || mask_.fail()) {
    RemoveTemporaries();
    return absl::ResourceExhaustedError(
        absl::StrCat("--out ", prefix_, ": write failed (disk full?)"));
  }
  std::error_code ec;
  if (!any_masked_) fs::remove(MaskPath(prefix_) + ".tmp", ec);
  fs::rename(TokensPath(prefix_) + ".tmp", TokensPath(prefix_), ec);
  if (!ec && any_masked_) fs::rename(MaskPath(prefix_) + ".tmp", MaskPath(prefix_), ec);
  if (!ec) fs::rename(IndexPath(prefix_) + ".tmp", IndexPath(prefix_), ec);  // index last
  if (ec) {
    RemoveTemporaries();
    return absl::InternalError(absl::StrCat("--out ", prefix_, ": rename: ", ec.message()));
  }
  finished_ = true;
  return absl::OkStatus();
}

namespace {

// Reads a JSON array of integers at `field` of line `line_no`; errors name all three.
absl::Status ReadIds(const nlohmann::json& doc, const char* field, const std::string& where,
                     int64_t max_exclusive, const char* fix, std::vector<uint32_t>* out) {
  const nlohmann::json& a = doc[field];
  if (!a.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field \"", field, "\" is ",
                                                   a.type_name(), ", not a list (", fix, ")"));
  }
  out->clear();
  out->reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json& v = a[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= max_exclusive) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": field \"", field, "\"[", i,
                                                     "] = ", v.dump(), " is not an integer in [0, ",
                                                     max_exclusive, ") (", fix, ")"));
    }
    out->push_back(static_cast<uint32_t>(v.get<int64_t>()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PackStats> PackJsonl(const std::string& jsonl, const std::string& prefix,
                                    int64_t vocab_size) {
  std::ifstream in(jsonl);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--jsonl ", jsonl, ": cannot open: ", std::strerror(errno)));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<IndexWriter> w, IndexWriter::Create(prefix));
  const int64_t id_bound = vocab_size > 0 ? vocab_size : (int64_t{1} << 32);
  const std::string id_fix = vocab_size > 0
                                 ? absl::StrCat("ids must be < --vocab-size ", vocab_size)
                                 : std::string("ids are uint32 token ids");
  PackStats stats;
  std::string line;
  std::vector<uint32_t> ids, mask32;
  std::vector<uint8_t> mask;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    stats.bytes_read += static_cast<int64_t>(line.size()) + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(jsonl, " line ", line_no);
    nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": not a JSON object (write one document per line: {\"ids\": [1, 2, 3]})"));
    }
    if (!doc.contains("ids")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field \"ids\" is missing (write {\"ids\": [1, 2, 3]})"));
    }
    RETURN_IF_ERROR(ReadIds(doc, "ids", where, id_bound, id_fix.c_str(), &ids));
    if (ids.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": field \"ids\" is empty (drop the line; a document needs >= 1 "
                       "token)"));
    }
    mask.clear();
    if (doc.contains("mask") && !doc["mask"].is_null()) {
      RETURN_IF_ERROR(
          ReadIds(doc, "mask", where, 2, "mask entries are 0 (no loss) or 1 (loss)", &mask32));
      if (mask32.size() != ids.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": field \"mask\" has ", mask32.size(), " entries but \"ids\" has ", ids.size(),
            " (mask length mismatch: give one 0/1 per id, or leave \"mask\" out)"));
      }
      mask.assign(mask32.begin(), mask32.end());
      stats.has_mask = true;
    }
    RETURN_IF_ERROR(w->Add(ids, mask));
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("--jsonl ", jsonl, ": read error"));
  }
  RETURN_IF_ERROR(w->Finish());
  stats.documents = w->num_docs();
  stats.tokens = w->num_tokens();
  return stats;
}

absl::StatusOr<PackStats> PackFlat(const std::string& flat, const std::string& prefix,
                                   int64_t doc_len, int64_t eos, int64_t vocab_size) {
  if ((doc_len > 0) == (eos >= 0)) {
    return absl::InvalidArgumentError(
        "data pack --from-flat: give exactly one of --doc-len N (fixed-length documents) or "
        "--eos ID (a document ends after each ID)");
  }
  std::ifstream in(flat, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--from-flat ", flat, ": cannot open: ", std::strerror(errno)));
  }
  std::error_code ec;
  const auto bytes = fs::file_size(flat, ec);
  if (ec || bytes % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from-flat ", flat, ": ", ec ? ec.message() : std::to_string(bytes),
                     " bytes is not a multiple of 4 (expected flat little-endian uint32 tokens)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<IndexWriter> w, IndexWriter::Create(prefix));
  PackStats stats;
  std::vector<uint32_t> chunk(1 << 16), doc;
  int64_t position = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(4 * chunk.size()));
    const int64_t got = in.gcount() / 4;
    stats.bytes_read += in.gcount();
    for (int64_t i = 0; i < got; ++i, ++position) {
      const uint32_t t = chunk[i];
      if (vocab_size > 0 && static_cast<int64_t>(t) >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--from-flat ", flat, ": token ", position, " (document ", w->num_docs(), "): id ", t,
            " >= --vocab-size ", vocab_size, " (re-tokenize, or raise --vocab-size)"));
      }
      doc.push_back(t);
      if ((eos >= 0 && t == static_cast<uint32_t>(eos)) ||
          (doc_len > 0 && static_cast<int64_t>(doc.size()) == doc_len)) {
        RETURN_IF_ERROR(w->Add(doc, {}));
        doc.clear();
      }
    }
  }
  if (!doc.empty()) RETURN_IF_ERROR(w->Add(doc, {}));
  RETURN_IF_ERROR(w->Finish());
  stats.documents = w->num_docs();
  stats.tokens = w->num_tokens();
  return stats;
}

}  // namespace ulysses::engine
