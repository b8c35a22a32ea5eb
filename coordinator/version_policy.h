// Which peer versions a coordinator accepts (docs/OPERATIONS.md "Upgrades and rollback",
// version policy): releases are MAJOR.MINOR.PATCH (the CMake project version, which every
// binary reports as metrics::BuildVersion()). A coordinator accepts workers and ulyssesctl of
// its own minor version and of the previous one of the same major (0.4 accepts 0.3.x and
// 0.4.x), so the coordinator is upgraded first and the workers and clients follow; every other
// version is refused with both versions and the fix. Workers send their version in
// RegisterRequest.agent_version, ulyssesctl as `ulysses-version` call metadata
// (kVersionMetadata, common/grpc/channel.h). ulyssesctl names itself in its user-agent
// ("ulyssesctl/<version>"), and a call from it without the header is refused; another peer
// that sends none (grpcurl, a tool from before versions were sent, test peers) is not
// checked. A refused version is quoted back at most 32 printable bytes long.
#ifndef ULYSSES_COORDINATOR_VERSION_POLICY_H_
#define ULYSSES_COORDINATOR_VERSION_POLICY_H_

#include <grpcpp/server_context.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ulysses::coordinator {

struct Version {
  int major = 0;
  int minor = 0;
  int patch = 0;
};

// "1.2.3" (a "-suffix" after the patch is ignored); InvalidArgument otherwise.
absl::StatusOr<Version> ParseVersion(absl::string_view text);

// OK when `peer` (the version a `kind` such as "worker" sent) may talk to a coordinator of
// version `own`; FailedPrecondition naming both versions, what is accepted and the fix.
absl::Status CheckPeerVersion(absl::string_view kind, absl::string_view peer,
                              absl::string_view own);

// The policy against this build's version (metrics::BuildVersion()): a worker's
// agent_version ("" = not sent: OK), and the `ulysses-version` metadata of a JobService call
// (absent: OK).
absl::Status CheckWorkerVersion(absl::string_view agent_version);
absl::Status CheckClientVersion(const grpc::ServerContextBase& context);

}  // namespace ulysses::coordinator

#endif  // ULYSSES_COORDINATOR_VERSION_POLICY_H_
