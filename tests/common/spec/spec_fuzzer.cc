// libFuzzer target for the JobSpec parser (clang only; not part of the default build):
//   cmake --build build --target spec_fuzzer
//   mkdir -p /tmp/spec-corpus && cp configs/jobs/*.yaml /tmp/spec-corpus
//   build/bin/spec_fuzzer -max_total_time=60 -timeout=5 /tmp/spec-corpus
// (libFuzzer writes new inputs into the corpus directory: never point it at configs/.)
// Crashes found so far live in tests/common/spec/testdata/ (run by common_spec_fuzz_test).
// Any input must give OK or InvalidArgument with non-empty `path: ...` lines, and
// an accepted spec must round-trip through ToYaml.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_split.h"
#include "common/spec/job_spec_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ulysses::spec::JobSpec> spec = ulysses::spec::ParseJobSpec(input);
  if (!spec.ok()) {
    if (spec.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (spec.status().message().empty()) std::abort();
    for (absl::string_view line : absl::StrSplit(spec.status().message(), '\n')) {
      if (line.find(": ") == absl::string_view::npos) std::abort();
    }
    return 0;
  }
  const std::string yaml = ulysses::spec::ToYaml(*spec);
  absl::StatusOr<ulysses::spec::JobSpec> again = ulysses::spec::ParseJobSpec(yaml);
  if (!again.ok() || ulysses::spec::ToYaml(*again) != yaml) std::abort();
  return 0;
}
