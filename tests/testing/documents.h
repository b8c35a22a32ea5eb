// Training data for the engine's end-to-end tests: token files (raw uint32 ids) and a JSONL
// corpus.
//
// WriteMaskedDocumentsJsonl: a JSONL corpus for the packed-data tests (`ulysses-train data pack
// --jsonl`, docs/DATA.md): `count` documents of 8..307 tokens over `vocab` ids, learnable (a noisy
// successor rule) and deterministic, each starting with token 1. Every even document has its first
// third masked out (a prompt: context only, no loss), so the corpus has documents shorter and
// longer than a 128-token sequence, masked prefixes and unmasked documents.
#ifndef ULYSSES_TESTS_TESTING_DOCUMENTS_H_
#define ULYSSES_TESTS_TESTING_DOCUMENTS_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace ulysses::testing {

// Writes the corpus to `path`; false when the file cannot be written.
inline bool WriteMaskedDocumentsJsonl(const std::string& path, int count = 60,
                                      uint32_t vocab = 64) {
  std::ofstream docs(path);
  uint32_t x = 3;
  for (int d = 0; d < count; ++d) {
    const int n = 8 + (d * 37) % 300;
    std::string ids, mask;
    for (int i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      const uint32_t t =
          i == 0 ? 1 : ((x >> 24) % 4 == 0 ? (x >> 16) % vocab : (i * 5 + d) % vocab);
      ids += (i ? "," : "") + std::to_string(t);
      mask += (i ? "," : "") + std::string(d % 2 == 0 && i < n / 3 ? "0" : "1");
    }
    docs << "{\"ids\": [" << ids << "], \"mask\": [" << mask << "]}\n";
  }
  return static_cast<bool>(docs.flush());
}

// `n` uniformly random ids below `vocab` (a linear congruential stream from `seed`), as a raw
// uint32 token file: nothing to learn, for tests that compare losses, not progress.
inline bool WriteRandomTokens(const std::string& path, int64_t n, uint32_t seed,
                              uint32_t vocab = 64) {
  std::vector<uint32_t> t(n);
  uint32_t x = seed;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = (x >> 16) % vocab;
  }
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(n * 4));
  return static_cast<bool>(f.flush());
}

// `n` ids over vocab 64 starting with 1: a noisy deterministic successor sequence (learnable,
// not trivial), as a raw uint32 token file.
inline bool WriteLearnableTokens(const std::string& path, int64_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  uint32_t x = seed;
  t[0] = 1;
  for (int64_t i = 1; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[i] = ((x >> 24) % 4 == 0) ? (x >> 16) % 64 : (t[i - 1] * 5 + 3) % 64;
  }
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(n * 4));
  return static_cast<bool>(f.flush());
}

}  // namespace ulysses::testing

#endif  // ULYSSES_TESTS_TESTING_DOCUMENTS_H_
