#include "coordinator/stream_limits.h"

#include "absl/strings/str_cat.h"

namespace ulysses::coordinator {

std::string StreamLimits::IdentityOf(const auth::Principal& caller) {
  if (caller.from_certificate) return absl::StrCat("cert:", caller.user);
  return absl::StrCat("token:", caller.tenant, "/", caller.user);
}

absl::Status StreamLimits::Acquire(const std::string& identity) {
  absl::MutexLock lock(&mu_);
  int64_t& mine = by_identity_[identity];
  if (mine >= per_identity_) {
    if (mine == 0) by_identity_.erase(identity);
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many open watch/follow streams for ", identity, ": ", mine,
        " of max_streams_per_identity ", per_identity_,
        " (close some `ulyssesctl watch` / `logs -f`, or ask the operator to raise it)"));
  }
  if (open_ >= total_) {
    if (mine == 0) by_identity_.erase(identity);
    return absl::ResourceExhaustedError(
        absl::StrCat("the coordinator has ", open_, " open watch/follow streams, its max_streams ",
                     total_, " (retry later, or ask the operator to raise max_streams)"));
  }
  ++mine;
  ++open_;
  return absl::OkStatus();
}

void StreamLimits::Release(const std::string& identity) {
  absl::MutexLock lock(&mu_);
  auto it = by_identity_.find(identity);
  if (it == by_identity_.end()) return;
  if (--it->second <= 0) by_identity_.erase(it);
  --open_;
}

int64_t StreamLimits::open() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

}  // namespace ulysses::coordinator
