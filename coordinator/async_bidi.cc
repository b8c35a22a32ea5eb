#include "coordinator/async_bidi.h"

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
  std::lock_guard<std::mutex> lock(reactors_mu_);
  ++reactors_;
}

void CompletionQueues::Leave() {
  std::lock_guard<std::mutex> lock(reactors_mu_);
  if (--reactors_ == 0) reactors_cv_.notify_all();
}

void CompletionQueues::Shutdown(std::chrono::milliseconds reactors_timeout) {
  if (shut_down_) return;
  shut_down_ = true;
  if (!threads_.empty()) {
    // The queue threads run the reactors' last callbacks (their Finish, OnDone) meanwhile.
    std::unique_lock<std::mutex> lock(reactors_mu_);
    if (!reactors_cv_.wait_for(lock, reactors_timeout, [this] { return reactors_ == 0; })) {
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
