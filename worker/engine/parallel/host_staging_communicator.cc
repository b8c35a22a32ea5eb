#include "worker/engine/parallel/host_staging_communicator.h"

#include <utility>
#include <vector>

#include "common/status.h"

namespace ulysses::engine::internal {
namespace {

torch::Tensor ToHost(const torch::Tensor& t) { return t.is_cpu() ? t : t.to(torch::kCPU); }

class HostStagingCommunicator final : public Communicator {
 public:
  explicit HostStagingCommunicator(std::unique_ptr<Communicator> inner)
      : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  absl::Status AllToAll(torch::Tensor& out, const torch::Tensor& in) override {
    if (out.is_cpu() && in.is_cpu()) return inner_->AllToAll(out, in);
    torch::Tensor host_in = ToHost(in).contiguous();
    torch::Tensor host_out = torch::empty_like(host_in);
    RETURN_IF_ERROR(inner_->AllToAll(host_out, host_in));
    out.copy_(host_out);
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(std::vector<torch::Tensor>& tensors) override {
    std::vector<torch::Tensor> host;
    host.reserve(tensors.size());
    bool staged = false;
    for (const torch::Tensor& t : tensors) {
      staged = staged || !t.is_cpu();
      host.push_back(ToHost(t));
    }
    if (!staged) return inner_->AllReduceSum(tensors);
    RETURN_IF_ERROR(inner_->AllReduceSum(host));
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i].is_cpu()) tensors[i].copy_(host[i]);
    }
    return absl::OkStatus();
  }

  absl::Status ReduceScatterSum(torch::Tensor& out, const torch::Tensor& in) override {
    if (out.is_cpu() && in.is_cpu()) return inner_->ReduceScatterSum(out, in);
    torch::Tensor host_in = ToHost(in).contiguous();
    torch::Tensor host_out = torch::empty(out.sizes(), host_in.options());
    RETURN_IF_ERROR(inner_->ReduceScatterSum(host_out, host_in));
    out.copy_(host_out);
    return absl::OkStatus();
  }

  absl::Status AllGather(torch::Tensor& out, const torch::Tensor& in) override {
    if (out.is_cpu() && in.is_cpu()) return inner_->AllGather(out, in);
    torch::Tensor host_in = ToHost(in).contiguous();
    torch::Tensor host_out = torch::empty(out.sizes(), host_in.options());
    RETURN_IF_ERROR(inner_->AllGather(host_out, host_in));
    out.copy_(host_out);
    return absl::OkStatus();
  }

  absl::Status AllReduceMax(torch::Tensor& t) override {
    if (t.is_cpu()) return inner_->AllReduceMax(t);
    torch::Tensor host = ToHost(t);
    RETURN_IF_ERROR(inner_->AllReduceMax(host));
    t.copy_(host);
    return absl::OkStatus();
  }

  absl::Status Broadcast(torch::Tensor& t, int root) override {
    if (t.is_cpu()) return inner_->Broadcast(t, root);
    torch::Tensor host = ToHost(t);
    RETURN_IF_ERROR(inner_->Broadcast(host, root));
    t.copy_(host);
    return absl::OkStatus();
  }

  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort() override { inner_->Abort(); }
  int64_t bytes_sent() const override { return inner_->bytes_sent(); }

 private:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace

std::unique_ptr<Communicator> WrapWithHostStaging(std::unique_ptr<Communicator> inner) {
  return std::make_unique<HostStagingCommunicator>(std::move(inner));
}

}  // namespace ulysses::engine::internal
