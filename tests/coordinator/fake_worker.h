// FakeWorker: a protocol peer for coordinator tests and the load generator. It speaks
// WorkerService over a real gRPC channel exactly as ulysses-worker does (Register, then
// a Session stream with hello, heartbeats and reports) but runs no training child:
// the test decides what the "child" reports. Thread-safe.
#ifndef ULYSSES_TESTS_COORDINATOR_FAKE_WORKER_H_
#define ULYSSES_TESTS_COORDINATOR_FAKE_WORKER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/grpc/grpc_util.h"
#include "gtest/gtest.h"
#include "ulysses/v1/worker_service.grpc.pb.h"

namespace ulysses::coordinator::testing {

// What rank 0 leaves on disk when it commits (the engine's layout, checkpoint.h): one shard
// and manifest.json of `stage` and `step` (no owner: as a build before owners). The coordinator
// reads it before a job is SUCCEEDED (coordinator/checkpoint_verify.h).
inline void WriteCommittedCheckpoint(const std::string& path, int stage, int64_t step) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  ASSERT_FALSE(ec) << path << ": " << ec.message();
  { std::ofstream(path + "/shard-0-of-1.bin", std::ios::binary) << std::string(16, 'x'); }
  std::ofstream(path + "/manifest.json")
      << "{\"format\": \"ulysses-checkpoint\", \"version\": 2, \"stage\": " << stage
      << ", \"step_in_stage\": " << step
      << ", \"shards\": [{\"file\": \"shard-0-of-1.bin\", \"bytes\": 16}]}";
}

class FakeWorker {
 public:
  FakeWorker(std::shared_ptr<grpc::Channel> channel, std::string name, std::string node_label = "",
             std::string host = "127.0.0.1")
      : stub_(v1::WorkerService::NewStub(channel)),
        name_(std::move(name)),
        node_label_(std::move(node_label)),
        host_(std::move(host)) {}
  ~FakeWorker() { Disconnect(); }
  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  // The host the next Register reports.
  void set_host(std::string host) { host_ = std::move(host); }

  absl::Status Register(const std::optional<v1::WorkRef>& running = std::nullopt,
                        bool* keep_running = nullptr) {
    v1::RegisterRequest req;
    req.set_name(name_);
    req.set_node_label(node_label_);
    req.set_device("cpu");
    req.set_host(host_);
    req.set_capacity(1);
    if (running) *req.mutable_running()->mutable_ref() = *running;
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineAfter(&ctx, absl::Seconds(10));
    absl::Status s = FromGrpcStatus(stub_->Register(&ctx, req, &resp));
    if (s.ok()) {
      worker_id_ = resp.worker_id();
      heartbeat_interval_ms_ = resp.heartbeat_interval_ms();
      if (keep_running) *keep_running = resp.keep_running();
    }
    return s;
  }

  // Opens the Session and sends hello; a reader thread collects coordinator messages.
  void Connect() {
    Disconnect();
    ctx_ = std::make_unique<grpc::ClientContext>();
    SetDeadlineAfter(ctx_.get(), absl::Minutes(10));
    stream_ = stub_->Session(ctx_.get());
    closed_ = false;
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(worker_id_);
    Send(std::move(hello));
    reader_ = std::thread([this] {
      v1::CoordinatorMessage msg;
      while (stream_->Read(&msg)) {
        std::lock_guard<std::mutex> lock(mu_);
        inbox_.push_back(msg);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      cv_.notify_all();
    });
  }

  // Simulates a crash/network cut: cancels the stream without a goodbye.
  // Ends the session; returns how the stream ended (CANCELLED when it was still open).
  grpc::Status Disconnect() {
    StopHeartbeats();
    if (!stream_) return grpc::Status::OK;
    if (!closed()) ctx_->TryCancel();
    if (reader_.joinable()) reader_.join();
    grpc::Status status = stream_->Finish();
    stream_.reset();
    ctx_.reset();
    return status;
  }

  bool Send(v1::WorkerMessage msg, uint64_t* seq_out = nullptr) {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (!stream_) return false;
    msg.set_seq(next_seq_++);
    if (seq_out) *seq_out = msg.seq();
    return stream_->Write(msg);
  }

  uint64_t Heartbeat(bool request_ack = false) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_request_ack(request_ack);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_) *m.mutable_heartbeat()->mutable_running()->mutable_ref() = *running_;
    }
    uint64_t seq = 0;
    Send(std::move(m), &seq);
    return seq;
  }

  void StartHeartbeats(std::chrono::milliseconds every) {
    StopHeartbeats();
    hb_stop_ = false;
    hb_thread_ = std::thread([this, every] {
      std::unique_lock<std::mutex> lock(hb_mu_);
      while (!hb_stop_) {
        lock.unlock();
        Heartbeat();
        lock.lock();
        hb_cv_.wait_for(lock, every, [this] { return hb_stop_; });
      }
    });
  }
  void StopHeartbeats() {
    {
      std::lock_guard<std::mutex> lock(hb_mu_);
      hb_stop_ = true;
    }
    hb_cv_.notify_all();
    if (hb_thread_.joinable()) hb_thread_.join();
  }

  void SetRunning(const std::optional<v1::WorkRef>& ref) {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = ref;
  }

  uint64_t Started(const v1::WorkRef& ref) {
    SetRunning(ref);
    v1::WorkerMessage m;
    *m.mutable_started()->mutable_ref() = ref;
    m.mutable_started()->set_pid(4242);
    uint64_t seq = 0;
    Send(std::move(m), &seq);
    return seq;
  }
  uint64_t Progress(const v1::WorkRef& ref, int64_t step, double loss, double tps = 1000) {
    v1::WorkerMessage m;
    *m.mutable_progress()->mutable_ref() = ref;
    v1::StepProgress* p = m.mutable_progress()->mutable_progress();
    p->set_stage(ref.stage());
    p->set_step(step);
    p->set_loss(loss);
    p->set_tokens_per_s(tps);
    uint64_t seq = 0;
    Send(std::move(m), &seq);
    return seq;
  }
  uint64_t Checkpoint(const v1::WorkRef& ref, int64_t step, const std::string& path) {
    v1::WorkerMessage m;
    *m.mutable_checkpoint()->mutable_ref() = ref;
    v1::Checkpoint* c = m.mutable_checkpoint()->mutable_checkpoint();
    c->set_stage(ref.stage());
    c->set_step(step);
    c->set_path(path);
    c->set_bytes(1 << 20);
    c->set_seconds(0.25);
    uint64_t seq = 0;
    Send(std::move(m), &seq);
    return seq;
  }
  // Commits the checkpoint of the last step of `a`'s stage, as rank 0 of a finished stage
  // does before it exits 0 (a job succeeds only with its final stage's checkpoint), and
  // waits for the coordinator's Ack.
  std::optional<v1::Ack> CommitLast(const v1::Assignment& a) {
    const std::string path = a.checkpoint_dir() + "/stage" + std::to_string(a.ref().stage()) +
                             "-step-" + std::to_string(a.steps());
    WriteCommittedCheckpoint(path, a.ref().stage(), a.steps());
    return WaitAck(Checkpoint(a.ref(), a.steps(), path));
  }
  uint64_t Exited(const v1::WorkRef& ref, int exit_code, const std::string& error = "") {
    SetRunning(std::nullopt);
    v1::WorkerMessage m;
    *m.mutable_exited()->mutable_ref() = ref;
    m.mutable_exited()->set_exit_code(exit_code);
    m.mutable_exited()->set_preempted(exit_code == 75);
    m.mutable_exited()->set_error_message(error);
    uint64_t seq = 0;
    Send(std::move(m), &seq);
    return seq;
  }
  // The rank was killed by `signal` (what the agent reports: exit 128 + signal), after the
  // worker asked it to stop for a preemption when `preempted`.
  uint64_t Killed(const v1::WorkRef& ref, int signal, bool preempted) {
    SetRunning(std::nullopt);
    v1::WorkerMessage m;
    *m.mutable_exited()->mutable_ref() = ref;
    m.mutable_exited()->set_exit_code(128 + signal);
    m.mutable_exited()->set_signal(signal);
    m.mutable_exited()->set_preempted(preempted);
    uint64_t seq = 0;
    Send(std::move(m), &seq);
    return seq;
  }
  uint64_t Log(const v1::WorkRef& ref, const std::string& text) {
    v1::WorkerMessage m;
    *m.mutable_logs()->mutable_ref() = ref;
    v1::LogLine* l = m.mutable_logs()->add_lines();
    l->set_text(text);
    l->set_stream(v1::LOG_STREAM_STDERR);
    uint64_t seq = 0;
    Send(std::move(m), &seq);
    return seq;
  }

  // Removes and returns the first received message matching `pred`, waiting up to
  // `timeout`.
  std::optional<v1::CoordinatorMessage> WaitFor(
      const std::function<bool(const v1::CoordinatorMessage&)>& pred,
      std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    std::unique_lock<std::mutex> lock(mu_);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
        if (pred(*it)) {
          v1::CoordinatorMessage m = *it;
          inbox_.erase(it);
          return m;
        }
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
          if (pred(*it)) {
            v1::CoordinatorMessage m = *it;
            inbox_.erase(it);
            return m;
          }
        }
        return std::nullopt;
      }
    }
  }
  std::optional<v1::Assignment> WaitAssignment(
      std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    auto m = WaitFor([](const v1::CoordinatorMessage& m) { return m.has_assignment(); }, timeout);
    if (!m) return std::nullopt;
    return m->assignment();
  }
  std::optional<v1::Abort> WaitAbort(std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    auto m = WaitFor([](const v1::CoordinatorMessage& m) { return m.has_abort(); }, timeout);
    if (!m) return std::nullopt;
    return m->abort();
  }
  std::optional<v1::Ack> WaitAck(uint64_t seq,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    auto m = WaitFor(
        [seq](const v1::CoordinatorMessage& m) { return m.has_ack() && m.ack().seq() == seq; },
        timeout);
    if (!m) return std::nullopt;
    return m->ack();
  }
  // The interval the RegisterResponse asked for.
  int64_t heartbeat_interval_ms() const { return heartbeat_interval_ms_; }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

  const std::string& worker_id() const { return worker_id_; }
  const std::string& name() const { return name_; }

 private:
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string name_, node_label_, host_;
  std::string worker_id_;
  int64_t heartbeat_interval_ms_ = 0;

  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::thread reader_;
  std::mutex write_mu_;
  uint64_t next_seq_ = 1;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::CoordinatorMessage> inbox_;
  bool closed_ = false;
  std::optional<v1::WorkRef> running_;

  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = true;
  std::thread hb_thread_;
};

}  // namespace ulysses::coordinator::testing

#endif  // ULYSSES_TESTS_COORDINATOR_FAKE_WORKER_H_
