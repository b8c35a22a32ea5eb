// Authenticator: turns a gRPC call into a Principal and applies the permission
// table (permissions.h). Thread-safe; Reload() swaps the token set atomically and ends
// the streams and worker sessions opened with a token it revoked (Track()).
//
// - JobService calls authenticate with `authorization: Bearer <token>` metadata only.
// - WorkerService calls authenticate with a verified client certificate when the
//   connection presented one (the worker's name is the certificate's CN; role worker),
//   else with a bearer token like any other call.
// Errors: no or unknown token -> UNAUTHENTICATED (the message says how to set one);
// a role without the RPC -> PERMISSION_DENIED.
#ifndef ULYSSES_COORDINATOR_AUTH_AUTHENTICATOR_H_
#define ULYSSES_COORDINATOR_AUTH_AUTHENTICATOR_H_

#include <grpcpp/server_context.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/auth/permissions.h"
#include "coordinator/auth/principal.h"
#include "coordinator/auth/tokens.h"

namespace ulysses::coordinator::auth {

// The message of an UNAUTHENTICATED call without a token (the contract's wording).
inline constexpr char kNoTokenMessage[] =
    "no token: set ULYSSES_TOKEN or a context's token_file (ulyssesctl config --help)";

class Authenticator {
 public:
  // Tokens: those of `token_file` ("" = none) plus `fixed` (the bootstrap admin token,
  // kept across reloads). An invalid token file is an error here.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(std::string token_file,
                                                               std::vector<TokenEntry> fixed);

  // Re-reads the token file. On any error the current tokens stay in force and the
  // error (naming the file, entry and field) is returned for the caller to log.
  absl::Status Reload();

  // The principal of a token (nullopt when unknown).
  std::optional<Principal> LookupToken(const std::string& token) const;
  // The caller of `context` (see the header comment); `worker_service` allows a
  // client certificate.
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& context,
                                         bool worker_service) const;
  // Authenticate(), then the permission table for `rpc`.
  absl::StatusOr<Principal> Authorize(const grpc::ServerContextBase& context, Rpc rpc) const;

  // Streams and sessions by the token that opened them, so that a reload revoking the
  // token ends them (at the reload, not at their next reconnect). Track() registers
  // `end` (called at most once, on the thread of the reload, with no lock of the
  // Authenticator held) and returns a handle for Untrack(), 0 for a certificate caller
  // (not revocable by a reload). A token already revoked is ended at once. Untrack()
  // returns only once a running `end` of its call has returned, unless it is called from
  // within that `end` (a stream whose OnDone runs inline): the caller may free what `end`
  // uses as soon as Untrack() returns.
  uint64_t Track(const Principal& caller, std::function<void()> end) const;
  void Untrack(uint64_t handle) const;
  size_t tracked() const;

  size_t token_count() const;
  const std::string& token_file() const { return token_file_; }

 private:
  Authenticator(std::string token_file, std::vector<TokenEntry> fixed)
      : token_file_(std::move(token_file)), fixed_(std::move(fixed)) {}
  absl::StatusOr<std::shared_ptr<const TokenSet>> Read() const;

  const std::string token_file_;
  const std::vector<TokenEntry> fixed_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenSet> tokens_ ABSL_GUARDED_BY(mu_);  // The set itself is immutable.
  mutable absl::Mutex calls_mu_;
  // Tracked calls: handle -> {token hash, end}.
  mutable std::map<uint64_t, std::pair<std::string, std::function<void()>>> calls_
      ABSL_GUARDED_BY(calls_mu_);
  // Calls whose `end` is running, by the thread running it (EndRevoked calls them outside
  // calls_mu_): Untrack() from any other thread waits for the entry to go.
  mutable std::map<uint64_t, std::thread::id> ending_ ABSL_GUARDED_BY(calls_mu_);
  mutable uint64_t next_call_ ABSL_GUARDED_BY(calls_mu_) = 1;
  // Ends the tracked calls whose token `tokens` does not hold.
  void EndRevoked(const TokenSet& tokens) const;
};

}  // namespace ulysses::coordinator::auth

#endif  // ULYSSES_COORDINATOR_AUTH_AUTHENTICATOR_H_
