// Internal helpers shared by the JobSpec parser, validator and emitter: value
// formatting for error messages, did-you-mean suggestions, the data-file check.
// Not part of the public contract (use job_spec_parser.h). Thread-compatible,
// stateless.
#ifndef ULYSSES_COMMON_SPEC_SPEC_UTIL_H_
#define ULYSSES_COMMON_SPEC_SPEC_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/spec/job_spec.h"

namespace ulysses::spec::internal {

// Shortest decimal text that reads back to exactly `v` ("0.001", "1e-05", "500000").
std::string FormatDouble(double v);

// 'text' for messages: single-quoted, control characters escaped, long text cut.
std::string Quote(const std::string& text);

// `text` with control characters (newlines included) escaped, so that one error
// stays on one line.
std::string OneLine(const std::string& text);

// Levenshtein distance.
size_t EditDistance(const std::string& a, const std::string& b);

// " (did you mean 'x'?)" when a candidate is close to `key`, else
// " (valid keys: a, b, c)". Empty candidates -> "".
std::string SuggestKey(const std::string& key, const std::vector<std::string>& candidates);

// "try 992 or 1008": the multiples of `unit` (> 0) around `value` (no overflow).
std::string NearestMultiples(int64_t value, int64_t unit);

// "a, b or c".
std::string JoinChoices(const std::vector<std::string>& choices);

// Joins error lines (each made OneLine) with '\n' into one InvalidArgument (OK when
// `errors` is empty).
absl::Status ErrorsToStatus(const std::vector<std::string>& errors);

// The error line for a stages list longer than kMaxStages (the reader and the
// validator both report it, once, instead of one line per stage).
std::string TooManyStages(size_t count);

// Data files exist, are whole uint32 tokens and hold stages[0].seq_len + 1 tokens.
absl::Status CheckDataFiles(const JobSpec& spec);

}  // namespace ulysses::spec::internal

#endif  // ULYSSES_COMMON_SPEC_SPEC_UTIL_H_
