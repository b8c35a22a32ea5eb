#include "worker/engine/hf/hf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_tree.h"
#include "common/status.h"

namespace ulysses::engine {
namespace {

namespace fs = std::filesystem;

const std::map<std::string, torch::ScalarType>& SafetensorsTypes() {
  static const auto* kTypes = new std::map<std::string, torch::ScalarType>{
      {"F32", torch::kFloat32},   {"F64", torch::kFloat64}, {"F16", torch::kFloat16},
      {"BF16", torch::kBFloat16}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
      {"I16", torch::kInt16},     {"I8", torch::kInt8},     {"U8", torch::kUInt8},
      {"BOOL", torch::kBool}};
  return *kTypes;
}

absl::StatusOr<std::string> SafetensorsDtype(torch::ScalarType t) {
  for (const auto& [name, type] : SafetensorsTypes()) {
    if (type == t) return name;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", c10::toString(t), " has no safetensors equivalent"));
}

// HF's torch_dtype names of the dtypes a directory can be written in.
absl::StatusOr<std::string> HfDtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return std::string("float32");
    case torch::kBFloat16:
      return std::string("bfloat16");
    case torch::kFloat16:
      return std::string("float16");
    case torch::kFloat64:
      return std::string("float64");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(t),
                       " is not a weight dtype (float32, bfloat16, float16 or "
                       "float64)"));
  }
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

}  // namespace

std::map<std::string, std::vector<int64_t>> HfLlamaShapes(const spec::ModelShape& m) {
  const int64_t h = m.hidden_size, d = m.head_dim(), hq = m.num_attention_heads;
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
    auto type = SafetensorsTypes().find(dtype);
    if (type == SafetensorsTypes().end()) return fail(absl::StrCat("unsupported dtype ", dtype));
    if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0] ||
        offsets[1] > data_bytes) {
      return fail(absl::StrCat("data_offsets ", ShapeString(offsets), " outside the ", data_bytes,
                               "-byte data section (truncated file?)"));
    }
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0) return fail(absl::StrCat("negative dimension in shape ", ShapeString(shape)));
      numel *= d;
    }
    torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(type->second));
    if (static_cast<int64_t>(t.nbytes()) != offsets[1] - offsets[0]) {
      return fail(absl::StrCat("shape ", ShapeString(shape), " with dtype ", dtype, " needs ",
                               t.nbytes(), " bytes but data_offsets span ",
                               offsets[1] - offsets[0]));
    }
    in.seekg(data_begin + offsets[0]);
    if (!in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()))) {
      return fail("read failed (truncated file?)");
    }
    out.push_back({name, t});
  }
  return out;
}

absl::StatusOr<std::vector<NamedTensor>> LoadHfWeights(const std::string& dir) {
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
      if (!file.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map[", name, "] is not a file name"));
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
  std::map<std::string, torch::Tensor> by_name;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors, ReadSafetensors(file));
    for (NamedTensor& nt : tensors) {
      const auto st = nt.tensor.scalar_type();
      if (st != torch::kFloat32 && st != torch::kFloat16 && st != torch::kBFloat16 &&
          st != torch::kFloat64) {
        return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", nt.name, " has dtype ",
                                                       c10::toString(st),
                                                       "; weights must be F32, F16, BF16 or F64"));
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

std::string HfConfigPath(const std::string& dir) {
  return (fs::path(dir) / "config.json").string();
}

absl::StatusOr<spec::ModelShape> ReadHfConfig(const std::string& dir) {
  const std::string path = HfConfigPath(dir);
  ASSIGN_OR_RETURN(std::string text, ReadText(path));
  nlohmann::json c = nlohmann::json::parse(text, nullptr, false);
  if (c.is_discarded() || !c.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  }
  // What the shape does not say but the math depends on: refused unless it is ours.
  auto unsupported = [&](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", key, ": ", c[key].dump(), " is not supported (", why, ")"));
  };
  if (c.contains("hidden_act") && c["hidden_act"] != "silu") {
    return unsupported("hidden_act", "the engine's Llama MLP is SwiGLU: silu");
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (c.contains(bias) && !c[bias].is_null() && c[bias] != false) {
      return unsupported(bias, "the engine's Llama projections have no bias");
    }
  }
  // The shape itself (with rope_scaling and head_dim) is read by the one shape reader.
  return spec::ModelShapeFromJson(c, path);
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
  // The shape keys (with head_dim and rope_scaling) from the one shape writer, plus what
  // transformers' LlamaConfig wants to know about the rest of the architecture.
  nlohmann::json config = spec::ModelShapeToJson(model);
  config.update({
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"attention_bias", false},
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
  RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / "model.safetensors").string(), converted,
                                   {{"format", "pt"}}));
  const std::string text = config.dump(2) + "\n";
  return WriteAtomically((fs::path(dir) / "config.json").string(), [&](std::ofstream& out) {
    out << text;
    return absl::OkStatus();
  });
}

}  // namespace ulysses::engine
