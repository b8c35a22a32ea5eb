#include "coordinator/auth/authenticator.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ulysses::coordinator::auth {

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    std::string token_file, std::vector<TokenEntry> fixed) {
  std::unique_ptr<Authenticator> a(new Authenticator(std::move(token_file), std::move(fixed)));
  absl::StatusOr<std::shared_ptr<const TokenSet>> tokens = a->Read();
  if (!tokens.ok()) return tokens.status();
  {
    absl::MutexLock lock(&a->mu_);  // Not shared yet; the lock keeps the analysis exact.
    a->tokens_ = std::move(*tokens);
  }
  return a;
}

absl::StatusOr<std::shared_ptr<const TokenSet>> Authenticator::Read() const {
  std::vector<TokenEntry> entries = fixed_;
  if (!token_file_.empty()) {
    absl::StatusOr<std::vector<TokenEntry>> loaded = LoadTokenFile(token_file_);
    if (!loaded.ok()) return loaded.status();
    entries.insert(entries.end(), loaded->begin(), loaded->end());
  }
  return std::make_shared<const TokenSet>(std::move(entries));
}

absl::Status Authenticator::Reload() {
  absl::StatusOr<std::shared_ptr<const TokenSet>> tokens = Read();
  if (!tokens.ok()) return tokens.status();
  {
    absl::MutexLock lock(&mu_);
    tokens_ = *tokens;
  }
  EndRevoked(**tokens);
  return absl::OkStatus();
}

namespace {
bool Holds(const TokenSet& tokens, const std::string& sha256) {
  for (const TokenEntry& e : tokens.entries()) {
    if (e.sha256_hex == sha256) return true;
  }
  return false;
}
}  // namespace

void Authenticator::EndRevoked(const TokenSet& tokens) const {
  std::vector<std::pair<uint64_t, std::function<void()>>> revoked;
  {
    absl::MutexLock lock(&calls_mu_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (Holds(tokens, it->second.first)) {
        ++it;
        continue;
      }
      ending_[it->first] = std::this_thread::get_id();
      revoked.emplace_back(it->first, std::move(it->second.second));
      it = calls_.erase(it);
    }
  }
  // Outside the lock: an `end` finishes its stream, whose OnDone may run here and Untrack.
  for (auto& [handle, end] : revoked) {
    end();
    absl::MutexLock lock(&calls_mu_);
    ending_.erase(handle);
  }
}

uint64_t Authenticator::Track(const Principal& caller, std::function<void()> end) const {
  if (caller.token_sha256.empty()) return 0;
  std::shared_ptr<const TokenSet> tokens;
  {
    absl::MutexLock lock(&mu_);
    tokens = tokens_;
  }
  uint64_t handle;
  {
    absl::MutexLock lock(&calls_mu_);
    handle = next_call_++;
    calls_[handle] = {caller.token_sha256, std::move(end)};
  }
  // Revoked between its authentication and now: end it like the reload would have.
  if (!Holds(*tokens, caller.token_sha256)) EndRevoked(*tokens);
  return handle;
}

void Authenticator::Untrack(uint64_t handle) const {
  if (handle == 0) return;
  struct Ended {
    const std::map<uint64_t, std::thread::id>* ending;
    uint64_t handle;
    std::thread::id self;
  };
  absl::MutexLock lock(&calls_mu_);
  calls_.erase(handle);
  Ended ended{&ending_, handle, std::this_thread::get_id()};
  calls_mu_.Await(absl::Condition(
      +[](Ended* e) {
        auto it = e->ending->find(e->handle);
        return it == e->ending->end() || it->second == e->self;
      },
      &ended));
}

size_t Authenticator::tracked() const {
  absl::MutexLock lock(&calls_mu_);
  return calls_.size();
}

size_t Authenticator::token_count() const {
  absl::MutexLock lock(&mu_);
  return tokens_->entries().size();
}

std::optional<Principal> Authenticator::LookupToken(const std::string& token) const {
  std::shared_ptr<const TokenSet> tokens;
  {
    absl::MutexLock lock(&mu_);
    tokens = tokens_;
  }
  return tokens->Lookup(token);
}

absl::StatusOr<Principal> Authenticator::Authenticate(const grpc::ServerContextBase& context,
                                                      bool worker_service) const {
  if (worker_service) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth != nullptr && auth->IsPeerAuthenticated()) {
      // The TLS handshake verified the chain against tls_client_ca.
      std::vector<grpc::string_ref> cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
      if (cn.size() != 1 || cn[0].empty()) {
        return absl::PermissionDeniedError(
            "client certificate: no single subject CN (a worker certificate names the worker "
            "in its CN; see scripts/dev_certs.sh)");
      }
      Principal p;
      p.user = std::string(cn[0].data(), cn[0].size());
      p.role = Role::kWorker;
      p.from_certificate = true;
      return p;
    }
  }
  const auto& md = context.client_metadata();
  auto range = md.equal_range("authorization");
  if (range.first == range.second) return absl::UnauthenticatedError(kNoTokenMessage);
  if (std::next(range.first) != range.second) {
    return absl::UnauthenticatedError("authorization: sent more than once (send one Bearer token)");
  }
  std::string value(range.first->second.data(), range.first->second.size());
  constexpr absl::string_view kBearer = "bearer ";
  if (value.size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(absl::string_view(value).substr(0, kBearer.size()), kBearer)) {
    return absl::UnauthenticatedError(
        "authorization: not \"Bearer <token>\" (set ULYSSES_TOKEN or a context's token_file)");
  }
  std::string token(absl::StripAsciiWhitespace(value.substr(kBearer.size())));
  std::optional<Principal> p = LookupToken(token);
  if (!p) {
    return absl::UnauthenticatedError(
        "authorization: unknown or revoked token (ask an admin for a token: "
        "ulysses-coordinator token create)");
  }
  return *p;
}

absl::StatusOr<Principal> Authenticator::Authorize(const grpc::ServerContextBase& context,
                                                   Rpc rpc) const {
  const bool worker_service = rpc == Rpc::kRegister || rpc == Rpc::kSession;
  absl::StatusOr<Principal> p = Authenticate(context, worker_service);
  if (!p.ok()) return p.status();
  if (!RoleMayCall(p->role, rpc)) {
    return absl::PermissionDeniedError(absl::StrCat(p->Describe(), " may not call ", RpcName(rpc),
                                                    " (role ", RoleName(p->role),
                                                    "; see docs/SECURITY.md for the roles)"));
  }
  return p;
}

}  // namespace ulysses::coordinator::auth
