// Runs the real ulysses-worker binary against a test-side WorkerService peer (the
// coordinator is built in parallel; tests/e2e covers the real one) with fake_rank as
// the engine: registration, assignment -> child -> acked reports, abort, SIGTERM
// preemption, and reconnect to a restarted coordinator with the child still running.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/contract/exit.h"
#include "tests/worker/agent/worker_agent_fixture.h"

namespace ulysses::agent {
namespace {

TEST_F(WorkerAgentTest, RunsAnAssignmentAndReportsEverything) {
  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  Regs regs = peer.service.Registers();
  ASSERT_FALSE(regs.empty());
  EXPECT_EQ(regs[0].name(), "t0");
  EXPECT_EQ(regs[0].device(), "cpu");
  EXPECT_EQ(regs[0].host(), "127.0.0.1");
  EXPECT_FALSE(regs[0].has_running());

  ASSERT_TRUE(peer.service.Send(Assign(1, {"fake.steps=3"})));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)))
      << WorkerLog();
  const Msgs msgs = peer.service.Messages();
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kStarted), 1);
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kProgress), 3);
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kCheckpoint), 1);
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kEval), 1);
  const v1::AttemptExited* exited = Exited(msgs);
  EXPECT_EQ(exited->exit_code(), 0);
  EXPECT_FALSE(exited->preempted());
  EXPECT_FALSE(exited->aborted());
  EXPECT_EQ(exited->ref().job_id(), "job-000001");
  EXPECT_EQ(exited->ref().generation(), 1);
  for (const auto& m : msgs) {
    if (m.has_progress()) {
      EXPECT_EQ(m.progress().progress().steps(), 3);
      EXPECT_GT(m.progress().progress().loss(), 0);
    }
    if (m.has_checkpoint()) {
      EXPECT_EQ(m.checkpoint().checkpoint().path(), "/tmp/ckpt/final");
    }
    if (m.has_eval()) {
      EXPECT_EQ(m.eval().result().seq_len(), 128);
      EXPECT_DOUBLE_EQ(m.eval().result().accuracy(), 0.25);
    }
  }
  // The spec was written under the work dir and the logs include the agent's notes.
  EXPECT_TRUE(fs::exists(fs::path(work_dir_) / "jobs/job-000001/g1-s0-r0/job.yaml"));
  bool saw_agent_note = false;
  for (const auto& m : msgs) {
    for (const auto& line : m.logs().lines()) {
      saw_agent_note |= line.stream() == v1::LOG_STREAM_AGENT &&
                        line.text().find("started rank 0/1") != std::string::npos;
    }
  }
  EXPECT_TRUE(saw_agent_note);
}

// The coordinator stretches the heartbeat interval as the cluster grows (Ack's
// heartbeat_interval_ms, docs/COORDINATOR.md "Worker liveness"): the agent heartbeats at
// the new interval from then on, and ignores one outside 100 ms .. 1 h.
TEST_F(WorkerAgentTest, AnAckedHeartbeatIntervalIsTheAgentsNewRate) {
  PeerServer peer;
  StartWorker(peer.port);  // Registered with a 100 ms interval.
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  auto ack_with_interval = [](int64_t ms) {
    v1::CoordinatorMessage m;
    m.mutable_ack()->set_result(v1::ACK_CODE_OK);
    m.mutable_ack()->set_heartbeat_interval_ms(ms);
    return m;
  };
  ASSERT_TRUE(peer.service.Send(ack_with_interval(800)));
  ASSERT_TRUE(WaitForLog("heartbeat every 800 ms (asked by the coordinator)", seconds(20)))
      << WorkerLog();
  // Out of range: ignored with a warning, the 800 ms stay.
  ASSERT_TRUE(peer.service.Send(ack_with_interval(5)));
  ASSERT_TRUE(WaitForLog("coordinator asked for a heartbeat every 5 ms; ignored", seconds(20)))
      << WorkerLog();
  // The heartbeat already scheduled at the old rate may still come; count from the next.
  const size_t from = peer.service.HeartbeatTimes().size() + 1;
  ASSERT_TRUE(
      PollUntil([&] { return peer.service.HeartbeatTimes().size() >= from + 3; }, seconds(30)))
      << WorkerLog();
  const auto times = peer.service.HeartbeatTimes();
  for (size_t i = from + 1; i < times.size(); ++i) {
    // 800 ms apart (a loaded machine only delays them); at the registered 100 ms they
    // would be about 100 ms apart.
    EXPECT_GE(times[i] - times[i - 1], milliseconds(700)) << "heartbeat " << i;
  }
}

TEST_F(WorkerAgentTest, FailureExitCarriesTheStderrReason) {
  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  ASSERT_TRUE(peer.service.Send(Assign(4, {"fake.steps=0", "fake.exit=2"})));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)));
  const Msgs msgs = peer.service.Messages();
  const v1::AttemptExited* exited = Exited(msgs);
  EXPECT_EQ(exited->exit_code(), 2);
  EXPECT_NE(exited->error_message().find("not divisible by sp_degree"), std::string::npos)
      << exited->error_message();
}

// The finding: when rank 0 could not bind its rendezvous port (another coordinator's job on
// the host held it), the other ranks joined whichever store answered there and failed later
// with an unrelated gloo error, and rank 0's bind error was not the job's reason. The agent of
// rank 0 checks the port is free on its host before starting the rank: a held port ends the
// attempt at once (exit 69: retried) with the port and the fix.
TEST_F(WorkerAgentTest, ABusyRendezvousPortFailsRankZeroBeforeItStarts) {
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(held, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(held, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  v1::CoordinatorMessage m = Assign(4, {"fake.steps=1"});
  m.mutable_assignment()->set_world_size(2);
  m.mutable_assignment()->set_master_port(port);
  ASSERT_TRUE(peer.service.Send(m));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)));
  close(held);
  const Msgs msgs = peer.service.Messages();
  const v1::AttemptExited* exited = Exited(msgs);
  EXPECT_EQ(exited->exit_code(), contract::kExitPeerLost);
  EXPECT_NE(exited->error_message().find(absl::StrCat("port ", port, " on ")), std::string::npos)
      << exited->error_message();
  EXPECT_NE(exited->error_message().find("rendezvous_port_min..rendezvous_port_max"),
            std::string::npos)
      << exited->error_message();
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kStarted), 0) << "the rank started anyway";
}

TEST_F(WorkerAgentTest, AbortKillsTheChildPromptly) {
  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  ASSERT_TRUE(peer.service.Send(Assign(2, {"fake.steps=100000", "fake.step_ms=20"})));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 2; },
      seconds(20)));
  v1::CoordinatorMessage abort;
  abort.mutable_abort()->mutable_ref()->set_job_id("job-000001");
  abort.mutable_abort()->mutable_ref()->set_generation(2);
  abort.mutable_abort()->set_reason("peer lost");
  abort.mutable_abort()->set_grace_period_ms(500);
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(peer.service.Send(abort));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(10)));
  EXPECT_LT(std::chrono::steady_clock::now() - sent, seconds(5));
  const Msgs msgs = peer.service.Messages();
  EXPECT_TRUE(Exited(msgs)->aborted());
  // The worker itself is still alive and idle.
  EXPECT_TRUE(worker_->Running());
}

// A worker with several slots (--devices cpu --capacity 2; a GPU node's worker has one per
// GPU): two ranks run at once, each on its assigned slot, heartbeats report both, and one
// Abort stops every rank of that generation on the worker. An assignment to a slot the
// worker does not have is refused with an exit report naming it.
TEST_F(WorkerAgentTest, ATwoSlotWorkerRunsTwoRanksAtOnceAndOneAbortStopsBoth) {
  PeerServer peer;
  StartWorker(peer.port, 10, {"--devices", "cpu", "--capacity", "2"});
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  const v1::RegisterRequest reg = peer.service.Registers().front();
  EXPECT_EQ(reg.capacity(), 2);
  EXPECT_EQ(std::vector<std::string>(reg.devices().begin(), reg.devices().end()),
            (std::vector<std::string>{"cpu", "cpu"}));
  for (int rank = 0; rank < 2; ++rank) {
    v1::CoordinatorMessage m = Assign(4, {"fake.steps=100000", "fake.step_ms=20"});
    m.mutable_assignment()->mutable_ref()->set_rank(rank);
    m.mutable_assignment()->set_world_size(2);
    m.mutable_assignment()->set_slot(1 - rank);  // Rank 0 on slot 1, rank 1 on slot 0.
    ASSERT_TRUE(peer.service.Send(m));
  }
  // Both children run: a heartbeat lists both ranks with their slots.
  PollUntil([&] { return peer.service.LastHeartbeat().running_ranks_size() >= 2; }, seconds(20),
            milliseconds(20));
  const v1::Heartbeat hb = peer.service.LastHeartbeat();
  ASSERT_EQ(hb.running_ranks_size(), 2) << WorkerLog();
  for (const v1::RunningWork& r : hb.running_ranks()) {
    EXPECT_EQ(r.slot(), 1 - r.ref().rank()) << r.DebugString();
    EXPECT_GT(r.pid(), 0);
  }
  EXPECT_EQ(hb.running().ref().rank(), hb.running_ranks(0).ref().rank());
  Msgs msgs = peer.service.Messages();
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kStarted), 2);
  // A third rank on a slot it does not have.
  v1::CoordinatorMessage bad = Assign(4, {"fake.steps=1"});
  bad.mutable_assignment()->mutable_ref()->set_rank(2);
  bad.mutable_assignment()->set_slot(2);
  ASSERT_TRUE(peer.service.Send(bad));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kExited) >= 1; },
      seconds(10)));
  msgs = peer.service.Messages();
  ASSERT_NE(Exited(msgs), nullptr);
  EXPECT_EQ(Exited(msgs)->ref().rank(), 2);
  EXPECT_NE(Exited(msgs)->error_message().find("assigned slot 2 but has 2"), std::string::npos)
      << Exited(msgs)->error_message();
  // One abort for the generation stops both running ranks.
  v1::CoordinatorMessage abort;
  abort.mutable_abort()->mutable_ref()->set_job_id("job-000001");
  abort.mutable_abort()->mutable_ref()->set_generation(4);
  abort.mutable_abort()->set_reason("peer lost");
  abort.mutable_abort()->set_grace_period_ms(500);
  ASSERT_TRUE(peer.service.Send(abort));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kExited) >= 3; },
      seconds(10)))
      << WorkerLog();
  std::set<int> aborted;
  for (const auto& m : peer.service.Messages()) {
    if (m.has_exited() && m.exited().aborted()) aborted.insert(m.exited().ref().rank());
  }
  EXPECT_EQ(aborted, (std::set<int>{0, 1}));
  EXPECT_TRUE(worker_->Running());
}

// Per-rank metrics on --metrics-listen (a real scrape over loopback): exactly the
// worker's rows of the metrics catalogue, the rank's figures from its step events with
// labels {job_id, stage, rank}, and none of the attempt's series once it ended; the agent's own
// state (slots busy/free, session, peak FLOP/s) idle or busy.
TEST_F(WorkerAgentTest, ServesTheRanksMetricsAndDropsThemWhenTheAttemptEnds) {
  PeerServer peer;
  const int metrics_port = ::ulysses::testing::FreeLoopbackPort();
  ASSERT_GT(metrics_port, 0);
  StartWorker(
      peer.port, 10,
      {"--metrics-listen", absl::StrCat("127.0.0.1:", metrics_port), "--peak-flops", "4e12"});
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  httplib::Client http("127.0.0.1", metrics_port);
  auto scrape = [&] {
    auto res = http.Get("/metrics");
    return res && res->status == 200 ? res->body : std::string();
  };
  // Before any work: every family of the worker, and only those (label-less ones aside,
  // they have no series yet).
  std::string body = scrape();
  std::set<std::string> exported, catalogue;
  std::istringstream lines(body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) == 0) exported.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  for (const metrics::MetricDef& def : metrics::Catalog()) {
    for (const std::string& b : def.binaries) {
      if (b == metrics::kWorkerBinary) catalogue.insert(def.name);
    }
  }
  EXPECT_EQ(exported, catalogue) << body;
  EXPECT_NE(body.find("ulysses_build_info{"), std::string::npos);
  // An idle worker says what it has: its one slot free, its session, the peak MFU divides by.
  PollUntil([&] { return scrape().find("ulysses_worker_connected 1\n") != std::string::npos; },
            seconds(20), milliseconds(20));
  body = scrape();
  for (const char* want :
       {"ulysses_worker_agent_slots{state=\"busy\"} 0\n",
        "ulysses_worker_agent_slots{state=\"free\"} 1\n", "ulysses_worker_connected 1\n",
        "ulysses_worker_peak_flops 4000000000000\n"}) {
    EXPECT_NE(body.find(want), std::string::npos) << want << body;
  }

  // generation 3, stage 0, rank 0 (Assign); the fake rank's fixed figures.
  ASSERT_TRUE(peer.service.Send(Assign(3, {"fake.steps=100000", "fake.step_ms=20"})));
  // Stage index 0 is labelled stage="1" (1-based, docs/CONTRACTS.md "Stage numbers").
  const std::string rank = "job_id=\"job-000001\",stage=\"1\",rank=\"0\"";
  PollUntil([&] { return scrape().find("ulysses_rank_steps_total{" + rank) != std::string::npos; },
            seconds(20), milliseconds(20));
  ASSERT_NE(scrape().find("ulysses_rank_steps_total{" + rank), std::string::npos) << WorkerLog();
  body = scrape();
  for (const std::string& want :
       {"ulysses_rank_step_seconds{" + rank + "} 0.05",
        "ulysses_rank_step_phase_seconds{" + rank + ",phase=\"data_wait\"} 0.01",
        "ulysses_rank_step_phase_seconds{" + rank + ",phase=\"forward\"} 0.02",
        "ulysses_rank_step_phase_seconds{" + rank + ",phase=\"backward\"} 0.015",
        "ulysses_rank_step_phase_seconds{" + rank + ",phase=\"optimizer\"} 0.005",
        "ulysses_alltoall_seconds{" + rank + "} 0.004",
        "ulysses_rank_memory_peak_bytes{" + rank + ",kind=\"allocated\"} 1048576",
        "ulysses_rank_memory_peak_bytes{" + rank + ",kind=\"reserved\"} 2097152",
        "ulysses_rank_memory_limit_bytes{" + rank + "} 8388608",
        "ulysses_rank_tokens_per_second{" + rank + "} 500",
        "ulysses_rank_mfu_ratio{" + rank + "} 0.25", "ulysses_rank_grad_norm{" + rank + "} 1.5",
        "ulysses_rank_learning_rate{" + rank + "} 0.001"}) {
    EXPECT_NE(body.find(want + "\n"), std::string::npos) << want << "\n" << body;
  }
  EXPECT_NE(body.find("ulysses_worker_agent_slots{state=\"busy\"} 1\n"), std::string::npos) << body;
  EXPECT_NE(body.find("ulysses_worker_agent_slots{state=\"free\"} 0\n"), std::string::npos) << body;
  EXPECT_NE(body.find("ulysses_alltoall_bytes_total{" + rank + "} "), std::string::npos);

  v1::CoordinatorMessage abort;
  abort.mutable_abort()->mutable_ref()->set_job_id("job-000001");
  abort.mutable_abort()->mutable_ref()->set_generation(3);
  abort.mutable_abort()->set_reason("test over");
  abort.mutable_abort()->set_grace_period_ms(500);
  ASSERT_TRUE(peer.service.Send(abort));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(10)));
  body = scrape();
  EXPECT_EQ(body.find("job-000001"), std::string::npos) << body;
  EXPECT_NE(body.find("ulysses_worker_agent_slots{state=\"busy\"} 0\n"), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE ulysses_rank_step_seconds gauge"), std::string::npos);
}

// The fabric the agent reports at registration and exports: set by --fabric here (detection
// itself: fabric_test); the log says what it is and why.
TEST_F(WorkerAgentTest, ReportsItsFabricAtRegistrationAndAsAMetric) {
  PeerServer peer;
  const int metrics_port = ::ulysses::testing::FreeLoopbackPort();
  ASSERT_GT(metrics_port, 0);
  StartWorker(peer.port, 10,
              {"--metrics-listen", absl::StrCat("127.0.0.1:", metrics_port), "--fabric", "efa"});
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20))) << WorkerLog();
  const Regs regs = peer.service.Registers();
  ASSERT_FALSE(regs.empty());
  EXPECT_EQ(regs.front().fabric(), v1::FABRIC_EFA);
  httplib::Client http("127.0.0.1", metrics_port);
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res && res->status == 200);
  EXPECT_NE(res->body.find("ulysses_worker_fabric_info{fabric=\"efa\"} 1\n"), std::string::npos)
      << res->body;
  EXPECT_NE(WorkerLog().find("fabric between nodes: efa (set by --fabric)"), std::string::npos)
      << WorkerLog();
}

TEST_F(WorkerAgentTest, MetricsListenOnABusyPortFailsTheWorker) {
  PeerServer peer;
  // A plain listening socket (no SO_REUSEPORT) holds the port.
  const int busy = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(busy, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(busy, 1), 0);
  ASSERT_EQ(getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  StartWorker(peer.port, 10, {"--metrics-listen", absl::StrCat("127.0.0.1:", port)});
  std::optional<ChildResult> r = worker_->Wait(seconds(20));
  close(busy);
  ASSERT_TRUE(r.has_value()) << "the worker kept running on a busy metrics port:\n" << WorkerLog();
  EXPECT_EQ(r->outcome, contract::RankOutcome::kFailed) << r->description;
  EXPECT_NE(WorkerLog().find(absl::StrCat("127.0.0.1:", port)), std::string::npos) << WorkerLog();
  EXPECT_EQ(peer.service.Registers().size(), 0u);  // Failed before registering.
}

TEST_F(WorkerAgentTest, SigtermPreemptsTheChildReportsAndExits) {
  PeerServer peer;
  StartWorker(peer.port, /*grace_s=*/20);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  ASSERT_TRUE(peer.service.Send(Assign(3, {"fake.steps=100000", "fake.step_ms=20"})));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 2; },
      seconds(20)));
  ASSERT_EQ(kill(worker_->pid(), SIGTERM), 0);
  auto result = worker_->Wait(seconds(20));
  ASSERT_TRUE(result.has_value()) << "worker did not exit after SIGTERM\n" << WorkerLog();
  EXPECT_EQ(result->description, "exit code 0") << WorkerLog();
  const Msgs msgs = peer.service.Messages();
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kPreempting), 1);
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kCheckpoint), 1);  // The preemption checkpoint.
  const v1::AttemptExited* exited = Exited(msgs);
  ASSERT_NE(exited, nullptr);
  EXPECT_EQ(exited->exit_code(), 75);
  EXPECT_TRUE(exited->preempted());
}

// A shutdown that arrives while an assignment is being launched still stops the new rank
// gracefully: either it never starts (reported as preempted) or it gets SIGTERM with the
// grace (never SIGKILL) and its exit is reported as preempted. The launch is held in its
// file-writing phase by making the attempt's job.yaml a FIFO that the test reads only after
// the worker has taken the SIGTERM. The worker exits cleanly and leaves no rank running.
TEST_F(WorkerAgentTest, AShutdownRacingAnAssignmentLeavesNoRankWithoutItsGracefulStop) {
  PeerServer peer;
  StartWorker(peer.port, /*grace_s=*/20);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  const fs::path attempt = fs::path(work_dir_) / "jobs" / "job-000001" / "g2-s0-r0";
  fs::create_directories(attempt);
  const std::string fifo = (attempt / "job.yaml").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << fifo;
  ASSERT_TRUE(peer.service.Send(Assign(2, {"fake.steps=100000", "fake.step_ms=20"})));
  std::ifstream spec(fifo);  // Opens once the worker opens it to write the spec.
  ASSERT_TRUE(spec.is_open());
  ASSERT_EQ(kill(worker_->pid(), SIGTERM), 0);
  ASSERT_TRUE(WaitForLog("draining", seconds(20))) << WorkerLog();
  const std::string written((std::istreambuf_iterator<char>(spec)),
                            std::istreambuf_iterator<char>());
  EXPECT_NE(written.find("TrainJob"), std::string::npos) << written;
  auto result = worker_->Wait(seconds(60));
  ASSERT_TRUE(result.has_value()) << "worker did not exit after SIGTERM\n" << WorkerLog();
  EXPECT_EQ(result->description, "exit code 0") << WorkerLog();
  const Msgs msgs = peer.service.Messages();
  int64_t started_pid = 0;
  const v1::AttemptExited* exited = nullptr;
  for (const auto& m : msgs) {
    if (m.has_started() && m.started().ref().generation() == 2) started_pid = m.started().pid();
    if (m.has_exited() && m.exited().ref().generation() == 2) exited = &m.exited();
  }
  ASSERT_NE(exited, nullptr) << "the assignment's exit was never reported\n" << WorkerLog();
  EXPECT_TRUE(exited->preempted()) << exited->error_message() << "\n" << WorkerLog();
  EXPECT_FALSE(exited->aborted());
  if (started_pid != 0) {
    EXPECT_NE(exited->signal(), SIGKILL) << "the rank was killed, not stopped gracefully\n"
                                         << WorkerLog();
    EXPECT_NE(kill(static_cast<pid_t>(started_pid), 0), 0) << "the rank still runs";
  }
}

// A priority preemption (Abort with preempt): the rank checkpoints and exits 75, the exit
// is reported as preempted (not aborted), no `preempting` notice (the worker is not
// draining), and the worker stays up and takes the next assignment.
TEST_F(WorkerAgentTest, APreemptingAbortCheckpointsAndKeepsTheWorker) {
  PeerServer peer;
  StartWorker(peer.port);
  ASSERT_TRUE(peer.service.WaitForSession(1, seconds(20)));
  ASSERT_TRUE(peer.service.Send(Assign(5, {"fake.steps=100000", "fake.step_ms=20"})));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 2; },
      seconds(20)));
  v1::CoordinatorMessage preempt;
  preempt.mutable_abort()->mutable_ref()->set_job_id("job-000001");
  preempt.mutable_abort()->mutable_ref()->set_generation(5);
  preempt.mutable_abort()->set_reason("preempted for job-000002");
  preempt.mutable_abort()->set_grace_period_ms(20000);
  preempt.mutable_abort()->set_preempt(true);
  ASSERT_TRUE(peer.service.Send(preempt));
  ASSERT_TRUE(
      peer.service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)))
      << WorkerLog();
  Msgs msgs = peer.service.Messages();
  const v1::AttemptExited* exited = Exited(msgs);
  EXPECT_EQ(exited->exit_code(), 75);
  EXPECT_TRUE(exited->preempted());
  EXPECT_FALSE(exited->aborted());
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kCheckpoint), 1);  // The preemption checkpoint.
  EXPECT_EQ(Count(msgs, v1::WorkerMessage::kPreempting), 0);
  EXPECT_TRUE(worker_->Running());
  ASSERT_TRUE(peer.service.Send(Assign(6, {"fake.steps=1"})));
  ASSERT_TRUE(peer.service.WaitFor(
      [](const Msgs& m, const Regs&) {
        for (const auto& x : m) {
          if (x.has_exited() && x.exited().ref().generation() == 6) return true;
        }
        return false;
      },
      seconds(20)))
      << WorkerLog();
}

// What CLI11 rejects (an unknown flag, a missing required one) is bad input: exit 2.
TEST_F(WorkerAgentTest, ReconnectsToARestartedCoordinatorWithoutKillingTheChild) {
  auto peer = std::make_unique<PeerServer>();
  const int port = peer->port;
  StartWorker(port);
  ASSERT_TRUE(peer->service.WaitForSession(1, seconds(20)));
  // ~3 s of work: it must survive the coordinator's absence.
  ASSERT_TRUE(peer->service.Send(Assign(7, {"fake.steps=150", "fake.step_ms=20"})));
  ASSERT_TRUE(peer->service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 1; },
      seconds(20)));
  peer.reset();  // Coordinator gone.
  peer = std::make_unique<PeerServer>(port);
  ASSERT_EQ(peer->port, port);
  ASSERT_TRUE(peer->service.WaitFor(
      [](const Msgs&, const Regs& r) { return !r.empty() && r.back().has_running(); }, seconds(20)))
      << WorkerLog();
  const Regs regs = peer->service.Registers();
  EXPECT_EQ(regs.back().running().ref().job_id(), "job-000001");
  EXPECT_EQ(regs.back().running().ref().generation(), 7);
  EXPECT_GT(regs.back().running().pid(), 0);
  // The child ran on and its success is reported to the new coordinator.
  ASSERT_TRUE(
      peer->service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(30)))
      << WorkerLog();
  EXPECT_EQ(Exited(peer->service.Messages())->exit_code(), 0);
}

TEST_F(WorkerAgentTest, ARankThatEndedWhileDisconnectedIsClaimedUntilItsExitIsAcked) {
  auto peer = std::make_unique<PeerServer>();
  const int port = peer->port;
  StartWorker(port);
  ASSERT_TRUE(peer->service.WaitForSession(1, seconds(20)));
  ASSERT_TRUE(peer->service.Send(Assign(9, {"fake.steps=25", "fake.step_ms=20"})));
  ASSERT_TRUE(peer->service.WaitFor(
      [](const Msgs& m, const Regs&) { return Count(m, v1::WorkerMessage::kProgress) >= 1; },
      seconds(20)));
  peer.reset();
  // The rank finishes while nobody listens.
  PollUntil([&] { return WorkerLog().find("exit code 0 -> succeeded") != std::string::npos; },
            seconds(20), milliseconds(20));
  ASSERT_NE(WorkerLog().find("exit code 0 -> succeeded"), std::string::npos) << WorkerLog();
  peer = std::make_unique<PeerServer>(port);
  ASSERT_TRUE(
      peer->service.WaitFor([](const Msgs& m, const Regs&) { return Exited(m); }, seconds(20)))
      << WorkerLog();
  const Regs regs = peer->service.Registers();
  ASSERT_FALSE(regs.empty());
  EXPECT_EQ(regs.front().running().ref().generation(), 9) << "the ended rank was not claimed";
  EXPECT_EQ(Exited(peer->service.Messages())->exit_code(), 0);
}

}  // namespace
}  // namespace ulysses::agent
