#include "coordinator/stream_limits.h"

#include "absl/strings/str_cat.h"

namespace ulysses::coordinator {

std::string StreamLimits::IdentityOf(const auth::Principal& caller) {
  if (caller.from_certificate) return absl::StrCat("cert:", caller.user);
  return absl::StrCat("token:", caller.tenant, "/", caller.user);
}

absl::Status StreamLimits::Acquire(const std::string& identity, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  const auto mine = by_identity_.find(identity);
  const int64_t held = mine == by_identity_.end() ? 0 : mine->second;
  if (held >= per_identity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many open watch/follow streams for ", identity, ": ", held,
        " of max_streams_per_identity ", per_identity_,
        " (close some `ulyssesctl watch` / `logs -f`, or ask the operator to raise it)"));
  }
  if (open_ >= total_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the coordinator has ", open_, " open watch/follow streams, its max_streams ",
                     total_, " (retry later, or ask the operator to raise max_streams)"));
  }
  const auto theirs = by_tenant_.find(tenant);
  const int64_t tenant_held = theirs == by_tenant_.end() ? 0 : theirs->second;
  if (tenant_held >= per_tenant_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", tenant.empty() ? "(none)" : tenant, " holds ", tenant_held,
        " open watch/follow streams, its max_streams_per_tenant ", per_tenant_,
        " (close some of the tenant's `ulyssesctl watch` / `logs -f`, or ask the operator to "
        "raise it)"));
  }
  ++by_identity_[identity];
  ++by_tenant_[tenant];
  ++open_;
  return absl::OkStatus();
}

void StreamLimits::Release(const std::string& identity, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = by_identity_.find(identity);
  if (it == by_identity_.end()) return;
  if (--it->second <= 0) by_identity_.erase(it);
  auto t = by_tenant_.find(tenant);
  if (t != by_tenant_.end() && --t->second <= 0) by_tenant_.erase(t);
  --open_;
}

int64_t StreamLimits::open() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

}  // namespace ulysses::coordinator
