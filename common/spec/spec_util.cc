#include "common/spec/spec_util.h"
#include "common/spec/job_spec_fields.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ulysses::spec::internal {

std::string FormatDouble(double v) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) {
      break;
    }
  }
  std::string text = buf;
  // Plain decimals read better than exponents for everyday magnitudes ("500000", "0.0003").
  const double magnitude = std::fabs(v);
  if (text.find('e') != std::string::npos && magnitude >= 1e-4 && magnitude < 1e15) {
    for (int decimals = 0; decimals <= 17; ++decimals) {
      std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
      if (std::strtod(buf, nullptr) == v) {
        text = buf;
        break;
      }
    }
  }
  // Keep a marker that this is a float when it prints like an integer: "1" -> "1.0".
  if (text.find_first_of(".eEn") == std::string::npos) {
    text += ".0";
  }
  return text;
}

std::string OneLine(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

std::string Quote(const std::string& text) {
  constexpr size_t kMaxShown = 256;  // Long enough for file paths.
  std::string out = "'" + OneLine(text.substr(0, kMaxShown));
  if (text.size() > kMaxShown) {
    out += "...";
  }
  return out + "'";
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    prev[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string SuggestKey(const std::string& key, const std::vector<std::string>& candidates) {
  if (candidates.empty()) {
    return "";
  }
  const std::string* best = nullptr;
  size_t best_distance = 0;
  for (const std::string& candidate : candidates) {
    const size_t d = EditDistance(key, candidate);
    if (best == nullptr || d < best_distance) {
      best = &candidate;
      best_distance = d;
    }
  }
  // Close enough: at most a third of the longer name (and at least 2 edits allowed).
  const size_t allowed = std::max<size_t>(2, std::max(key.size(), best->size()) / 3);
  if (best_distance <= allowed) {
    return absl::StrCat(" (did you mean '", *best, "'?)");
  }
  return absl::StrCat(" (valid keys: ", absl::StrJoin(candidates, ", "), ")");
}

std::string NearestMultiples(int64_t value, int64_t unit) {
  const int64_t lower = value / unit * unit;
  int64_t higher = 0;
  const bool has_higher = !__builtin_add_overflow(lower, unit, &higher);
  if (lower <= 0) {
    return absl::StrCat("try ", has_higher ? higher : unit);
  }
  if (!has_higher) {
    return absl::StrCat("try ", lower);
  }
  return absl::StrCat("try ", lower, " or ", higher);
}

std::string JoinChoices(const std::vector<std::string>& choices) {
  if (choices.empty()) {
    return "";
  }
  if (choices.size() == 1) {
    return choices[0];
  }
  std::vector<std::string> head(choices.begin(), choices.end() - 1);
  return absl::StrCat(absl::StrJoin(head, ", "), " or ", choices.back());
}

std::string TooManyStages(size_t count) {
  return absl::StrCat(fields::PathOf(&JobSpec::stages), ": ", count, " stages is more than ",
                      kMaxStages, " (split the run into jobs of at most ", kMaxStages,
                      " stages, each resuming from the last one's checkpoint)");
}

absl::Status ErrorsToStatus(const std::vector<std::string>& errors) {
  if (errors.empty()) {
    return absl::OkStatus();
  }
  std::vector<std::string> lines;
  for (const std::string& e : errors) {
    lines.push_back(OneLine(e));
  }
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

namespace {

// Appends an error when `path` is not a usable token file for `need` tokens.
void CheckOneFile(const std::string& field, const std::string& path, int64_t need,
                  std::vector<std::string>* errors) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    errors->push_back(absl::StrCat(field, ": ", Quote(path), " cannot be read (",
                                   std::strerror(errno), "; give an existing uint32 token file)"));
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    errors->push_back(absl::StrCat(field, ": ", Quote(path),
                                   " is not a regular file (give a uint32 token file)"));
    return;
  }
  const int64_t bytes = static_cast<int64_t>(st.st_size);
  if (bytes % 4 != 0) {
    errors->push_back(absl::StrCat(field, ": ", Quote(path), " has ", bytes,
                                   " bytes, not a multiple of 4 (token files are flat "
                                   "little-endian uint32; the file is truncated or not tokens)"));
    return;
  }
  const int64_t tokens = bytes / 4;
  if (tokens < need) {
    errors->push_back(absl::StrCat(field, ": ", Quote(path), " holds ", tokens,
                                   " tokens, needs at least ", need,
                                   " (stages[0].seq_len + 1; use a longer file or a shorter "
                                   "first stage)"));
  }
}

}  // namespace

absl::Status CheckDataFiles(const JobSpec& spec) {
  std::vector<std::string> errors;
  const int64_t need = spec.stages.empty() ? 1 : spec.stages[0].seq_len + 1;
  for (const auto& [field, path] :
       {std::make_pair(fields::PathOf(&DataSpec::train), spec.data.train),
        std::make_pair(fields::PathOf(&DataSpec::validation), spec.data.validation)}) {
    if (path.empty()) continue;
    if (spec.data.format != "indexed") {
      CheckOneFile(field, path, need, &errors);
      continue;
    }
    // An indexed dataset prefix (docs/DATA.md): its index and tokens must exist; the engine
    // validates their contents when it opens them.
    for (const char* ext : {".idx", ".bin"}) {
      struct stat st;
      if (::stat((path + ext).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        errors.push_back(absl::StrCat(field, ": ", Quote(path),
                                      " is an indexed dataset prefix, but ", Quote(path + ext),
                                      " is not a readable file (build it with `ulysses-train data "
                                      "pack --out ",
                                      path, "`)"));
      }
    }
  }
  return ErrorsToStatus(errors);
}

}  // namespace ulysses::spec::internal
