#include "coordinator/auth/principal.h"

#include "absl/strings/str_cat.h"

namespace ulysses::coordinator::auth {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kViewer:
      return "viewer";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

std::optional<Role> ParseRole(const std::string& name) {
  for (Role r : {Role::kAdmin, Role::kUser, Role::kViewer, Role::kWorker}) {
    if (name == RoleName(r)) return r;
  }
  return std::nullopt;
}

std::string Principal::WorkerIdentity() const {
  return absl::StrCat(role == Role::kWorker ? "worker:" : absl::StrCat(RoleName(role), ":"), user);
}

std::string Principal::Describe() const {
  if (from_certificate) return absl::StrCat(user, " (client certificate)");
  return absl::StrCat(user, " (tenant ", tenant, ", role ", RoleName(role), ")");
}

bool MaySeeTenant(const Principal& p, const std::string& tenant) {
  return p.role == Role::kAdmin || p.tenant == tenant;
}

bool MayActAsWorker(const Principal& p, const std::string& name) {
  if (p.role == Role::kAdmin) return true;
  return p.role == Role::kWorker && p.user == name;
}

}  // namespace ulysses::coordinator::auth
