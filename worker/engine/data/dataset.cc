#include "worker/engine/data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"
#include "worker/engine/data/packing.h"

namespace ulysses::engine {
namespace {

// splitmix64: a tiny, well-mixed, platform-independent generator; all data
// randomness goes through it so samples do not depend on libtorch's RNG.
uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix64(state_++ * 0x2545f4914f6cdd1dULL + 0x632be59bd9b4e019ULL); }
  // Uniform in [0, n), n > 0 (rejection sampling, no modulo bias).
  int64_t Uniform(int64_t n) {
    const uint64_t un = static_cast<uint64_t>(n);
    const uint64_t limit = UINT64_MAX - UINT64_MAX % un;
    uint64_t r;
    do r = Next();
    while (r >= limit);
    return static_cast<int64_t>(r % un);
  }

 private:
  uint64_t state_;
};

uint64_t StreamSeed(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b) {
  return Mix64(Mix64(Mix64(seed ^ Mix64(tag)) ^ a) ^ (b * 0x9e3779b97f4a7c15ULL));
}

// A bijection on [0, n) chosen by `key`: a 4-round Feistel network on the
// smallest even-bit power-of-two domain >= n, with cycle walking. O(1) memory.
int64_t PermuteIndex(int64_t i, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 2;
  while ((int64_t{1} << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = static_cast<uint64_t>(i);
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = Mix64(key ^ Mix64(right + (round << 56))) & mask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

uint64_t SplitTag(Split split) { return split == Split::kTrain ? 0x7472616eULL : 0x76616cULL; }

absl::Status CheckSeqLen(int64_t seq_len) {
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len must be >= 1, got ", seq_len));
  }
  return absl::OkStatus();
}

class FileTokenDataset final : public TokenDataset {
 public:
  FileTokenDataset(std::string path, Split split, int64_t vocab_size, uint64_t seed,
                   const uint32_t* data, int64_t num_tokens, size_t map_bytes)
      : path_(std::move(path)),
        split_(split),
        vocab_size_(vocab_size),
        seed_(seed),
        data_(data),
        num_tokens_(num_tokens),
        map_bytes_(map_bytes) {}
  ~FileTokenDataset() override {
    if (map_bytes_ > 0) munmap(const_cast<uint32_t*>(data_), map_bytes_);
  }
  FileTokenDataset(const FileTokenDataset&) = delete;
  FileTokenDataset& operator=(const FileTokenDataset&) = delete;

  int64_t NumSequences(int64_t seq_len) const override {
    if (seq_len < 1) return 0;
    return split_ == Split::kTrain ? (num_tokens_ - 1) / seq_len : num_tokens_ / seq_len;
  }

  absl::StatusOr<Sample> Get(int64_t index, int64_t seq_len) const override {
    RETURN_IF_ERROR(CheckSeqLen(seq_len));
    if (index < 0) return absl::InvalidArgumentError(absl::StrCat("negative index ", index));
    const int64_t count = NumSequences(seq_len);
    if (count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file ", path_, " has ", num_tokens_, " tokens, too short for one ",
                       split_ == Split::kTrain ? "training" : "validation", " sequence of ",
                       seq_len, " tokens (needs ", split_ == Split::kTrain ? seq_len + 1 : seq_len,
                       "); use a shorter seq_len or more data"));
    }
    int64_t window;
    if (split_ == Split::kTrain) {
      window = EpochWindow(index, count, seed_, static_cast<uint64_t>(seq_len));
    } else {
      if (index >= count) {
        return absl::OutOfRangeError(absl::StrCat("validation index ", index, " >= ", count,
                                                  " windows of ", seq_len, " tokens in ", path_));
      }
      window = index;
    }
    const int64_t begin = window * seq_len;
    const int64_t available = std::min<int64_t>(seq_len + 1, num_tokens_ - begin);
    torch::Tensor tokens = torch::zeros({seq_len + 1}, torch::kInt64);
    int64_t* out = tokens.data_ptr<int64_t>();
    for (int64_t i = 0; i < available; ++i) {
      const uint32_t token = data_[begin + i];  // little-endian host (x86-64 / aarch64)
      if (vocab_size_ > 0 && static_cast<int64_t>(token) >= vocab_size_) {
        return absl::InvalidArgumentError(
            absl::StrCat("token file ", path_, ": token ", token, " at byte offset ",
                         (begin + i) * 4, " is >= vocab_size ", vocab_size_,
                         "; the file was tokenized for a larger vocabulary (fix ",
                         spec::fields::ShapePathOf("vocab_size"), " or the data)"));
      }
      out[i] = token;
    }
    Sample sample;
    sample.tokens = tokens;
    if (available < seq_len + 1) {  // Only the last validation window: final target missing.
      sample.target_mask = torch::ones({seq_len}, torch::kBool);
      sample.target_mask.slice(0, available - 1).fill_(false);
    }
    return sample;
  }

 private:
  const std::string path_;
  const Split split_;
  const int64_t vocab_size_;
  const uint64_t seed_;
  const uint32_t* const data_;
  const int64_t num_tokens_;
  const size_t map_bytes_;
};

class RandomDataset final : public TokenDataset {
 public:
  RandomDataset(Split split, int64_t vocab_size, uint64_t seed, int64_t validation_sequences)
      : split_(split), vocab_size_(vocab_size), seed_(seed), validation_(validation_sequences) {}

  int64_t NumSequences(int64_t seq_len) const override {
    return split_ == Split::kTrain ? -1 : validation_;
  }

  absl::StatusOr<Sample> Get(int64_t index, int64_t seq_len) const override {
    RETURN_IF_ERROR(CheckSeqLen(seq_len));
    if (index < 0 || (split_ == Split::kValidation && index >= validation_)) {
      return absl::OutOfRangeError(absl::StrCat("synthetic index ", index, " out of range"));
    }
    Rng rng(StreamSeed(seed_, SplitTag(split_), static_cast<uint64_t>(index),
                       static_cast<uint64_t>(seq_len)));
    Sample sample;
    sample.tokens = torch::empty({seq_len + 1}, torch::kInt64);
    int64_t* out = sample.tokens.data_ptr<int64_t>();
    for (int64_t i = 0; i <= seq_len; ++i) out[i] = rng.Uniform(vocab_size_);
    return sample;
  }

 private:
  const Split split_;
  const int64_t vocab_size_;
  const uint64_t seed_;
  const int64_t validation_;
};

class NeedleDataset final : public TokenDataset {
 public:
  static constexpr int64_t kBlock = 3;  // KEY k v  /  QUERY k v

  NeedleDataset(Split split, int64_t vocab_size, uint64_t seed, int64_t validation_sequences)
      : split_(split),
        vocab_size_(vocab_size),
        seed_(seed),
        validation_(validation_sequences),
        layout_(NeedleLayout::For(vocab_size)) {}

  int64_t NumSequences(int64_t seq_len) const override {
    return split_ == Split::kTrain ? -1 : validation_;
  }

  absl::StatusOr<Sample> Get(int64_t index, int64_t seq_len) const override {
    if (seq_len < NeedleVocab::kMinSeqLen) {
      return absl::InvalidArgumentError(absl::StrCat(
          "needle task needs seq_len >= ", NeedleVocab::kMinSeqLen, ", got ", seq_len));
    }
    if (index < 0 || (split_ == Split::kValidation && index >= validation_)) {
      return absl::OutOfRangeError(absl::StrCat("synthetic index ", index, " out of range"));
    }
    const int64_t num_needles = layout_.NeedlesFor(seq_len);
    const int64_t total = seq_len + 1;
    const int64_t query_begin = total - num_needles * kBlock;
    const int64_t filler = query_begin - 1 - num_needles * kBlock;  // after BOS
    Rng rng(StreamSeed(seed_, 0x6e65656400ULL ^ SplitTag(split_), static_cast<uint64_t>(index),
                       static_cast<uint64_t>(seq_len)));

    // Which keys this sequence plants (all of them once seq_len allows) and the value
    // each one holds, drawn uniformly from that key's own value range.
    std::vector<int64_t> keys(layout_.num_keys);
    for (int64_t k = 0; k < layout_.num_keys; ++k) keys[k] = k;
    for (int64_t i = 0; i < num_needles; ++i) {  // partial Fisher-Yates: random subset, order
      std::swap(keys[i], keys[i + rng.Uniform(layout_.num_keys - i)]);
    }
    keys.resize(num_needles);
    std::vector<int64_t> values(num_needles);
    for (int64_t n = 0; n < num_needles; ++n) {
      values[n] = layout_.ValueBegin(keys[n]) + rng.Uniform(layout_.values_per_key);
    }

    Sample sample;
    sample.tokens = torch::empty({total}, torch::kInt64);
    int64_t* out = sample.tokens.data_ptr<int64_t>();
    out[0] = NeedleVocab::kBos;
    for (int64_t i = 1; i < query_begin; ++i) {
      out[i] = layout_.filler_begin + rng.Uniform(vocab_size_ - layout_.filler_begin);
    }
    // Random depths: num_needles sorted cut points split the filler into gaps.
    std::vector<int64_t> cuts(num_needles);
    for (auto& c : cuts) c = rng.Uniform(filler + 1);
    std::sort(cuts.begin(), cuts.end());
    auto write_block = [&](int64_t at, int64_t marker, int64_t needle) {
      out[at] = marker;
      out[at + 1] = layout_.key_begin + keys[needle];
      out[at + 2] = values[needle];
    };
    for (int64_t n = 0; n < num_needles; ++n) {
      write_block(1 + cuts[n] + n * kBlock, NeedleVocab::kKey, n);
    }
    // Queries at the end: every planted key once, in an order independent of the depths.
    std::vector<int64_t> order(num_needles);
    for (int64_t n = 0; n < num_needles; ++n) order[n] = n;
    for (int64_t q = 0; q < num_needles; ++q) {
      std::swap(order[q], order[q + rng.Uniform(num_needles - q)]);
    }
    sample.target_mask = torch::zeros({seq_len}, torch::kBool);
    bool* mask = sample.target_mask.data_ptr<bool>();
    for (int64_t q = 0; q < num_needles; ++q) {
      const int64_t at = query_begin + q * kBlock;
      write_block(at, NeedleVocab::kQuery, order[q]);
      mask[at + 1] = true;  // input: the queried key; target tokens[at + 2]: its value
    }
    return sample;
  }

 private:
  const Split split_;
  const int64_t vocab_size_;
  const uint64_t seed_;
  const int64_t validation_;
  const NeedleLayout layout_;
};

}  // namespace

int64_t EpochWindow(int64_t index, int64_t n, uint64_t seed, uint64_t salt) {
  const int64_t epoch = index / n;
  return PermuteIndex(index % n, n,
                      StreamSeed(seed, 0x66696c65ULL, static_cast<uint64_t>(epoch), salt));
}

NeedleLayout NeedleLayout::For(int64_t vocab_size) {
  NeedleLayout l;
  const int64_t free = vocab_size - NeedleVocab::kFirstFree;
  // Half of the free ids hold keys and their values, half are filler.
  l.num_keys = std::clamp<int64_t>(free / 8, 1, kMaxKeys);
  l.values_per_key = std::max<int64_t>(2, (free / 2 - l.num_keys) / l.num_keys);
  l.key_begin = NeedleVocab::kFirstFree;
  l.value_begin = l.key_begin + l.num_keys;
  l.filler_begin = l.value_begin + l.num_keys * l.values_per_key;
  return l;
}

int64_t NeedleLayout::NeedlesFor(int64_t seq_len) const {
  return std::clamp<int64_t>(seq_len / 16, 1, num_keys);
}

absl::StatusOr<std::unique_ptr<TokenDataset>> OpenTokenFile(const std::string& path, Split split,
                                                            int64_t vocab_size, uint64_t seed) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open token file ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("cannot stat token file ", path, ": ", std::strerror(err)));
  }
  const int64_t bytes = st.st_size;
  if (bytes % 4 != 0) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " has ", bytes,
                     " bytes, not a multiple of 4: expected flat little-endian uint32 tokens"));
  }
  const uint32_t* data = nullptr;
  if (bytes > 0) {
    void* map = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return absl::InternalError(
          absl::StrCat("cannot mmap token file ", path, ": ", std::strerror(err)));
    }
    data = static_cast<const uint32_t*>(map);
  }
  close(fd);  // The mapping stays valid.
  auto dataset = std::make_unique<FileTokenDataset>(path, split, vocab_size, seed, data, bytes / 4,
                                                    static_cast<size_t>(bytes));
  if (bytes / 4 < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, " has ", bytes / 4, " tokens; at least 2 are needed for one target"));
  }
  return std::unique_ptr<TokenDataset>(std::move(dataset));
}

absl::StatusOr<std::unique_ptr<TokenDataset>> OpenSynthetic(const std::string& generator,
                                                            Split split, int64_t vocab_size,
                                                            uint64_t seed,
                                                            int64_t validation_sequences) {
  if (validation_sequences < 1 && split == Split::kValidation) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec::fields::PathOf(&spec::SyntheticDataSpec::validation_sequences),
                     " must be >= 1, got ", validation_sequences));
  }
  if (generator == "random") {
    if (vocab_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat("vocab_size must be >= 1, got ", vocab_size));
    }
    return std::unique_ptr<TokenDataset>(
        std::make_unique<RandomDataset>(split, vocab_size, seed, validation_sequences));
  }
  if (generator == "needle") {
    if (vocab_size < NeedleVocab::kMinVocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("the needle generator needs vocab_size >= ", NeedleVocab::kMinVocab,
                       ", got ", vocab_size, "; raise ", spec::fields::ShapePathOf("vocab_size")));
    }
    return std::unique_ptr<TokenDataset>(
        std::make_unique<NeedleDataset>(split, vocab_size, seed, validation_sequences));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(spec::fields::PathOf(&spec::SyntheticDataSpec::generator), ": unknown value \"",
                   generator, "\"; use \"random\" or \"needle\""));
}

absl::StatusOr<std::unique_ptr<TokenDataset>> OpenDataset(const spec::JobSpec& spec, Split split,
                                                          int64_t vocab_size) {
  if (spec.data.synthetic.has_value()) {
    return OpenSynthetic(spec.data.synthetic->generator, split, vocab_size, spec.seed,
                         spec.data.synthetic->validation_sequences);
  }
  const std::string& path = split == Split::kTrain ? spec.data.train : spec.data.validation;
  if (path.empty()) {
    using spec::fields::PathOf;
    return absl::FailedPreconditionError(
        split == Split::kTrain
            ? absl::StrCat(PathOf(&spec::DataSpec::train), " is empty; set a token file or ",
                           PathOf(&spec::DataSpec::synthetic))
            : absl::StrCat(PathOf(&spec::DataSpec::validation),
                           " is empty; set a validation token file to evaluate"));
  }
  if (spec.data.format == "indexed") {
    return OpenPackedDataset(path, split, vocab_size, spec.seed, spec.data.packing);
  }
  return OpenTokenFile(path, split, vocab_size, spec.seed);
}

double ScoredAccuracy(const Sample& sample, const torch::Tensor& predictions) {
  const int64_t s = sample.tokens.size(0) - 1;
  torch::Tensor correct = predictions.reshape({s}).to(torch::kInt64).eq(sample.tokens.slice(0, 1));
  torch::Tensor mask =
      sample.target_mask.defined() ? sample.target_mask : torch::ones({s}, torch::kBool);
  const int64_t scored = mask.sum().item<int64_t>();
  if (scored == 0) return 0.0;
  return static_cast<double>(correct.logical_and(mask).sum().item<int64_t>()) / scored;
}

}  // namespace ulysses::engine
