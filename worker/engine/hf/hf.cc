#include "worker/engine/hf/hf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/file_tree.h"
#include "common/spec/init_from.h"
#include "common/status.h"
#include "worker/engine/model/torch_dtype.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> SafetensorsDtype(torch::ScalarType t) {
  const DtypeInfo* d = DtypeOf(t);
  if (d == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", c10::toString(t), " has no safetensors equivalent"));
  }
  return std::string(d->safetensors);
}

// HF's torch_dtype names of the dtypes a directory can be written in.
absl::StatusOr<std::string> HfDtypeName(torch::ScalarType t) {
  const DtypeInfo* d = DtypeOf(t);
  if (d == nullptr || !d->weight) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", c10::toString(t), " is not a weight dtype (", WeightDtypeList(), ")"));
  }
  return std::string(d->name);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::Status WriteAtomically(const std::string& path,
                             const std::function<absl::Status(std::ofstream&)>& body) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::InternalError(absl::StrCat("cannot create ", tmp));
    RETURN_IF_ERROR(body(out));
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// config.json: the shape keys (family, head_dim, rope_scaling) from the one shape writer, plus
// what transformers' configs want to know about the rest of the architecture.
absl::Status WriteHfConfig(const std::string& dir, const spec::ModelShape& model,
                           const std::string& dtype_name) {
  // architectures, model_type and the family's keys come with the shape.
  nlohmann::json config = spec::ModelShapeToJson(model);
  config.update({
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"initializer_range", 0.02},
      {"pretraining_tp", 1},
      {"use_cache", true},
      {"torch_dtype", dtype_name},
      {"max_position_embeddings", 131072},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  });
  const std::string text = config.dump(2) + "\n";
  return WriteAtomically((fs::path(dir) / "config.json").string(), [&](std::ofstream& out) {
    out << text;
    return absl::OkStatus();
  });
}

}  // namespace

std::map<std::string, std::vector<int64_t>> HfLlamaShapes(const spec::ModelShape& m) {
  const int64_t h = m.hidden_size, d = m.HeadDim(), hq = m.num_attention_heads;
  const int64_t hkv = m.num_key_value_heads > 0 ? m.num_key_value_heads : hq;
  std::map<std::string, std::vector<int64_t>> shapes;
  shapes["model.embed_tokens.weight"] = {m.vocab_size, h};
  shapes["model.norm.weight"] = {h};
  if (!m.tie_word_embeddings) shapes["lm_head.weight"] = {m.vocab_size, h};
  for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    shapes[p + "self_attn.q_proj.weight"] = {hq * d, h};
    shapes[p + "self_attn.k_proj.weight"] = {hkv * d, h};
    shapes[p + "self_attn.v_proj.weight"] = {hkv * d, h};
    shapes[p + "self_attn.o_proj.weight"] = {h, hq * d};
    shapes[p + "mlp.gate_proj.weight"] = {m.intermediate_size, h};
    shapes[p + "mlp.up_proj.weight"] = {m.intermediate_size, h};
    shapes[p + "mlp.down_proj.weight"] = {h, m.intermediate_size};
    shapes[p + "input_layernorm.weight"] = {h};
    shapes[p + "post_attention_layernorm.weight"] = {h};
  }
  return shapes;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  int64_t offset = 0;
  for (const NamedTensor& nt : tensors) {
    if (header.contains(nt.name)) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", nt.name));
    }
    torch::Tensor t = nt.tensor.detach().to(torch::kCPU).contiguous();
    ASSIGN_OR_RETURN(std::string dtype, SafetensorsDtype(t.scalar_type()));
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    header[nt.name] = {
        {"dtype", dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  return WriteAtomically(path, [&](std::ofstream& out) {
    const uint64_t len = text.size();  // little-endian host
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const torch::Tensor& t : data) {
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<NamedTensor>> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open safetensors file ", path));
  in.seekg(0, std::ios::end);
  const int64_t file_bytes = in.tellg();
  in.seekg(0);
  uint64_t header_len = 0;
  if (file_bytes < 8 || !in.read(reinterpret_cast<char*>(&header_len), 8) ||
      header_len > static_cast<uint64_t>(file_bytes - 8)) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file ", path, " is truncated or not safetensors (header length ",
                     header_len, ", file ", file_bytes, " bytes)"));
  }
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file ", path, ": header is not a JSON object"));
  }
  const int64_t data_begin = 8 + static_cast<int64_t>(header_len);
  const int64_t data_bytes = file_bytes - data_begin;
  std::vector<NamedTensor> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const auto& entry = it.value();
    auto fail = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors file ", path, ": tensor ", name, ": ", what));
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return fail("entry needs dtype, shape and data_offsets");
    }
    std::vector<int64_t> shape, offsets;
    std::string dtype;
    try {
      dtype = entry["dtype"].get<std::string>();
      shape = entry["shape"].get<std::vector<int64_t>>();
      offsets = entry["data_offsets"].get<std::vector<int64_t>>();
    } catch (const nlohmann::json::exception& e) {
      return fail(absl::StrCat("malformed entry: ", e.what()));
    }
    const DtypeInfo* type = FindSafetensorsDtype(dtype);
    if (type == nullptr) return fail(absl::StrCat("unsupported dtype ", dtype));
    if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0] ||
        offsets[1] > data_bytes) {
      return fail(absl::StrCat("data_offsets ", ShapeString(offsets), " outside the ", data_bytes,
                               "-byte data section (truncated file?)"));
    }
    // The bytes the shape needs, checked against data_offsets before anything is allocated:
    // a header is input, and a shape of [2^40, 2^40] must be an error, not an allocation.
    int64_t bytes = type->bytes;
    for (int64_t d : shape) {
      if (d < 0) return fail(absl::StrCat("negative dimension in shape ", ShapeString(shape)));
      if (__builtin_mul_overflow(bytes, d, &bytes)) {
        return fail(absl::StrCat("shape ", ShapeString(shape), " with dtype ", dtype,
                                 " needs more than 2^63 bytes"));
      }
    }
    if (bytes != offsets[1] - offsets[0]) {
      return fail(absl::StrCat("shape ", ShapeString(shape), " with dtype ", dtype, " needs ",
                               bytes, " bytes but data_offsets span ", offsets[1] - offsets[0]));
    }
    torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(TorchType(*type)));
    in.seekg(data_begin + offsets[0]);
    if (!in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()))) {
      return fail("read failed (truncated file?)");
    }
    out.push_back({name, t});
  }
  return out;
}

namespace {

// The safetensors files of an HF directory: those model.safetensors.index.json names (each must
// exist), else every *.safetensors, sorted.
absl::StatusOr<std::vector<std::string>> HfWeightFiles(const std::string& dir) {
  std::vector<std::string> files;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(index_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadText(index_path));
    nlohmann::json index = nlohmann::json::parse(text, nullptr, false);
    if (index.is_discarded() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": no weight_map object"));
    }
    std::set<std::string> unique;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map[", name, "] is not a file name in ", dir));
      }
      const std::string path = (fs::path(dir) / file.get<std::string>()).string();
      if (!fs::exists(path)) {
        return absl::NotFoundError(absl::StrCat(
            index_path, ": weight_map[", name, "] names ", file.get<std::string>(),
            ", which is not in ", dir, " (copy the complete checkpoint, or fix the index)"));
      }
      unique.insert(file.get<std::string>());
    }
    for (const auto& f : unique) files.push_back((fs::path(dir) / f).string());
  } else {
    // ListDirectory, not fs::directory_iterator: see common/file_tree.h. Entries of any type
    // count (a hub cache snapshot holds symlinks to blobs).
    auto entries = ListDirectory(dir);
    if (!entries.ok())
      return absl::NotFoundError(
          absl::StrCat("cannot list HF directory ", dir, ": ", entries.status().message()));
    for (const DirEntry& entry : *entries) {  // Sorted by name.
      if (absl::EndsWith(entry.name, ".safetensors") && entry.name != ".safetensors")
        files.push_back((fs::path(dir) / entry.name).string());
    }
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("no *.safetensors files in ", dir));
  }
  return files;
}

}  // namespace

absl::StatusOr<std::vector<NamedTensor>> LoadHfWeights(const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(dir));
  std::map<std::string, torch::Tensor> by_name;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors, ReadSafetensors(file));
    for (NamedTensor& nt : tensors) {
      const auto st = nt.tensor.scalar_type();
      if (const DtypeInfo* d = DtypeOf(st); d == nullptr || !d->weight) {
        return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", nt.name, " has dtype ",
                                                       c10::toString(st), "; weights must be ",
                                                       WeightDtypeList(/*safetensors=*/true)));
      }
      if (by_name.count(nt.name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", nt.name, " appears in more than one file of ", dir));
      }
      by_name[nt.name] = nt.tensor.to(torch::kFloat32).contiguous();
    }
  }
  std::vector<NamedTensor> out;
  for (auto& [name, t] : by_name) out.push_back({name, t});
  return out;
}

namespace {

// One tensor of a safetensors file: where its bytes are.
struct StoredTensor {
  std::string file;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // absolute byte offset in the file
  int64_t bytes = 0;
};

// The header of one safetensors file (its bytes added to *header_bytes); every entry checked to lie
// inside the file, whose size is taken from a stat.
absl::Status ReadSafetensorsHeader(const std::string& path,
                                   std::map<std::string, StoredTensor>& out,
                                   int64_t* header_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open safetensors file ", path));
  struct stat st;
  uint64_t header_len = 0;
  const bool sized = fstat(fd, &st) == 0 && st.st_size >= 8 && pread(fd, &header_len, 8, 0) == 8 &&
                     header_len <= static_cast<uint64_t>(st.st_size - 8);
  std::string text(sized ? header_len : 0, '\0');
  const bool read =
      sized && pread(fd, text.data(), header_len, 8) == static_cast<ssize_t>(header_len);
  close(fd);
  if (!read) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file ", path, " is truncated or not safetensors (header length ",
                     header_len, "); copy it again"));
  }
  *header_bytes += 8 + static_cast<int64_t>(header_len);
  nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file ", path, ": header is not a JSON object"));
  }
  const int64_t data_begin = 8 + static_cast<int64_t>(header_len);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    auto fail = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors file ", path, ": tensor ", name, ": ", what));
    };
    StoredTensor t;
    t.file = path;
    std::vector<int64_t> offsets;
    std::string dtype;
    try {
      dtype = it.value().at("dtype").get<std::string>();
      t.shape = it.value().at("shape").get<std::vector<int64_t>>();
      offsets = it.value().at("data_offsets").get<std::vector<int64_t>>();
    } catch (const nlohmann::json::exception& e) {
      return fail(absl::StrCat("malformed entry: ", e.what()));
    }
    const DtypeInfo* type = FindSafetensorsDtype(dtype);
    if (type == nullptr) return fail(absl::StrCat("unsupported dtype ", dtype));
    t.dtype = TorchType(*type);
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return fail(absl::StrCat("negative dimension in shape ", ShapeString(t.shape)));
      numel *= d;
    }
    if (offsets.size() != 2 || offsets[0] < 0 ||
        offsets[1] - offsets[0] != numel * static_cast<int64_t>(c10::elementSize(t.dtype)) ||
        data_begin + offsets[1] > st.st_size) {
      return fail(absl::StrCat("data_offsets ", ShapeString(offsets), " do not hold shape ",
                               ShapeString(t.shape), " ", dtype, " inside the ", st.st_size,
                               "-byte file (truncated? copy it again)"));
    }
    t.begin = data_begin + offsets[0];
    t.bytes = offsets[1] - offsets[0];
    if (!out.emplace(name, t).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, " appears in ", path, " and ", out[name].file));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<NamedTensor>> LoadHfWeightsShare(const std::string& dir,
                                                            const ShareRequest& request,
                                                            LoadStats* stats) {
  std::vector<NamedTensor> out;
  RETURN_IF_ERROR(ForEachHfWeightShare(
      dir, request,
      [&](NamedTensor nt) {
        out.push_back(std::move(nt));
        return absl::OkStatus();
      },
      stats));
  return out;
}

absl::Status CheckHfTensorsConsumed(const std::string& dir,
                                    const std::vector<std::string>& model_names) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(dir));
  std::map<std::string, StoredTensor> stored;
  int64_t header_bytes = 0;
  for (const std::string& file : files) {
    RETURN_IF_ERROR(ReadSafetensorsHeader(file, stored, &header_bytes));
  }
  const std::set<std::string> wanted(model_names.begin(), model_names.end());
  std::vector<std::string> unexpected, missing;
  for (const auto& [name, t] : stored) {
    if (wanted.count(name)) continue;
    const bool hf_buffer = absl::EndsWith(name, ".rotary_emb.inv_freq");
    const bool tied_head = name == "lm_head.weight";  // Not a parameter: tied to the embedding.
    if (!hf_buffer && !tied_head) unexpected.push_back(absl::StrCat(name, " (", t.file, ")"));
  }
  for (const std::string& name : wanted) {
    if (!stored.count(name)) missing.push_back(name);
  }
  constexpr size_t kListed = 8;
  auto listed = [&](std::vector<std::string> names) {
    const size_t more = names.size() > kListed ? names.size() - kListed : 0;
    names.resize(std::min(names.size(), kListed));
    return absl::StrCat(absl::StrJoin(names, ", "),
                        more ? absl::StrCat(" and ", more, " more") : "");
  };
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from ", dir, ": ", unexpected.size(),
        " tensor(s) the model has no place for: ", listed(unexpected),
        " (a checkpoint of another family or shape: check config.json's architectures and the "
        "spec's model fields; nothing is dropped silently)"));
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("init_from ", dir, ": ", missing.size(),
                                                   " tensor(s) missing: ", listed(missing),
                                                   " (is it a checkpoint of this shape?)"));
  }
  return absl::OkStatus();
}

absl::Status ForEachHfWeightShare(const std::string& dir, const ShareRequest& request,
                                  const std::function<absl::Status(NamedTensor)>& sink,
                                  LoadStats* stats) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(dir));
  LoadStats read;
  std::map<std::string, StoredTensor> stored;
  for (const std::string& file : files) {
    RETURN_IF_ERROR(ReadSafetensorsHeader(file, stored, &read.metadata_bytes));
  }
  // Everything requested is present, a weight dtype and of the model's shape before any read.
  for (const auto& [name, want] : request) {
    auto it = stored.find(name);
    if (it == stored.end()) {
      return absl::InvalidArgumentError(absl::StrCat("init_from ", dir, ": tensor ", name,
                                                     " is missing (is it a Llama checkpoint of "
                                                     "this shape?)"));
    }
    const StoredTensor& t = it->second;
    const auto st = t.dtype;
    if (st != torch::kFloat32 && st != torch::kFloat16 && st != torch::kBFloat16 &&
        st != torch::kFloat64) {
      return absl::InvalidArgumentError(absl::StrCat(t.file, ": tensor ", name, " has dtype ",
                                                     c10::toString(st),
                                                     "; weights must be F32, F16, BF16 or F64"));
    }
    if (t.shape != want.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          t.file, ": tensor ", name, " has shape ", ShapeString(t.shape), " but the model needs ",
          ShapeString(want.shape), " (model shape in the spec does not match)"));
    }
  }
  for (const auto& [name, want] : request) {
    const StoredTensor& t = stored.at(name);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const int64_t begin = want.end < 0 ? 0 : want.begin, end = want.end < 0 ? numel : want.end;
    if (begin < 0 || begin > end || end > numel) {
      return absl::InvalidArgumentError(absl::StrCat("LoadHfWeightsShare: range [", begin, ", ",
                                                     end, ") of tensor ", name, " is outside its ",
                                                     numel, " elements"));
    }
    const int64_t esize = static_cast<int64_t>(c10::elementSize(t.dtype));
    torch::Tensor raw = torch::empty({end - begin}, torch::TensorOptions().dtype(t.dtype));
    const int fd = open(t.file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open safetensors file ", t.file));
    char* p = static_cast<char*>(raw.data_ptr());
    int64_t left = (end - begin) * esize, at = t.begin + begin * esize;
    while (left > 0) {
      const ssize_t n = pread(fd, p, static_cast<size_t>(left), at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fd);
        return absl::DataLossError(absl::StrCat("safetensors file ", t.file, ": tensor ", name,
                                                ": read failed at byte ", at,
                                                " (truncated? copy it again)"));
      }
      p += n;
      left -= n;
      at += n;
    }
    close(fd);
    read.data_bytes += (end - begin) * esize;
    NamedTensor nt;
    nt.name = name;
    nt.tensor = raw.to(torch::kFloat32);  // per tensor: the kept range only
    if (want.end < 0) {
      nt.tensor = nt.tensor.view(t.shape);  // [n] -> the tensor's shape
    } else {
      nt.full_shape = t.shape;
      nt.offset = begin;
    }
    if (stats != nullptr) *stats = read;
    RETURN_IF_ERROR(sink(std::move(nt)));
  }
  if (stats != nullptr) *stats = read;
  return absl::OkStatus();
}

std::string HfConfigPath(const std::string& dir) { return spec::HfConfigPath(dir); }

absl::StatusOr<spec::ModelShape> ReadHfConfig(const std::string& dir) {
  return spec::ReadHfConfig(dir);  // The one reader (common/spec/init_from.h).
}

absl::Status WriteHfDirectory(const std::string& dir, const spec::ModelShape& model,
                              const std::vector<NamedTensor>& weights, torch::ScalarType dtype) {
  ASSIGN_OR_RETURN(const std::string dtype_name, HfDtypeName(dtype));
  const auto expected = HfLlamaShapes(model);
  std::set<std::string> seen;
  std::vector<NamedTensor> converted;
  for (const NamedTensor& nt : weights) {
    auto it = expected.find(nt.name);
    if (it == expected.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", nt.name, " is not a parameter of this Llama config",
          model.tie_word_embeddings && nt.name == "lm_head.weight" ? " (embeddings are tied)"
                                                                   : ""));
    }
    if (nt.tensor.sizes().vec() != it->second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", nt.name, " has shape ",
                                                     ShapeString(nt.tensor.sizes().vec()),
                                                     ", expected ", ShapeString(it->second)));
    }
    if (!nt.tensor.is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", nt.name, " has dtype ",
                                                     c10::toString(nt.tensor.scalar_type()),
                                                     ", expected a floating-point type"));
    }
    seen.insert(nt.name);
    torch::Tensor source = nt.tensor.detach().to(torch::kCPU);
    torch::Tensor out = source.to(dtype);
    // Narrowing must not turn a finite weight into inf (float16 tops out at 65504).
    if (!out.isfinite().equal(source.isfinite())) {
      const double largest = source.masked_select(source.isfinite()).abs().max().item<double>();
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", nt.name, " has a value of magnitude ", largest, " that ",
                       dtype_name, " cannot hold (export as bfloat16 or float32)"));
    }
    converted.push_back({nt.name, out});
  }
  for (const auto& [name, shape] : expected) {
    if (!seen.count(name))
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is missing"));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / "model.safetensors").string(), converted,
                                   {{"format", "pt"}}));
  return WriteHfConfig(dir, model, dtype_name);
}

absl::StatusOr<HfWriteResult> WriteHfDirectoryStreaming(const std::string& dir,
                                                        const spec::ModelShape& model,
                                                        const HfTensorSource& fetch,
                                                        torch::ScalarType dtype,
                                                        int64_t max_file_bytes) {
  ASSIGN_OR_RETURN(const std::string dtype_name, HfDtypeName(dtype));
  if (max_file_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_file_bytes: ", max_file_bytes, " must be >= 1"));
  }
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
  // Files in name order, each filled up to max_file_bytes (a larger tensor gets a file alone).
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> files(1);
  int64_t in_file = 0;
  for (const auto& [name, shape] : HfLlamaShapes(model)) {
    int64_t bytes = esize;
    for (int64_t d : shape) bytes *= d;
    if (!files.back().empty() && in_file + bytes > max_file_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back({name, shape});
    in_file += bytes;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  ASSIGN_OR_RETURN(const std::string st_dtype, SafetensorsDtype(dtype));
  HfWriteResult result;
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string file =
        files.size() == 1 ? std::string("model.safetensors")
                          : absl::StrFormat("model-%05d-of-%05d.safetensors", f + 1, files.size());
    nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
    int64_t offset = 0;
    for (const auto& [name, shape] : files[f]) {
      int64_t bytes = esize;
      for (int64_t d : shape) bytes *= d;
      header[name] = {
          {"dtype", st_dtype}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
      weight_map[name] = file;
    }
    total += offset;
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
    // The header goes first (every offset is known); then each tensor is fetched, checked,
    // converted, written and dropped before the next.
    RETURN_IF_ERROR(WriteAtomically((fs::path(dir) / file).string(), [&](std::ofstream& out) {
      const uint64_t len = text.size();  // little-endian host
      out.write(reinterpret_cast<const char*>(&len), 8);
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      for (const auto& [name, shape] : files[f]) {
        ASSIGN_OR_RETURN(torch::Tensor source, fetch(name));
        if (source.sizes().vec() != shape) {
          return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape ",
                                                         ShapeString(source.sizes().vec()),
                                                         ", expected ", ShapeString(shape)));
        }
        if (!source.is_floating_point()) {
          return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has dtype ",
                                                         c10::toString(source.scalar_type()),
                                                         ", expected a floating-point type"));
        }
        source = source.detach().to(torch::kCPU);
        torch::Tensor converted = source.to(dtype).contiguous();
        if (!converted.isfinite().equal(source.isfinite())) {
          const double largest = source.masked_select(source.isfinite()).abs().max().item<double>();
          return absl::InvalidArgumentError(
              absl::StrCat("tensor ", name, " has a value of magnitude ", largest, " that ",
                           dtype_name, " cannot hold (export as bfloat16 or float32)"));
        }
        out.write(static_cast<const char*>(converted.data_ptr()),
                  static_cast<std::streamsize>(converted.nbytes()));
        result.largest_tensor_bytes =
            std::max(result.largest_tensor_bytes, static_cast<int64_t>(converted.nbytes()));
        ++result.tensors;
      }
      return absl::OkStatus();
    }));
    result.files.push_back(file);
  }
  if (files.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    RETURN_IF_ERROR(WriteAtomically((fs::path(dir) / "model.safetensors.index.json").string(),
                                    [&](std::ofstream& out) {
                                      out << text;
                                      return absl::OkStatus();
                                    }));
  }
  RETURN_IF_ERROR(WriteHfConfig(dir, model, dtype_name));
  return result;
}

}  // namespace ulysses::engine
