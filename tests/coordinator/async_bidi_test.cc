// AsyncBidiReactor and CompletionQueues (coordinator/async_bidi.h) on a real gRPC server and
// client over loopback: the callback contract the worker Session reactor (service.cc)
// relies on. Each reactor journals its callbacks; the tests end streams every way one ends
// (half-close, client cancel, a write the client never reads, server shutdown) and check
// that OnDone runs once, last, and that every reactor is deleted, accepted or not.
#include "coordinator/async_bidi.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/testing/poll.h"
#include "ulysses/v1/worker_service.grpc.pb.h"

namespace ulysses::coordinator {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::ulysses::testing::PollUntil;

// Callbacks by reactor (numbered in the order their calls were accepted), and the number of
// reactors alive (constructed, not yet deleted).
class Journal {
 public:
  void Constructed() {
    std::lock_guard<std::mutex> lock(mu_);
    ++alive_;
  }
  int NewCall() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_id_++;
  }
  void Deleted() {
    std::lock_guard<std::mutex> lock(mu_);
    --alive_;
  }
  void Add(int id, const std::string& event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_[id].push_back(event);
  }
  std::vector<std::string> Events(int id) {
    std::lock_guard<std::mutex> lock(mu_);
    return events_[id];
  }
  // Accepted calls (each journals "start" first).
  int Started() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& [id, events] : events_) n += !events.empty() && events.front() == "start";
    return n;
  }
  int alive() {
    std::lock_guard<std::mutex> lock(mu_);
    return alive_;
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<std::string>> events_;
  int alive_ = 0;
  int next_id_ = 0;
};

// Answers each message with an Ack of its seq; a hello asks for an Ack carrying `big_bytes`
// of message instead (a write the client may never read). Finishes OK once the client
// half-closes, CANCELLED after OnCancel, in both cases after the write in flight completed.
class RecordingReactor final : public AsyncBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  explicit RecordingReactor(Journal* journal) : journal_(journal), id_(-1) {
    journal_->Constructed();
  }
  ~RecordingReactor() override { journal_->Deleted(); }

  void OnStart() override {
    id_ = journal_->NewCall();
    journal_->Add(id_, "start");
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    journal_->Add(id_, ok ? "read" : "read-end");
    if (!ok) {
      EndWith(grpc::Status::OK);
      return;
    }
    v1::CoordinatorMessage out;
    out.mutable_ack()->set_seq(in_.seq());
    if (in_.has_hello()) out.mutable_ack()->set_message(std::string(kBigBytes, 'x'));
    Write(std::move(out));
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override {
    journal_->Add(id_, ok ? "write" : "write-failed");
    queue_.pop_front();
    if (!queue_.empty()) {
      StartWrite(&queue_.front());
    } else if (finish_ && !finish_started_) {
      finish_started_ = true;
      Finish(*finish_);
    }
  }
  void OnCancel() override {
    journal_->Add(id_, "cancel");
    EndWith(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override {
    journal_->Add(id_, "done");
    delete this;
  }

  static constexpr size_t kBigBytes = 8 << 20;

 private:
  void Write(v1::CoordinatorMessage message) {
    if (finish_) return;
    queue_.push_back(std::move(message));
    if (queue_.size() == 1) StartWrite(&queue_.front());
  }
  void EndWith(const grpc::Status& status) {
    if (finish_) return;
    finish_ = status;
    if (queue_.empty()) {
      finish_started_ = true;
      Finish(status);
    }
  }

  Journal* const journal_;
  int id_;  // Set by OnStart; every callback runs on the stream's queue thread, in turn.
  v1::WorkerMessage in_;
  std::deque<v1::CoordinatorMessage> queue_;  // front() is being written.
  std::optional<grpc::Status> finish_;
  bool finish_started_ = false;
};

class AsyncBidiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    queues_ = std::make_unique<CompletionQueues>(&builder, 2);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    accepting_ = true;
    queues_->Start([this](grpc::ServerCompletionQueue* cq) { Accept(cq); });
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::WorkerService::NewStub(channel_);
  }
  void TearDown() override { StopServer(); }

  // The server's shutdown as CoordinatorServer does it: no new calls, open ones cancelled
  // after the deadline, then the queues drained and joined.
  void StopServer() {
    if (stopped_) return;
    stopped_ = true;
    server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
    {
      std::lock_guard<std::mutex> lock(accept_mu_);
      accepting_ = false;
    }
    queues_->Shutdown();
  }

  struct Client {
    std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream;
  };
  Client Open() {
    Client c;
    c.context->set_deadline(std::chrono::system_clock::now() + seconds(30));
    c.stream = stub_->Session(c.context.get());
    return c;
  }
  // Sends a heartbeat numbered `seq` and reads its Ack.
  static bool RoundTrip(Client& c, uint64_t seq) {
    v1::WorkerMessage m;
    m.set_seq(seq);
    m.mutable_heartbeat();
    v1::CoordinatorMessage ack;
    return c.stream->Write(m) && c.stream->Read(&ack) && ack.ack().seq() == seq;
  }
  // The journal of the reactor accepted `index`-th, once it ran OnDone.
  std::vector<std::string> Ended(int index) {
    EXPECT_TRUE(PollUntil(
        [&] {
          auto e = journal_.Events(index);
          return !e.empty() && e.back() == "done";
        },
        seconds(20)))
        << absl::StrJoin(journal_.Events(index), " ");
    return journal_.Events(index);
  }
  static int Count(const std::vector<std::string>& events, const std::string& event) {
    return static_cast<int>(std::count(events.begin(), events.end(), event));
  }

  Journal journal_;

 private:
  void Accept(grpc::ServerCompletionQueue* cq) {
    std::lock_guard<std::mutex> lock(accept_mu_);
    if (!accepting_) return;
    auto* reactor = new RecordingReactor(&journal_);
    reactor->Request(
        [this](grpc::ServerContext* context, RecordingReactor::Stream* stream,
               grpc::ServerCompletionQueue* queue,
               void* tag) { service_.RequestSession(context, stream, queue, queue, tag); },
        queues_.get(), cq, [this, cq] { Accept(cq); });
  }

  v1::WorkerService::AsyncService service_;
  std::unique_ptr<CompletionQueues> queues_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  int port_ = 0;
  std::mutex accept_mu_;
  bool accepting_ = false;
  bool stopped_ = false;
};

TEST_F(AsyncBidiTest, AHalfCloseEndsTheCallOkAndOnDoneRunsOnceLast) {
  Client c = Open();
  for (uint64_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(RoundTrip(c, seq));
  ASSERT_TRUE(c.stream->WritesDone());
  v1::CoordinatorMessage extra;
  EXPECT_FALSE(c.stream->Read(&extra));
  const grpc::Status status = c.stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  const std::vector<std::string> events = Ended(0);
  EXPECT_EQ(events.front(), "start");
  EXPECT_EQ(Count(events, "read"), 3) << absl::StrJoin(events, " ");
  EXPECT_EQ(Count(events, "write"), 3);
  EXPECT_EQ(Count(events, "read-end"), 1);
  EXPECT_EQ(Count(events, "cancel"), 0);
  EXPECT_EQ(Count(events, "done"), 1);
  EXPECT_EQ(events.back(), "done");
}

TEST_F(AsyncBidiTest, AClientCancelRunsOnCancelAndThenOnDoneOnce) {
  Client c = Open();
  ASSERT_TRUE(RoundTrip(c, 1));
  c.context->TryCancel();
  EXPECT_EQ(c.stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  const std::vector<std::string> events = Ended(0);
  EXPECT_EQ(Count(events, "cancel"), 1) << absl::StrJoin(events, " ");
  EXPECT_EQ(Count(events, "done"), 1);
  EXPECT_EQ(events.back(), "done");
}

// A write the client never reads is still in flight when it goes away: the write completes
// (failed) before OnDone, which the reactor needs to free the message it wrote from.
TEST_F(AsyncBidiTest, AWriteInFlightWhenTheClientGoesAwayCompletesBeforeOnDone) {
  Client c = Open();
  v1::WorkerMessage hello;
  hello.set_seq(1);
  hello.mutable_hello()->set_worker_id("w");
  ASSERT_TRUE(c.stream->Write(hello));
  // The 8 MiB Ack cannot fit the client's flow-control window: wait until the reactor
  // started writing it, then leave without reading.
  ASSERT_TRUE(PollUntil([&] { return Count(journal_.Events(0), "read") == 1; }, seconds(20)));
  c.context->TryCancel();
  c.stream->Finish();
  const std::vector<std::string> events = Ended(0);
  const auto write_end = std::find_if(events.begin(), events.end(), [](const std::string& e) {
    return e == "write" || e == "write-failed";
  });
  ASSERT_NE(write_end, events.end()) << absl::StrJoin(events, " ");
  EXPECT_LT(write_end - events.begin(), static_cast<std::ptrdiff_t>(events.size()) - 1);
  EXPECT_EQ(Count(events, "done"), 1);
  EXPECT_EQ(events.back(), "done");
}

// Shutdown with streams open: each is cancelled and done once, and every reactor is deleted,
// the ones still waiting for a call (one per queue) included.
TEST_F(AsyncBidiTest, ServerShutdownEndsEveryOpenStreamOnceAndDeletesEveryReactor) {
  constexpr int kStreams = 6;
  std::vector<Client> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(Open());
    ASSERT_TRUE(RoundTrip(clients.back(), 1));
  }
  ASSERT_EQ(journal_.Started(), kStreams);
  StopServer();  // Returns once the queues are drained and their threads joined.
  for (int i = 0; i < kStreams; ++i) {
    const std::vector<std::string> events = journal_.Events(i);
    EXPECT_EQ(Count(events, "done"), 1) << i << ": " << absl::StrJoin(events, " ");
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back(), "done") << i << ": " << absl::StrJoin(events, " ");
  }
  EXPECT_EQ(journal_.alive(), 0);
  for (Client& c : clients) EXPECT_FALSE(c.stream->Finish().ok());
}

}  // namespace
}  // namespace ulysses::coordinator
