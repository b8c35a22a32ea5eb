// The simulated clients of bench/coordinator_load: worker agents on Session streams
// (SimWorker, gRPC's async API) and WatchJob readers (Watcher), with the latency recorder they
// share. Included by coordinator_load.cc only.
#ifndef ULYSSES_BENCH_COORDINATOR_LOAD_AGENTS_H_
#define ULYSSES_BENCH_COORDINATOR_LOAD_AGENTS_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc/completion_queue.h"
#include "common/grpc/grpc_util.h"
#include "ulysses/v1/job_service.grpc.pb.h"
#include "ulysses/v1/worker_service.grpc.pb.h"

namespace ulysses::bench {

// The coordinator's first-start admin token (<state_dir>/admin.token, docs/SECURITY.md),
// sent on every call: admins may register any worker name.
inline std::string g_token;  // NOLINT: set once in main before any call.
// --run-assignments: a simulated worker answers an assignment as ulysses-worker does
// (started, then a progress report per heartbeat from rank 0), so jobs run and their
// watchers get events. Set once in main.
inline bool g_run_assignments = false;  // NOLINT
// The heartbeat interval the coordinator last asked for (RegisterResponse, or an Ack since:
// max_heartbeats_per_s), in ms; 0 = none yet. With --heartbeat-s 0 the agents follow it.
inline std::atomic<int64_t> g_told_interval_ms{0};  // NOLINT
inline void Authorize(grpc::ClientContext* ctx) {
  ctx->AddMetadata("authorization", "Bearer " + g_token);
}

using Clock = std::chrono::steady_clock;
using ulysses::SetDeadlineAfter;
namespace v1 = ulysses::v1;

class Latencies {
 public:
  void Add(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(seconds);
  }
  std::string Summary(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    if (samples_.empty()) return name + ": no samples";
    std::vector<double> s = samples_;
    std::sort(s.begin(), s.end());
    auto pct = [&](double p) {
      return s[std::min(s.size() - 1, static_cast<size_t>(p * s.size()))];
    };
    char buf[256];
    snprintf(buf, sizeof(buf), "%-22s n=%-7zu p50=%7.2f ms  p99=%7.2f ms  max=%7.2f ms",
             name.c_str(), s.size(), pct(0.5) * 1e3, pct(0.99) * 1e3, s.back() * 1e3);
    return buf;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.clear();
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_.size();
  }

 private:
  std::mutex mu_;
  std::vector<double> samples_;
};

// One simulated agent: a Session stream on gRPC's async API, over a completion queue of the
// generator's (one of --client-queues, each run by a thread: RunCompletions). With the callback
// API every stream of the process would share one queue, and Debian's debug-checked libgrpc
// scans its outstanding operations per completion (common/grpc/completion_queue.h): at 25,000
// agents that saturated the generator's core. Every operation is started under mu_, so none
// starts after Finish; the object must outlive its queue's last tag for it (done()).
// The rank a simulated worker runs (--run-assignments) and the last step it reported.
struct SimRank {
  v1::WorkRef ref;
  int64_t step = 0;
};

class SimWorker final {
 public:
  // `resume`: the rank the previous session ran, kept across a reconnect (the coordinator
  // answered keep_running).
  SimWorker(v1::WorkerService::Stub* stub, grpc::CompletionQueue* cq, const std::string& worker_id,
            Latencies* heartbeat, std::optional<SimRank> resume = std::nullopt)
      : heartbeat_(heartbeat) {
    if (resume.has_value()) {
      held_ = resume->ref;
      step_ = resume->step;
    }
    SetDeadlineAfter(&ctx_, absl::Hours(1));
    Authorize(&ctx_);
    out_.set_seq(next_seq_++);
    out_.mutable_hello()->set_worker_id(worker_id);
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = true;  // The hello goes first, once the call has started.
    stream_ = stub->PrepareAsyncSession(&ctx_, cq);
    ++in_flight_;
    stream_->StartCall(&start_tag_);
  }

  // Returns false if the previous write is still in flight (heartbeat skipped).
  bool Heartbeat() {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ || ended_) return false;
    writing_ = true;
    out_.Clear();
    uint64_t seq = next_seq_++;
    out_.set_seq(seq);
    out_.mutable_heartbeat()->set_request_ack(true);
    if (held_.has_value()) {
      v1::RunningWork* r = out_.mutable_heartbeat()->add_running_ranks();
      *r->mutable_ref() = *held_;
      r->set_pid(4242);
      if (held_->rank() == 0) {  // Rank 0 reports a step per heartbeat, as a fast job.
        v1::WorkerMessage progress;
        progress.set_seq(next_seq_++);
        *progress.mutable_progress()->mutable_ref() = *held_;
        v1::StepProgress* p = progress.mutable_progress()->mutable_progress();
        p->set_step(++step_);
        p->set_loss(10.0 / static_cast<double>(step_));
        p->set_tokens_per_s(1000);
        if (outbox_.size() < kMaxOutbox) outbox_.push_back(std::move(progress));
      }
    }
    // A fixed ring of send times (no allocation per heartbeat): an ack older than
    // kInFlight heartbeats is not timed (it is counted unanswered at the end).
    Sent& slot = sent_[seq % kInFlight];
    if (slot.seq != 0) unanswered_++;  // Its ack never came.
    slot = {seq, Clock::now()};
    WriteLocked();
    return true;
  }

  void Close() {
    ctx_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [this] { return done_; });
  }
  // The session ended and every operation's tag has come back.
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  int assignments() const { return assignments_.load(); }
  // The rank it runs, if any (reported again when it re-registers).
  std::optional<SimRank> rank() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_.has_value()) return std::nullopt;
    return SimRank{*held_, step_};
  }
  // When the first ack of this session came (0: none yet).
  Clock::time_point first_ack() const {
    const int64_t ns = first_ack_ns_.load();
    return ns == 0 ? Clock::time_point{} : Clock::time_point{std::chrono::nanoseconds(ns)};
  }
  // Heartbeats whose ack has not come (those still in flight included).
  int64_t unanswered() {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = unanswered_;
    for (const Sent& s : sent_) n += s.seq != 0 ? 1 : 0;
    return n;
  }
  // Forgets the heartbeats sent so far (the end of the warm-up).
  void ResetUnanswered() {
    std::lock_guard<std::mutex> lock(mu_);
    unanswered_ = 0;
    for (Sent& s : sent_) s.seq = 0;
  }
  std::string final_status() {
    std::lock_guard<std::mutex> lock(mu_);
    return absl::StrCat(final_.error_code(), " ", final_.error_message());
  }

 private:
  using Tag = ulysses::MemberTag<SimWorker>;

  void WriteLocked() {
    ++in_flight_;
    stream_->Write(out_, &write_tag_);
  }
  void ReadLocked() {
    ++in_flight_;
    stream_->Read(&in_, &read_tag_);
  }
  // The stream is over (a read failed or the call never started): ask for its status.
  void FinishLocked() {
    ended_ = true;
    ++in_flight_;
    stream_->Finish(&final_, &finish_tag_);
  }
  // One operation's tag came back.
  void EndLocked() {
    if (--in_flight_ == 0 && finished_) {
      done_ = true;
      cv_.notify_all();
    }
  }

  void Started(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ok) {
      WriteLocked();  // The hello.
      ReadLocked();
    } else {
      FinishLocked();
    }
    EndLocked();
  }

  void WriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok || ended_ || outbox_.empty()) {
      writing_ = false;
    } else {
      out_ = std::move(outbox_.front());
      outbox_.pop_front();
      WriteLocked();
    }
    EndLocked();
  }

  void ReadDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      FinishLocked();
    } else {
      if (in_.has_ack()) OnAckLocked();
      if (in_.has_assignment()) OnAssignmentLocked();
      ReadLocked();
    }
    EndLocked();
  }

  void FinishDone(bool /*ok*/) {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    EndLocked();
  }

  void OnAckLocked() {
    if (in_.ack().heartbeat_interval_ms() > 0)
      g_told_interval_ms = in_.ack().heartbeat_interval_ms();
    if (first_ack_ns_.load() == 0) {
      first_ack_ns_ =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
              .count();
    }
    Sent& slot = sent_[in_.ack().seq() % kInFlight];
    if (slot.seq == in_.ack().seq() && slot.seq != 0) {
      heartbeat_->Add(std::chrono::duration<double>(Clock::now() - slot.at).count());
      slot.seq = 0;
    }
  }

  void OnAssignmentLocked() {
    assignments_++;
    if (!g_run_assignments) return;
    v1::WorkerMessage started;
    started.mutable_started()->set_pid(4242);
    held_ = in_.assignment().ref();
    step_ = 0;
    *started.mutable_started()->mutable_ref() = *held_;
    started.set_seq(next_seq_++);
    if (writing_) {
      if (outbox_.size() < kMaxOutbox) outbox_.push_back(std::move(started));
    } else if (!ended_) {
      writing_ = true;
      out_ = std::move(started);
      WriteLocked();
    }
  }

  Latencies* heartbeat_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  Tag start_tag_{this, &SimWorker::Started};
  Tag read_tag_{this, &SimWorker::ReadDone};
  Tag write_tag_{this, &SimWorker::WriteDone};
  Tag finish_tag_{this, &SimWorker::FinishDone};
  v1::WorkerMessage out_;
  v1::CoordinatorMessage in_;
  std::mutex mu_;
  std::condition_variable cv_;
  int in_flight_ = 0;      // Operations started whose tag has not come back.
  bool writing_ = false;   // A write is in flight (out_ is gRPC's until it completes).
  bool ended_ = false;     // Finish was asked for: nothing more starts.
  bool finished_ = false;  // Finish's tag came back.
  bool done_ = false;      // finished_ and nothing in flight.
  grpc::Status final_;
  uint64_t next_seq_ = 1;
  struct Sent {
    uint64_t seq = 0;  // 0: none waiting.
    Clock::time_point at;
  };
  static constexpr int kInFlight = 8;
  static constexpr size_t kMaxOutbox = 16;
  std::deque<v1::WorkerMessage> outbox_;  // Behind out_ while writing_.
  std::optional<v1::WorkRef> held_;       // The rank it runs (--run-assignments).
  int64_t step_ = 0;
  Sent sent_[kInFlight];
  int64_t unanswered_ = 0;
  std::atomic<int> assignments_{0};
  std::atomic<int64_t> first_ack_ns_{0};
};

// One WatchJob stream (--watchers): counts the events it receives.
class Watcher final : public grpc::ClientReadReactor<v1::JobEvent> {
 public:
  Watcher(v1::JobService::Stub* stub, const std::string& job_id) {
    SetDeadlineAfter(&ctx_, absl::Hours(1));
    Authorize(&ctx_);
    req_.set_job_id(job_id);
    stub->async()->WatchJob(&ctx_, &req_, this);
    StartRead(&event_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    events_++;
    StartRead(&event_);
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void Close() {
    ctx_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [this] { return done_; });
  }
  int64_t events() const { return events_.load(); }
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

 private:
  grpc::ClientContext ctx_;
  v1::WatchJobRequest req_;
  v1::JobEvent event_;
  std::atomic<int64_t> events_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

}  // namespace ulysses::bench

#endif  // ULYSSES_BENCH_COORDINATOR_LOAD_AGENTS_H_
