// Unit tests of coordinator/auth: token files (validation, hashing, lookup, append),
// reload semantics, the permission table, worker-name rules and first-start
// credentials. The gRPC side (metadata, client certificates) is tested end to end in
// tests/security.
#include <sys/stat.h>
#include <filesystem>

#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "coordinator/auth/authenticator.h"
#include "coordinator/auth/bootstrap.h"
#include "coordinator/auth/permissions.h"
#include "coordinator/auth/tokens.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"
#include "tests/testing/temp_dir.h"

namespace ulysses::coordinator::auth {
namespace {

using ::ulysses::testing::ReadFile;
using ::ulysses::testing::TempDir;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

std::string Entry(const std::string& user, const std::string& tenant, const std::string& role,
                  const std::string& token) {
  return "  - {user: " + user + ", tenant: " + tenant + ", role: " + role +
         ", sha256: " + Sha256Hex(token) + "}\n";
}

TEST(TokensTest, Sha256HexIsTheStandardDigest) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokensTest, NewTokenIsUlPrefixedBase64UrlAndRandom) {
  absl::StatusOr<std::string> a = NewToken();
  absl::StatusOr<std::string> b = NewToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 3u + 43u);
  EXPECT_TRUE(absl::StartsWith(*a, "ul_"));
  for (char c : a->substr(3)) {
    EXPECT_TRUE(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') << *a;
  }
  EXPECT_NE(*a, *b);
}

TEST(TokensTest, LookupMapsATokenToItsPrincipalAndRejectsOthers) {
  absl::StatusOr<std::vector<TokenEntry>> entries =
      ParseTokenFile("tokens:\n" + Entry("alice", "research", "user", "ul_alice") +
                         Entry("bob", "ops", "viewer", "ul_bob"),
                     "t.yaml");
  ASSERT_TRUE(entries.ok()) << entries.status();
  TokenSet set(*entries);
  std::optional<Principal> alice = set.Lookup("ul_alice");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->user, "alice");
  EXPECT_EQ(alice->tenant, "research");
  EXPECT_EQ(alice->role, Role::kUser);
  std::optional<Principal> bob = set.Lookup("ul_bob");
  ASSERT_TRUE(bob.has_value());
  EXPECT_EQ(bob->role, Role::kViewer);
  EXPECT_FALSE(set.Lookup("ul_alicf").has_value());
  EXPECT_FALSE(set.Lookup("").has_value());
  // The hash is not a token: presenting it does not authenticate.
  EXPECT_FALSE(set.Lookup(Sha256Hex("ul_alice")).has_value());
}

TEST(TokensTest, EveryProblemNamesTheEntryFieldValueAndFix) {
  const std::string text =
      "tokens:\n"
      "  - {user: Alice, tenant: research, role: user, sha256: " +
      Sha256Hex("a") +
      "}\n"
      "  - {user: bob, tenant: research, role: root, sha256: " +
      Sha256Hex("b") +
      "}\n"
      "  - {user: carol, tenant: research, role: user, sha256: xyz}\n"
      "  - {user: dave, tenant: research, role: user, sha256: " +
      Sha256Hex("b") +
      ", password: hunter2}\n"
      "  - {user: erin, tenant: -bad, role: user, sha256: " +
      Sha256Hex("e") + "}\n";
  absl::StatusOr<std::vector<TokenEntry>> r = ParseTokenFile(text, "t.yaml");
  ASSERT_FALSE(r.ok());
  const std::string m(r.status().message());
  EXPECT_TRUE(absl::StrContains(m, "t.yaml: tokens[0].user: \"Alice\" is not a name")) << m;
  EXPECT_TRUE(absl::StrContains(m,
                                "tokens[1].role: \"root\" is not a role (use admin, user, "
                                "viewer or worker)"))
      << m;
  EXPECT_TRUE(absl::StrContains(m, "tokens[2].sha256: \"xyz\" is not 64 hex characters")) << m;
  EXPECT_TRUE(absl::StrContains(m, "tokens[3].sha256: " + Sha256Hex("b") + " appears twice")) << m;
  EXPECT_TRUE(absl::StrContains(m, "tokens[3].password: unknown key")) << m;
  EXPECT_TRUE(absl::StrContains(m, "tokens[4].tenant: \"-bad\" is not a name")) << m;
  EXPECT_FALSE(ParseTokenFile("tokens: [\n", "t.yaml").ok());
  EXPECT_FALSE(ParseTokenFile("users: []\n", "t.yaml").ok());
  EXPECT_TRUE(ParseTokenFile("tokens: []\n", "t.yaml").ok());  // Everyone revoked.
}

TEST(TokensTest, AppendCreatesAPrivateFileAndKeepsEarlierTokens) {
  TempDir dir;
  const std::string path = dir.Sub("tokens.yaml");
  TokenEntry a{"alice", "research", Role::kUser, Sha256Hex("ul_a"), "2026-11-23T00:00:00Z"};
  TokenEntry b{"w1", "infra", Role::kWorker, Sha256Hex("ul_b"), ""};
  ASSERT_TRUE(AppendTokenFile(path, a).ok());
  ASSERT_TRUE(AppendTokenFile(path, b).ok());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<std::vector<TokenEntry>> back = LoadTokenFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].user, "alice");
  EXPECT_EQ((*back)[0].created, "2026-11-23T00:00:00Z");
  EXPECT_EQ((*back)[1].role, Role::kWorker);
  EXPECT_FALSE(absl::StrContains(ReadFile(path), "ul_a"));  // Hashes only.
  // The same token twice is refused and the file is unchanged.
  const std::string before = ReadFile(path);
  EXPECT_FALSE(AppendTokenFile(path, a).ok());
  EXPECT_EQ(ReadFile(path), before);
}

TEST(TokensTest, AppendRefusesABrokenFileAndLeavesItAlone) {
  TempDir dir;
  const std::string path = dir.Sub("tokens.yaml");
  WriteFile(path, "tokens:\n  - {user: x}\n");
  absl::Status s = AppendTokenFile(path, {"alice", "research", Role::kUser, Sha256Hex("t"), ""});
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "fix the file")) << s;
  EXPECT_EQ(ReadFile(path), "tokens:\n  - {user: x}\n");
}

TEST(AuthenticatorTest, ReloadAddsAndRevokesAndABadFileKeepsTheOldSet) {
  TempDir dir;
  const std::string path = dir.Sub("tokens.yaml");
  WriteFile(path, "tokens:\n" + Entry("alice", "research", "user", "ul_alice"));
  TokenEntry fixed{"admin", "default", Role::kAdmin, Sha256Hex("ul_admin"), ""};
  auto a = Authenticator::Create(path, {fixed});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->LookupToken("ul_alice").has_value());
  EXPECT_TRUE((*a)->LookupToken("ul_admin").has_value());
  EXPECT_FALSE((*a)->LookupToken("ul_bob").has_value());

  // Add bob, revoke alice.
  WriteFile(path, "tokens:\n" + Entry("bob", "research", "viewer", "ul_bob"));
  ASSERT_TRUE((*a)->Reload().ok());
  EXPECT_FALSE((*a)->LookupToken("ul_alice").has_value());
  EXPECT_TRUE((*a)->LookupToken("ul_bob").has_value());
  EXPECT_TRUE((*a)->LookupToken("ul_admin").has_value());  // Fixed tokens survive reloads.

  // A broken file: the reload fails with the reason and bob stays valid.
  WriteFile(path, "tokens:\n  - {user: carol, tenant: research, role: superuser, sha256: 00}\n");
  absl::Status s = (*a)->Reload();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "tokens[0].role")) << s;
  EXPECT_TRUE((*a)->LookupToken("ul_bob").has_value());
  EXPECT_EQ((*a)->token_count(), 2u);

  // Missing file likewise.
  std::remove(path.c_str());
  EXPECT_FALSE((*a)->Reload().ok());
  EXPECT_TRUE((*a)->LookupToken("ul_bob").has_value());
}

// Track/Untrack (authenticator.h): a reload ends exactly the calls of the tokens it
// revoked, once, and an `end` that finishes its call inline (OnDone -> Untrack on the same
// thread) does not deadlock.
TEST(AuthenticatorTest, AReloadEndsTheCallsOfRevokedTokensOnceAndAnEndMayUntrackInline) {
  TempDir dir;
  const std::string path = dir.Sub("tokens.yaml");
  WriteFile(path, "tokens:\n" + Entry("alice", "research", "user", "ul_alice") +
                      Entry("bob", "research", "user", "ul_bob"));
  auto a = Authenticator::Create(path, {});
  ASSERT_TRUE(a.ok()) << a.status();
  const Principal alice = *(*a)->LookupToken("ul_alice");
  const Principal bob = *(*a)->LookupToken("ul_bob");
  int alice_ended = 0;
  int bob_ended = 0;
  uint64_t alice_handle = 0;
  alice_handle = (*a)->Track(alice, [&] {
    ++alice_ended;
    (*a)->Untrack(alice_handle);  // The stream's OnDone, inline.
  });
  const uint64_t bob_handle = (*a)->Track(bob, [&] { ++bob_ended; });
  EXPECT_EQ((*a)->tracked(), 2u);

  WriteFile(path, "tokens:\n" + Entry("bob", "research", "user", "ul_bob"));
  ASSERT_TRUE((*a)->Reload().ok());
  EXPECT_EQ(alice_ended, 1);
  EXPECT_EQ(bob_ended, 0);
  EXPECT_EQ((*a)->tracked(), 1u);
  ASSERT_TRUE((*a)->Reload().ok());  // Nothing left to end for alice.
  EXPECT_EQ(alice_ended, 1);

  // A call tracked with a token revoked since its authentication is ended at once.
  int late_ended = 0;
  (*a)->Track(alice, [&] { ++late_ended; });
  EXPECT_EQ(late_ended, 1);
  EXPECT_EQ((*a)->tracked(), 1u);
  (*a)->Untrack(bob_handle);
  EXPECT_EQ((*a)->tracked(), 0u);
  EXPECT_EQ(bob_ended, 0);
}

// The caller frees what `end` uses once Untrack() returns (a reactor deletes itself in
// OnDone), so an Untrack() on another thread must wait for a running `end`.
TEST(AuthenticatorTest, UntrackFromAnotherThreadReturnsOnlyAfterARunningEndReturns) {
  TempDir dir;
  const std::string path = dir.Sub("tokens.yaml");
  WriteFile(path, "tokens:\n" + Entry("alice", "research", "user", "ul_alice"));
  auto a = Authenticator::Create(path, {});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::Notification end_started;
  absl::Notification untrack_returned;
  bool untrack_returned_during_end = false;
  const uint64_t handle = (*a)->Track(*(*a)->LookupToken("ul_alice"), [&] {
    end_started.Notify();
    // Untrack() must not return while this runs: the wait below times out unless it does.
    untrack_returned_during_end =
        untrack_returned.WaitForNotificationWithTimeout(absl::Milliseconds(500));
  });
  WriteFile(path, "tokens:\n" + Entry("bob", "research", "user", "ul_bob"));
  std::thread reload([&] { EXPECT_TRUE((*a)->Reload().ok()); });
  end_started.WaitForNotification();
  (*a)->Untrack(handle);
  untrack_returned.Notify();
  reload.join();
  EXPECT_FALSE(untrack_returned_during_end);
  EXPECT_EQ((*a)->tracked(), 0u);
}

TEST(AuthenticatorTest, CreateRefusesAnInvalidTokenFile) {
  TempDir dir;
  WriteFile(dir.Sub("t.yaml"), "tokens: {}\n");
  auto a = Authenticator::Create(dir.Sub("t.yaml"), {});
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(absl::StrContains(a.status().message(), "t.yaml")) << a.status();
  EXPECT_FALSE(Authenticator::Create(dir.Sub("missing.yaml"), {}).ok());
}

TEST(PermissionsTest, TheTableGivesEachRoleExactlyItsRpcs) {
  std::set<std::string> names;
  for (Rpc rpc : kAllRpcs) {
    names.insert(RpcName(rpc));
    EXPECT_TRUE(RoleMayCall(Role::kAdmin, rpc)) << RpcName(rpc);
  }
  EXPECT_EQ(names.size(), std::size(kAllRpcs));  // One row per RPC, distinct names.
  for (Rpc rpc : {Rpc::kSubmitJob, Rpc::kCancelJob, Rpc::kResumeJob}) {
    EXPECT_TRUE(RoleMayCall(Role::kUser, rpc));
    EXPECT_FALSE(RoleMayCall(Role::kViewer, rpc)) << RpcName(rpc);
    EXPECT_FALSE(RoleMayCall(Role::kWorker, rpc)) << RpcName(rpc);
  }
  for (Rpc rpc :
       {Rpc::kGetJob, Rpc::kListJobs, Rpc::kWatchJob, Rpc::kGetJobLogs, Rpc::kListWorkers}) {
    EXPECT_TRUE(RoleMayCall(Role::kUser, rpc));
    EXPECT_TRUE(RoleMayCall(Role::kViewer, rpc));
    EXPECT_FALSE(RoleMayCall(Role::kWorker, rpc)) << RpcName(rpc);
  }
  EXPECT_FALSE(RoleMayCall(Role::kUser, Rpc::kBackupState));  // Admins only.
  EXPECT_FALSE(RoleMayCall(Role::kViewer, Rpc::kBackupState));
  EXPECT_FALSE(RoleMayCall(Role::kWorker, Rpc::kBackupState));
  for (Rpc rpc : {Rpc::kRegister, Rpc::kSession}) {
    EXPECT_TRUE(RoleMayCall(Role::kWorker, rpc));
    EXPECT_FALSE(RoleMayCall(Role::kUser, rpc)) << RpcName(rpc);
    EXPECT_FALSE(RoleMayCall(Role::kViewer, rpc)) << RpcName(rpc);
  }
}

TEST(PrincipalTest, WorkersActOnlyAsThemselvesAdminsAsAnyone) {
  Principal w1{"w1", "", Role::kWorker, true};
  Principal admin{"root", "default", Role::kAdmin, false};
  Principal user{"w1", "research", Role::kUser, false};
  EXPECT_TRUE(MayActAsWorker(w1, "w1"));
  EXPECT_FALSE(MayActAsWorker(w1, "w2"));
  EXPECT_TRUE(MayActAsWorker(admin, "w2"));
  EXPECT_FALSE(MayActAsWorker(user, "w1"));  // A user named like a worker is not it.
  // A worker's certificate and its worker token are one identity; an admin is another.
  Principal w1_token{"w1", "infra", Role::kWorker, false};
  EXPECT_EQ(w1.WorkerIdentity(), w1_token.WorkerIdentity());
  EXPECT_NE(w1.WorkerIdentity(), admin.WorkerIdentity());
}

TEST(BootstrapTest, AdminTokenIsCreatedPrivateAndReusedOnTheNextStart) {
  TempDir dir;
  absl::StatusOr<TokenEntry> first = EnsureAdminToken(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string path = dir.Sub(kAdminTokenFile);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string token = ReadFile(path);
  ASSERT_FALSE(token.empty());
  token.pop_back();  // Newline.
  EXPECT_EQ(first->sha256_hex, Sha256Hex(token));
  EXPECT_EQ(first->role, Role::kAdmin);
  absl::StatusOr<TokenEntry> second = EnsureAdminToken(dir.path());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->sha256_hex, first->sha256_hex);

  chmod(path.c_str(), 0644);
  absl::StatusOr<TokenEntry> exposed = EnsureAdminToken(dir.path());
  ASSERT_FALSE(exposed.ok());
  EXPECT_TRUE(absl::StrContains(exposed.status().message(), "chmod 600")) << exposed.status();
}

TEST(BootstrapTest, ClientConfigNamesServerCaAndTokenFile) {
  TempDir dir;
  absl::StatusOr<std::string> path = WriteClientConfig(dir.path(), "127.0.0.1:1234", "/x/ca.pem");
  ASSERT_TRUE(path.ok()) << path.status();
  const std::string text = ReadFile(*path);
  EXPECT_TRUE(absl::StrContains(text, "current-context: local")) << text;
  EXPECT_TRUE(absl::StrContains(text, "server: 127.0.0.1:1234")) << text;
  EXPECT_TRUE(absl::StrContains(text, "ca: /x/ca.pem")) << text;
  EXPECT_TRUE(absl::StrContains(text, "token_file: " + dir.Sub(kAdminTokenFile))) << text;
  absl::StatusOr<std::string> plain = WriteClientConfig(dir.path(), "127.0.0.1:1234", "");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(absl::StrContains(ReadFile(*plain), "ca:"));
}

TEST(BootstrapTest, ClientConfigPathsAreAbsoluteWhenGivenRelative) {
  // The coordinator may be started with a relative --state-dir and --tls-client-ca; the
  // config it writes is read from any working directory, so both paths must be absolute.
  TempDir dir;
  const std::string cwd = std::filesystem::current_path().string();
  std::filesystem::current_path(dir.path());
  std::filesystem::create_directory("state");
  absl::StatusOr<std::string> path = WriteClientConfig("state", "127.0.0.1:1", "certs/ca.pem");
  const std::string text = path.ok() ? ReadFile(*path) : "";
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(path.ok()) << path.status();
  const std::string abs_dir = std::filesystem::canonical(dir.path()).string();
  EXPECT_TRUE(absl::StrContains(text, "ca: " + abs_dir + "/certs/ca.pem")) << text;
  EXPECT_TRUE(absl::StrContains(text, "token_file: " + abs_dir + "/state/" + kAdminTokenFile))
      << text;
}

TEST(DevCertsTest, ScriptMakesACaServerAndWorkerCertsWithPrivateKeys) {
  const ::ulysses::testing::DevCerts& c = ::ulysses::testing::TestCerts({"w1"});
  for (const std::string& f : {c.ca, c.server_cert, c.WorkerCert("w1")}) {
    EXPECT_TRUE(absl::StrContains(ReadFile(f), "BEGIN CERTIFICATE")) << f;
  }
  for (const std::string& f : {c.ca_key, c.server_key, c.WorkerKey("w1")}) {
    struct stat st;
    ASSERT_EQ(stat(f.c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
  }
  // Idempotent: a second worker is added, the CA and w1 are kept.
  const std::string ca = ReadFile(c.ca);
  const std::string w1 = ReadFile(c.WorkerCert("w1"));
  ::ulysses::testing::TestCerts({"w2"});
  EXPECT_EQ(ReadFile(c.ca), ca);
  EXPECT_EQ(ReadFile(c.WorkerCert("w1")), w1);
  EXPECT_TRUE(absl::StrContains(ReadFile(c.WorkerCert("w2")), "BEGIN CERTIFICATE"));
}

}  // namespace
}  // namespace ulysses::coordinator::auth
