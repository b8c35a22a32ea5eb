#include "coordinator/async_bidi.h"

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

void CompletionQueues::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
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
