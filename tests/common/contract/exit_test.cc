#include "common/contract/exit.h"

#include <signal.h>

#include "gtest/gtest.h"

namespace ulysses::contract {
namespace {

ProcessExit Exited(int code) { return ProcessExit{code, 0}; }
ProcessExit Killed(int sig) { return ProcessExit{128 + sig, sig}; }

TEST(ExitCodeTest, CodesAreTheDocumentedOnes) {
  // docs/CONTRACTS.md, Kubernetes manifests and scripts depend on these numbers.
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitFailure, 1);
  EXPECT_EQ(kExitBadInput, 2);
  EXPECT_EQ(kExitPreempted, 75);
  EXPECT_EQ(kExitPeerLost, 69);
}

TEST(ExitCodeTest, ARankThatLostAPeerExits69) {
  EXPECT_EQ(RankExitCodeFor(absl::UnavailableError("gloo alltoall: connection closed by peer")),
            kExitPeerLost);
  EXPECT_EQ(RankExitCodeFor(absl::DeadlineExceededError("gloo allreduce timed out")),
            kExitPeerLost);
  EXPECT_EQ(RankExitCodeFor(absl::InternalError("x")), kExitFailure);
  EXPECT_EQ(RankExitCodeFor(absl::InvalidArgumentError("x")), kExitBadInput);
  EXPECT_EQ(RankExitCodeFor(absl::OkStatus()), kExitOk);
  // Everything else keeps the plain mapping (the CLIs' UNAVAILABLE stays 1).
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("x")), kExitFailure);
}

TEST(FailureKindTest, KilledFromOutsideOrLostAPeerIsInfrastructure) {
  for (int sig : {SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGPIPE}) {
    EXPECT_EQ(FailureKindOf(ProcessExit{128 + sig, sig}), FailureKind::kInfrastructure) << sig;
  }
  EXPECT_EQ(FailureKindOf(ProcessExit{kExitPeerLost, 0}), FailureKind::kInfrastructure);
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE}) {
    EXPECT_EQ(FailureKindOf(ProcessExit{128 + sig, sig}), FailureKind::kApplication) << sig;
  }
  EXPECT_EQ(FailureKindOf(ProcessExit{1, 0}), FailureKind::kApplication);
  EXPECT_EQ(FailureKindOf(ProcessExit{137, 0}), FailureKind::kApplication);  // An exit code.
  EXPECT_STREQ(FailureKindName(FailureKind::kInfrastructure), "infrastructure");
  EXPECT_STREQ(FailureKindName(FailureKind::kApplication), "application");
}

TEST(ExitCodeTest, StatusMapsToExitCode) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), kExitOk);
  for (const absl::Status& bad : {absl::InvalidArgumentError("x"), absl::NotFoundError("x"),
                                  absl::FailedPreconditionError("x"), absl::DataLossError("x"),
                                  absl::OutOfRangeError("x"), absl::AlreadyExistsError("x")}) {
    EXPECT_EQ(ExitCodeFor(bad), kExitBadInput) << bad;
    EXPECT_TRUE(IsBadInput(bad.code())) << bad;
  }
  for (const absl::Status& failure :
       {absl::InternalError("x"), absl::UnavailableError("x"), absl::UnknownError("x"),
        absl::DeadlineExceededError("x"), absl::ResourceExhaustedError("x"),
        absl::AbortedError("x"), absl::CancelledError("x")}) {
    EXPECT_EQ(ExitCodeFor(failure), kExitFailure) << failure;
    EXPECT_FALSE(IsBadInput(failure.code())) << failure;
  }
}

TEST(RankOutcomeTest, ExitsWithoutStopRequest) {
  EXPECT_EQ(OutcomeOf(Exited(0), StopRequest::kNone), RankOutcome::kSucceeded);
  EXPECT_EQ(OutcomeOf(Exited(75), StopRequest::kNone), RankOutcome::kPreempted);
  EXPECT_EQ(OutcomeOf(Exited(2), StopRequest::kNone), RankOutcome::kBadInput);
  EXPECT_EQ(OutcomeOf(Exited(1), StopRequest::kNone), RankOutcome::kFailed);
  EXPECT_EQ(OutcomeOf(Exited(127), StopRequest::kNone), RankOutcome::kFailed);
  EXPECT_EQ(OutcomeOf(Killed(SIGSEGV), StopRequest::kNone), RankOutcome::kFailed);
  EXPECT_EQ(OutcomeOf(Killed(SIGKILL), StopRequest::kNone), RankOutcome::kFailed);
}

TEST(RankOutcomeTest, ASignalIsNotReadAsItsExitCode) {
  // 128 + signal can be any code: a signal never means "preempted" or "bad input".
  EXPECT_EQ(OutcomeOf(ProcessExit{75, 9}, StopRequest::kNone), RankOutcome::kFailed);
  EXPECT_EQ(OutcomeOf(ProcessExit{2, 9}, StopRequest::kNone), RankOutcome::kFailed);
  EXPECT_EQ(OutcomeOf(ProcessExit{0, 9}, StopRequest::kNone), RankOutcome::kFailed);
}

TEST(RankOutcomeTest, ExitsAfterStopRequest) {
  EXPECT_EQ(OutcomeOf(Exited(75), StopRequest::kPreempt), RankOutcome::kPreempted);
  EXPECT_EQ(OutcomeOf(Killed(SIGKILL), StopRequest::kPreempt), RankOutcome::kPreempted);
  EXPECT_EQ(OutcomeOf(Exited(1), StopRequest::kPreempt), RankOutcome::kPreempted);
  EXPECT_EQ(OutcomeOf(Exited(0), StopRequest::kPreempt), RankOutcome::kSucceeded);
  EXPECT_EQ(OutcomeOf(Exited(75), StopRequest::kAbort), RankOutcome::kAborted);
  EXPECT_EQ(OutcomeOf(Killed(SIGKILL), StopRequest::kAbort), RankOutcome::kAborted);
  EXPECT_EQ(OutcomeOf(Exited(2), StopRequest::kAbort), RankOutcome::kAborted);
  EXPECT_EQ(OutcomeOf(Exited(0), StopRequest::kAbort), RankOutcome::kSucceeded);
}

TEST(RankOutcomeTest, Names) {
  EXPECT_STREQ(RankOutcomeName(RankOutcome::kSucceeded), "succeeded");
  EXPECT_STREQ(RankOutcomeName(RankOutcome::kPreempted), "preempted");
  EXPECT_STREQ(RankOutcomeName(RankOutcome::kBadInput), "bad_input");
  EXPECT_STREQ(RankOutcomeName(RankOutcome::kFailed), "failed");
  EXPECT_STREQ(RankOutcomeName(RankOutcome::kAborted), "aborted");
  EXPECT_STREQ(StopRequestName(StopRequest::kPreempt), "preempt");
}

}  // namespace
}  // namespace ulysses::contract
