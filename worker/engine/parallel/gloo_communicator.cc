#include "worker/engine/parallel/gloo_communicator.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <exception>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/parallel/group_health.h"

namespace ulysses::engine::internal {
namespace {

// Maps an exception from c10d/Gloo to a Status: timeouts are DEADLINE_EXCEEDED, anything else
// (peer closed the connection, ...) UNAVAILABLE.
absl::Status StatusFromException(const std::string& what, const std::string& op) {
  std::string msg = what;
  // c10::Error messages carry a long backtrace after the first line.
  auto nl = msg.find('\n');
  if (nl != std::string::npos) msg = msg.substr(0, nl);
  std::string full = absl::StrCat("gloo ", op, " failed: ", msg);
  if (absl::StrContains(absl::AsciiStrToLower(what), "timed out") ||
      absl::StrContains(absl::AsciiStrToLower(what), "timeout")) {
    return absl::DeadlineExceededError(full);
  }
  return absl::UnavailableError(full);
}

// Gloo in libtorch 1.13 has no bfloat16: collectives that only MOVE data (all-to-all,
// all-gather) carry bfloat16 tensors as float16-typed 16-bit patterns (no arithmetic: exact).
torch::Tensor AsMovable(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.view(torch::kHalf) : t;
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, std::string name,
                   std::chrono::milliseconds timeout)
      : pg_(std::move(pg)), name_(name), timeout_(timeout), health_("gloo", std::move(name)) {}
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return pg_->getRank(); }
  int size() const override { return pg_->getSize(); }

  absl::Status AllToAll(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(health_.CheckUsable("alltoall"));
    if (!in.is_contiguous() || !out.is_contiguous() || in.sizes() != out.sizes() ||
        in.scalar_type() != out.scalar_type() || in.dim() == 0 || in.size(0) % size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AllToAll(", name_, "): in/out must be contiguous with equal shape and dtype and dim 0 (",
          in.dim() > 0 ? in.size(0) : 0, ") divisible by the group size (", size(), ")"));
    }
    if (size() == 1) {
      out.copy_(in);
      return absl::OkStatus();
    }
    std::vector<int64_t> counts;  // empty = equal splits
    torch::Tensor in_mut = AsMovable(in);
    torch::Tensor out_mut = AsMovable(out);
    absl::Status st =
        Run("alltoall", [&] { return pg_->alltoall_base(out_mut, in_mut, counts, counts); });
    if (st.ok()) bytes_sent_ += static_cast<int64_t>(in.nbytes()) * (size() - 1) / size();
    return st;
  }

  absl::Status AllReduceSum(std::vector<torch::Tensor>& tensors) override {
    RETURN_IF_ERROR(health_.CheckUsable("allreduce"));
    if (tensors.empty() || size() == 1) return absl::OkStatus();
    // One flat buffer per dtype: one collective instead of one per tensor.
    std::map<c10::ScalarType, std::vector<size_t>> by_dtype;
    for (size_t i = 0; i < tensors.size(); ++i) by_dtype[tensors[i].scalar_type()].push_back(i);
    for (auto& [dtype, idx] : by_dtype) {
      std::vector<torch::Tensor> flat_parts;
      for (size_t i : idx) flat_parts.push_back(tensors[i].reshape({-1}));  // [n_i]
      std::vector<torch::Tensor> flat = {torch::cat(flat_parts)};           // [sum n_i]
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;
      opts.timeout = timeout_;
      RETURN_IF_ERROR(Run("allreduce", [&] { return pg_->allreduce(flat, opts); }));
      int64_t offset = 0;
      for (size_t i : idx) {
        int64_t n = tensors[i].numel();
        tensors[i].copy_(flat[0].narrow(0, offset, n).view(tensors[i].sizes()));
        offset += n;
      }
    }
    return absl::OkStatus();
  }

  // Gloo in libtorch 1.13 has no reduce_scatter: an all-to-all of the chunks (the same bytes a
  // ring reduce-scatter sends) and a local sum in rank order.
  absl::Status ReduceScatterSum(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(health_.CheckUsable("reduce_scatter"));
    RETURN_IF_ERROR(CheckScatterGather("ReduceScatterSum", out, in, in.numel(), out.numel()));
    if (size() == 1) {
      out.copy_(in.view(out.sizes()));
      return absl::OkStatus();
    }
    const int64_t c = out.numel();
    torch::Tensor flat = in.reshape({-1});  // [size*c]
    torch::Tensor received = torch::empty_like(flat);
    std::vector<int64_t> counts;  // equal splits
    RETURN_IF_ERROR(
        Run("reduce_scatter", [&] { return pg_->alltoall_base(received, flat, counts, counts); }));
    // [size*c] -> [size, c]: row j came from rank j.
    out.copy_(received.view({size(), c}).sum(0).view(out.sizes()));
    return absl::OkStatus();
  }

  absl::Status AllGather(torch::Tensor& out, const torch::Tensor& in) override {
    RETURN_IF_ERROR(health_.CheckUsable("allgather"));
    RETURN_IF_ERROR(CheckScatterGather("AllGather", in, out, out.numel(), in.numel()));
    if (size() == 1) {
      out.copy_(in.view(out.sizes()));
      return absl::OkStatus();
    }
    const int64_t c = in.numel();
    torch::Tensor flat_out = AsMovable(out.view({-1}));  // [size*c]
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int j = 0; j < size(); ++j) outputs[0].push_back(flat_out.narrow(0, j * c, c));
    std::vector<torch::Tensor> inputs = {AsMovable(in.reshape({-1}))};
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    return Run("allgather", [&] { return pg_->allgather(outputs, inputs, opts); });
  }

  absl::Status AllReduceMax(torch::Tensor& t) override {
    RETURN_IF_ERROR(health_.CheckUsable("allreduce_max"));
    if (size() == 1) return absl::OkStatus();
    std::vector<torch::Tensor> v = {t.contiguous()};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    opts.timeout = timeout_;
    RETURN_IF_ERROR(Run("allreduce_max", [&] { return pg_->allreduce(v, opts); }));
    if (!v[0].is_same(t)) t.copy_(v[0]);
    return absl::OkStatus();
  }

  absl::Status Broadcast(torch::Tensor& t, int root) override {
    RETURN_IF_ERROR(health_.CheckUsable("broadcast"));
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Broadcast(", name_, "): root ", root, " not in [0, ", size(), ")"));
    }
    if (size() == 1) return absl::OkStatus();
    std::vector<torch::Tensor> v = {t.contiguous()};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout_;
    RETURN_IF_ERROR(Run("broadcast", [&] { return pg_->broadcast(v, opts); }));
    if (!v[0].is_same(t)) t.copy_(v[0]);
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    RETURN_IF_ERROR(health_.CheckUsable("barrier"));
    if (size() == 1) return absl::OkStatus();
    c10d::BarrierOptions opts;
    opts.timeout = timeout_;
    return Run("barrier", [&] { return pg_->barrier(opts); });
  }

  void Abort() override { health_.Abort(); }

  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  // Issues the collective and waits for it at most timeout_; failures mark the group broken.
  template <typename Issue>
  absl::Status Run(const std::string& op, Issue issue) {
    try {
      auto work = issue();
      work->wait(timeout_);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      health_.MarkBroken();
      return StatusFromException(e.what(), absl::StrCat(op, " on group '", name_, "'"));
    }
  }

  // `small` [c] and `big` [size*c]: contiguous, same dtype and device.
  absl::Status CheckScatterGather(const char* op, const torch::Tensor& small,
                                  const torch::Tensor& big, int64_t big_numel,
                                  int64_t small_numel) {
    if (!small.is_contiguous() || !big.is_contiguous() ||
        small.scalar_type() != big.scalar_type() || small.device() != big.device() ||
        big_numel != small_numel * size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, "(", name_, "): tensors must be contiguous with one dtype and device, and the large ",
          "one hold group size (", size(), ") x the small one's elements (", big_numel, " vs ",
          small_numel, ")"));
    }
    return absl::OkStatus();
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  GroupHealth health_;
  int64_t bytes_sent_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& name, int rank, int size,
    std::chrono::milliseconds timeout, bool loopback) {
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store);
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    // Single-host jobs bind to loopback; otherwise to the address this host's name resolves to.
    options->devices.push_back(loopback
                                   ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    options->threads = 2;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, options);
    return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(pg), name, timeout));
  } catch (const std::exception& e) {
    return StatusFromException(
        e.what(), absl::StrCat("setup of group '", name, "' (rank ", rank, " of ", size, ")"));
  }
}

}  // namespace ulysses::engine::internal
