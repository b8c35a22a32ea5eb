#include "coordinator/version_policy.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc/channel.h"
#include "common/metrics/build_info.h"

namespace ulysses::coordinator {

absl::StatusOr<Version> ParseVersion(absl::string_view text) {
  const absl::string_view core = text.substr(0, text.find('-'));
  std::vector<absl::string_view> parts = absl::StrSplit(core, '.');
  Version v;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &v.major) ||
      !absl::SimpleAtoi(parts[1], &v.minor) || !absl::SimpleAtoi(parts[2], &v.patch) ||
      v.major < 0 || v.minor < 0 || v.patch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("version \"", text, "\" is not MAJOR.MINOR.PATCH"));
  }
  return v;
}

namespace {

// A peer's version as quoted back: at most 32 bytes, printable ASCII only.
std::string Quoted(absl::string_view peer) {
  constexpr size_t kMax = 32;
  std::string out;
  for (char c : peer.substr(0, kMax)) out += (c > ' ' && c <= '~') ? c : '?';
  if (peer.size() > kMax) absl::StrAppend(&out, "... (", peer.size(), " bytes)");
  return out;
}

}  // namespace

absl::Status CheckPeerVersion(absl::string_view kind, absl::string_view peer_text,
                              absl::string_view own) {
  const std::string quoted = Quoted(peer_text);
  const absl::string_view peer = quoted;
  absl::StatusOr<Version> mine = ParseVersion(own);
  if (!mine.ok()) return absl::OkStatus();  // A development build ("unknown"): no policy.
  const std::string accepted = mine->minor > 0
                                   ? absl::StrCat(mine->major, ".", mine->minor - 1, ".x and ",
                                                  mine->major, ".", mine->minor, ".x")
                                   : absl::StrCat(mine->major, ".", mine->minor, ".x");
  absl::StatusOr<Version> theirs = ParseVersion(peer_text);
  if (!theirs.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(kind, " version \"", peer, "\" is not a release version; this coordinator (",
                     own, ") accepts ", accepted, " (run a released ",
                     kind == "worker" ? "ulysses-worker" : kind, ")"));
  }
  const bool same_major = theirs->major == mine->major;
  if (same_major && (theirs->minor == mine->minor || theirs->minor + 1 == mine->minor)) {
    return absl::OkStatus();
  }
  const bool newer = theirs->major > mine->major || (same_major && theirs->minor > mine->minor);
  return absl::FailedPreconditionError(absl::StrCat(
      kind, " version ", peer, " is not accepted by this coordinator (version ", own,
      "; it accepts ", accepted, "): ",
      newer ? absl::StrCat("upgrade the coordinator to ", theirs->major, ".", theirs->minor,
                           " first (or use a ", kind, " of ", mine->major, ".", mine->minor, ")")
            : absl::StrCat("upgrade the ", kind, " to ", mine->major, ".", mine->minor)));
}

absl::Status CheckWorkerVersion(absl::string_view agent_version) {
  if (agent_version.empty()) return absl::OkStatus();
  return CheckPeerVersion("worker", agent_version, metrics::BuildVersion());
}

absl::Status CheckClientVersion(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kVersionMetadata);
  if (it == metadata.end()) {
    // Required from ulyssesctl (which names itself in its user-agent): a ulyssesctl that
    // omits it is not one of ours to trust with the policy.
    auto agent = metadata.find("user-agent");
    const absl::string_view ua =
        agent == metadata.end() ? absl::string_view()
                                : absl::string_view(agent->second.data(), agent->second.size());
    if (absl::StartsWith(ua, absl::StrCat(kClientProduct, "/"))) {
      return absl::FailedPreconditionError(absl::StrCat(
          kClientProduct, " (user-agent \"", Quoted(ua.substr(0, ua.find(' '))), "\") sent no ",
          kVersionMetadata, " header; this coordinator (", metrics::BuildVersion(),
          ") requires it of ulyssesctl: use a released ulyssesctl"));
    }
    return absl::OkStatus();
  }
  return CheckPeerVersion("ulyssesctl", absl::string_view(it->second.data(), it->second.size()),
                          metrics::BuildVersion());
}

}  // namespace ulysses::coordinator
