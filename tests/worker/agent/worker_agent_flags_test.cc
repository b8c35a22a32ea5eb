// ulysses-worker's flags and credentials: CLI11 and validation errors exit 2 naming the flag,
// the bearer token on every call, mutual TLS (tests/testing/certs.h). The rig is
// worker_agent_fixture.h.
#include "tests/worker/agent/worker_agent_fixture.h"

namespace ulysses::agent {
namespace {

// Runs ulysses-worker with `flags` to its exit; returns its exit description and output.
std::pair<std::string, std::string> RunWorkerWithFlags(const std::vector<std::string>& flags) {
  std::string out;
  ChildCallbacks cb;
  cb.on_log = [&out](const std::string&, const std::string& line) { out += line + "\n"; };
  std::vector<std::string> argv = {BinDir() + "/ulysses-worker"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto worker = ChildSupervisor::Start(argv, "", std::move(cb));
  if (!worker.ok()) return {std::string(worker.status().message()), ""};
  ChildResult result = (*worker)->Wait();
  return {result.description, out};
}

TEST_F(WorkerAgentTest, FlagsCli11RejectsExit2) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--coordinator", "127.0.0.1:1", "--name", "x", "--work-dir",
                                 work_dir_, "--no-such-flag"},
        std::vector<std::string>{"--name", "x", "--work-dir", work_dir_}}) {
    std::string err;
    ChildCallbacks cb;
    cb.on_log = [&](const std::string&, const std::string& line) { err += line + "\n"; };
    std::vector<std::string> argv = {BinDir() + "/ulysses-worker"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto worker = ChildSupervisor::Start(argv, "", std::move(cb));
    ASSERT_TRUE(worker.ok());
    EXPECT_EQ((*worker)->Wait().description, "exit code 2") << err;
    EXPECT_FALSE(err.empty());
  }
}

// Values that parse but are invalid: the config's own validation.
TEST_F(WorkerAgentTest, RejectsBadFlagsWithTheFlagName) {
  auto [exit, out] = RunWorkerWithFlags(
      {"--coordinator", "nohostport", "--name", "x", "--work-dir", work_dir_, "--device", "tpu",
       "--engine-bin", FAKE_RANK_PATH, "--collective-timeout-s", "-5", "--fabric", "myrinet"});
  EXPECT_EQ(exit, "exit code 2");
  EXPECT_NE(out.find("--coordinator: \"nohostport\" is not HOST:PORT"), std::string::npos) << out;
  EXPECT_NE(out.find("--devices: \"tpu\" has \"tpu\", which is not cuda:N"), std::string::npos)
      << out;
  EXPECT_NE(out.find("--collective-timeout-s: -5 is out of range (use 0..86400"), std::string::npos)
      << out;
  EXPECT_NE(out.find("--fabric: \"myrinet\" is not a fabric; use auto (detect), sockets, efa, "
                     "tcpxo or ib"),
            std::string::npos)
      << out;
}

// Flags the command-line parser itself refuses (not a number, unknown, missing): the
// same exit 2 of the flag contract, naming the flag.
TEST_F(WorkerAgentTest, FlagParseErrorsExit2WithTheFlagName) {
  const std::vector<std::string> good = {"--coordinator", "127.0.0.1:1", "--name", "x",
                                         "--work-dir",    work_dir_};
  struct Case {
    std::vector<std::string> extra;
    bool drop_name;
    std::string flag;
  };
  for (const Case& c :
       {Case{{"--grace-period-s", "soon"}, false, "--grace-period-s"},
        Case{{"--no-such-flag"}, false, "--no-such-flag"}, Case{{}, true, "--name"}}) {
    SCOPED_TRACE(c.flag);
    std::vector<std::string> flags = good;
    if (c.drop_name) flags.erase(flags.begin() + 2, flags.begin() + 4);
    flags.insert(flags.end(), c.extra.begin(), c.extra.end());
    auto [exit, out] = RunWorkerWithFlags(flags);
    EXPECT_EQ(exit, "exit code 2") << out;
    EXPECT_NE(out.find(c.flag), std::string::npos) << out;
  }
}

// The token (--token-file, $ULYSSES_TOKEN) goes on Register and on the Session stream.
TEST_F(WorkerAgentTest, SendsTheTokenOnRegisterAndSession) {
  std::ofstream(dir_.Sub("token")) << "ul_worker-token\n";
  PeerServer peer;
  StartWorker(peer.port, 10, {"--token-file", dir_.Sub("token")});
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  std::vector<PeerCoordinator::Caller> callers = peer.service.Callers();
  ASSERT_GE(callers.size(), 2u);
  for (const auto& c : callers) {
    SCOPED_TRACE(c.rpc);
    EXPECT_EQ(c.authorization, "Bearer ul_worker-token");
    EXPECT_EQ(c.transport, "insecure");
  }
  EXPECT_EQ(callers[0].rpc, "Register");
  EXPECT_EQ(callers[1].rpc, "Session");
  worker_.reset();

  setenv("ULYSSES_TOKEN", "ul_from_env", 1);
  PeerServer env_peer;
  StartWorker(env_peer.port);
  unsetenv("ULYSSES_TOKEN");
  ASSERT_TRUE(env_peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  for (const auto& c : env_peer.service.Callers()) EXPECT_EQ(c.authorization, "Bearer ul_from_env");
}

// --ca/--cert/--key: TLS to the coordinator, presenting the worker's certificate.
TEST_F(WorkerAgentTest, MutualTlsPresentsTheWorkerCertificate) {
  const auto& certs = ::ulysses::testing::TestCerts({"w1", "w2"});
  PeerServer peer(0, /*tls=*/true);
  ASSERT_GT(peer.port, 0);
  std::ofstream(dir_.Sub("token")) << "ul_w1\n";
  StartWorker(peer.port, 10,
              {"--ca", certs.ca, "--cert", certs.WorkerCert("w1"), "--key", certs.WorkerKey("w1"),
               "--token-file", dir_.Sub("token")},
              "localhost");
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  std::vector<PeerCoordinator::Caller> callers = peer.service.Callers();
  ASSERT_GE(callers.size(), 2u);
  for (const auto& c : callers) {
    SCOPED_TRACE(c.rpc);
    EXPECT_EQ(c.transport, "ssl");
    EXPECT_EQ(c.client_cn, "w1");
    EXPECT_EQ(c.authorization, "Bearer ul_w1");
  }
  EXPECT_NE(WorkerLog().find("(mutual TLS, token)"), std::string::npos) << WorkerLog();
}

// A worker without a client certificate cannot reach a server that requires one.
TEST_F(WorkerAgentTest, WithoutAClientCertificateTheTlsPeerNeverSeesACall) {
  const auto& certs = ::ulysses::testing::TestCerts({"w1", "w2"});
  PeerServer peer(0, /*tls=*/true);
  ASSERT_GT(peer.port, 0);
  StartWorker(peer.port, 10, {"--ca", certs.ca});
  // Two failed attempts (the TLS handshake fails), and no call got through.
  const std::string failed = "coordinator session ended (UNAVAILABLE";
  ASSERT_TRUE(WaitForLog(failed, seconds(20))) << WorkerLog();
  ASSERT_TRUE(WaitForLog(failed, seconds(20), WorkerLog().find(failed) + 1)) << WorkerLog();
  EXPECT_TRUE(peer.service.Callers().empty());
  EXPECT_TRUE(peer.service.Registers().empty());
}

TEST_F(WorkerAgentTest, RejectsBadCredentialFlagsWithTheFlagName) {
  const std::vector<std::string> good = {"--name",       "x",           "--work-dir", work_dir_,
                                         "--engine-bin", FAKE_RANK_PATH};
  std::ofstream(dir_.Sub("token")) << "ul_t\n";
  struct Case {
    std::vector<std::string> extra;
    std::string expected;
  };
  const Case cases[] = {
      {{"--coordinator", "10.1.2.3:50051"},
       "--coordinator: \"10.1.2.3:50051\" is not a loopback address"},
      {{"--coordinator", "127.0.0.1:1", "--ca", dir_.Sub("missing.pem")},
       "--ca: cannot read \"" + dir_.Sub("missing.pem") + "\""},
      {{"--coordinator", "127.0.0.1:1", "--ca", dir_.Sub("token"), "--cert", dir_.Sub("token")},
       "give both (mutual TLS) or neither"},
      {{"--coordinator", "127.0.0.1:1", "--token-file", dir_.Sub("none")},
       "--token-file: cannot read"},
      {{"--coordinator", "127.0.0.1:1", "--token-file", dir_.Sub("token"), "--token", "ul_x"},
       "keep one"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    std::vector<std::string> flags = good;
    flags.insert(flags.end(), c.extra.begin(), c.extra.end());
    auto [exit, out] = RunWorkerWithFlags(flags);
    EXPECT_EQ(exit, "exit code 2") << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << out;
  }
  // --insecure allows plaintext off loopback: the flags pass and the agent starts.
  StartWorker(1, 10, {"--insecure"}, "10.1.2.3");
  EXPECT_TRUE(WaitForLog("-> coordinator 10.1.2.3:1 (plaintext, no token)", seconds(20)))
      << WorkerLog();
}

}  // namespace
}  // namespace ulysses::agent
