// The spec document a rank runs. The coordinator confines and checks a job's paths on the
// strings it parsed; the engine must run on exactly those strings. So the checkpoint
// directory the coordinator chose is written into the spec as data (a YAML document the
// emitter quotes as needed) instead of a `--set spec.checkpoint.dir=<dir>` override, which
// the engine would parse as YAML a second time (`"<dir> #x"` would become `<dir>`), and the
// document is parsed back and compared before it is sent.
#ifndef ULYSSES_COORDINATOR_ENGINE_SPEC_H_
#define ULYSSES_COORDINATOR_ENGINE_SPEC_H_

#include <string>

#include "absl/status/statusor.h"

namespace ulysses::coordinator {

// The canonical `spec_yaml` of a job with spec.checkpoint.dir = `checkpoint_dir`. Internal
// error (naming the field and both values) when the emitted document does not parse back
// to that directory and the same spec; InvalidArgument when `spec_yaml` does not parse.
absl::StatusOr<std::string> EngineSpecYaml(const std::string& spec_yaml,
                                           const std::string& checkpoint_dir);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_ENGINE_SPEC_H_
