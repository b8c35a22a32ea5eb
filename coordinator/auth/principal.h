// Principal: who is calling the coordinator, as established by the Authenticator
// (authenticator.h) from a bearer token or a worker's client certificate, and the
// roles a principal can hold. Plain values.
#ifndef ULYSSES_COORDINATOR_AUTH_PRINCIPAL_H_
#define ULYSSES_COORDINATOR_AUTH_PRINCIPAL_H_

#include <optional>
#include <string>

namespace ulysses::coordinator::auth {

// What a principal may do: the permission table is in permissions.cc.
enum class Role {
  kAdmin,   // Everything, every tenant; may register any worker name.
  kUser,    // Submit, cancel, resume and read its tenant's jobs; list workers.
  kViewer,  // Read its tenant's jobs and the workers.
  kWorker,  // WorkerService only, as the worker named by its `user`.
};

// "admin", "user", "viewer", "worker".
const char* RoleName(Role role);
// The inverse of RoleName; nullopt for anything else.
std::optional<Role> ParseRole(const std::string& name);

struct Principal {
  std::string user;    // Token user, or the worker name of a client certificate (its CN).
  std::string tenant;  // Token tenant ("" for a client certificate).
  Role role = Role::kViewer;
  bool from_certificate = false;  // Authenticated by a verified client certificate.
  // The SHA-256 (hex) of the token it authenticated with ("" for a certificate): a reload
  // that revokes the token ends the streams and sessions it opened (authenticator.h).
  std::string token_sha256;

  bool admin() const { return role == Role::kAdmin; }
  // The identity that owns a worker name: "worker:<name>" for a worker's certificate or
  // worker token (both issued for that one worker), "admin:<user>" for an admin token.
  std::string WorkerIdentity() const;
  // For logs and events: "alice (tenant research, role user)".
  std::string Describe() const;
};

// Whether `p` may see (and, role permitting, act on) a job of `tenant`: an admin every
// tenant, anyone else only their own. Other tenants' jobs answer NOT_FOUND.
bool MaySeeTenant(const Principal& p, const std::string& tenant);

// Whether `p` may register (and open a session for) the worker named `name`:
// a worker only its own name, an admin any name, nobody else.
bool MayActAsWorker(const Principal& p, const std::string& name);

}  // namespace ulysses::coordinator::auth

#endif  // ULYSSES_COORDINATOR_AUTH_PRINCIPAL_H_
