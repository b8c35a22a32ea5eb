#include "common/grpc/grpc_util.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ulysses {
namespace {

using ::testing::HasSubstr;

TEST(StatusMappingTest, EveryCanonicalCodeRoundTripsWithMessage) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status original(static_cast<absl::StatusCode>(code),
                                "msg for code " + std::to_string(code));
    const grpc::Status wire = ToGrpcStatus(original);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), original.message());
    EXPECT_EQ(FromGrpcStatus(wire), original);
  }
}

TEST(StatusMappingTest, NamedCodesMatch) {
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("x")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "late")).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(StatusMappingTest, OkAndOutOfRangeCodes) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  const absl::Status odd(static_cast<absl::StatusCode>(42), "weird");
  EXPECT_EQ(ToGrpcStatus(odd).error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(ToGrpcStatus(odd).error_message(), "weird");
  const grpc::Status do_not_use(grpc::StatusCode::DO_NOT_USE, "bad");
  EXPECT_EQ(FromGrpcStatus(do_not_use).code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(FromGrpcStatus(do_not_use).message(), "bad");
}

TEST(DeadlineTest, SetsDeadlineRelativeToNow) {
  grpc::ClientContext context;
  const auto before = std::chrono::system_clock::now();
  SetDeadlineAfter(&context, absl::Seconds(5));
  const auto after = std::chrono::system_clock::now();
  EXPECT_GE(context.deadline(), before + std::chrono::seconds(5));
  EXPECT_LE(context.deadline(), after + std::chrono::seconds(5));

  grpc::ClientContext none;
  const auto unset = none.deadline();
  SetDeadlineAfter(&none, absl::InfiniteDuration());
  EXPECT_EQ(none.deadline(), unset);

  grpc::ClientContext past;
  SetDeadlineAfter(&past, absl::Seconds(-3));
  EXPECT_LE(past.deadline(), std::chrono::system_clock::now());
  EXPECT_GT(DeadlineAfter(absl::Hours(1e9)), std::chrono::system_clock::now());
}

// A real gRPC server over loopback with a generic service:
//   /test.Svc/Fail  -> finishes with ToGrpcStatus(NotFound("job j7 not found"))
//   /test.Svc/Hang  -> never answers (until the client's deadline cancels it)
class TestService : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(bool hang) {
        if (!hang) {
          Finish(ToGrpcStatus(absl::NotFoundError("job j7 not found")));
        }
        // A hanging call is finished by OnCancel when the deadline passes.
      }
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }
    };
    return new Reactor(ctx->method() == "/test.Svc/Hang");
  }
};

class GrpcLoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    stub_ = std::make_unique<grpc::GenericStub>(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    }
  }

  // Blocking unary call through the callback API.
  absl::Status Call(const std::string& method, absl::Duration timeout) {
    grpc::ClientContext context;
    SetDeadlineAfter(&context, timeout);
    grpc::Slice payload(std::string("ping"));
    grpc::ByteBuffer request(&payload, 1), response;  // A default ByteBuffer is invalid.
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status result;
    stub_->UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                     [&](grpc::Status status) {
                       std::lock_guard<std::mutex> lock(mu);
                       result = std::move(status);
                       done = true;
                       cv.notify_one();
                     });
    std::unique_lock<std::mutex> lock(mu);
    // Bounded independently of the deadline under test.
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return done; })) {
      context.TryCancel();
      cv.wait(lock, [&] { return done; });
      return absl::InternalError("test harness: call did not complete in 20 s");
    }
    return FromGrpcStatus(result);
  }

  TestService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
  int port_ = 0;
};

TEST_F(GrpcLoopbackTest, ServiceStatusArrivesUnchanged) {
  absl::Status status = Call("/test.Svc/Fail", absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "job j7 not found");
}

TEST_F(GrpcLoopbackTest, DeadlineBoundsAHangingCall) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = Call("/test.Svc/Hang", absl::Milliseconds(300));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
}

}  // namespace
}  // namespace ulysses
