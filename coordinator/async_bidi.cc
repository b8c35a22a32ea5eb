#include "coordinator/async_bidi.h"

#include "absl/time/time.h"
#include "common/logging.h"

namespace ulysses::coordinator {

CompletionQueues::CompletionQueues(grpc::ServerBuilder* builder, int count) {
  for (int i = 0; i < count; ++i) queues_.push_back(builder->AddCompletionQueue());
}

void CompletionQueues::Start(const std::function<void(grpc::ServerCompletionQueue*)>& post) {
  for (const std::unique_ptr<grpc::ServerCompletionQueue>& queue : queues_) {
    post(queue.get());
    threads_.emplace_back([cq = queue.get()] { RunCompletions(cq); });
  }
}

void CompletionQueues::Enter() {
  absl::MutexLock lock(&reactors_mu_);
  ++reactors_;
}

void CompletionQueues::Leave() {
  absl::MutexLock lock(&reactors_mu_);
  --reactors_;  // Shutdown's Await re-evaluates as the lock is released.
}

void CompletionQueues::Shutdown(std::chrono::milliseconds reactors_timeout) {
  if (shut_down_) return;
  shut_down_ = true;
  if (!threads_.empty()) {
    // The queue threads run the reactors' last callbacks (their Finish, OnDone) meanwhile.
    absl::MutexLock lock(&reactors_mu_);
    auto none_left = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(reactors_mu_) { return reactors_ == 0; };
    if (!reactors_mu_.AwaitWithTimeout(absl::Condition(&none_left),
                                       absl::FromChrono(reactors_timeout))) {
      ULOG(ERROR) << reactors_ << " stream reactor(s) still alive " << reactors_timeout.count()
                  << " ms after the server's shutdown; shutting their completion queues down "
                     "anyway (an operation they start now aborts the process)";
    }
  }
  for (const std::unique_ptr<grpc::ServerCompletionQueue>& queue : queues_) queue->Shutdown();
  for (std::thread& t : threads_) t.join();
  // A queue that never started a thread still has to be drained before it is destroyed.
  if (threads_.empty()) {
    for (const std::unique_ptr<grpc::ServerCompletionQueue>& queue : queues_) {
      RunCompletions(queue.get());
    }
  }
}

}  // namespace ulysses::coordinator
