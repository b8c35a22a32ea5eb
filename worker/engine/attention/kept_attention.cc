#include "worker/engine/attention/kept_attention.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ulysses::engine {
namespace {

thread_local KeepAttentionScope* current_scope = nullptr;
std::atomic<int64_t> forward_runs{0};

// The constant an argument of this name takes in a causal, dropout-free call without bias;
// nullopt when the name is not one of them.
std::optional<c10::IValue> KnownConstant(const std::string& name) {
  if (name == "attn_mask") return c10::IValue();
  if (name == "compute_log_sumexp") return c10::IValue(true);
  if (name == "dropout_p") return c10::IValue(0.0);
  if (name == "is_causal") return c10::IValue(true);
  if (name == "return_debug_mask") return c10::IValue(false);
  if (name == "scale") return c10::IValue();
  if (name == "grad_input_mask") return c10::IValue(c10::List<bool>({true, true, true, false}));
  return std::nullopt;
}

// Names the same value goes by in a forward's returns and its backward's arguments: flash's
// forward returns "rng_state" and "unused" in newer libtorch, its backward takes them as
// "philox_seed" and "philox_offset".
std::string Alias(const std::string& name) {
  if (name == "philox_seed") return "rng_state";
  if (name == "philox_offset") return "unused";
  return "";
}

absl::Status CheckConstant(const c10::FunctionSchema& schema, const c10::Argument& arg,
                           const c10::IValue& value) {
  if (value.isNone() && arg.type()->kind() == c10::TypeKind::OptionalType) return absl::OkStatus();
  if (value.isTensor() && arg.type()->kind() == c10::TypeKind::TensorType) return absl::OkStatus();
  if (!value.isNone() && !value.isTensor() && value.type()->isSubtypeOf(*arg.type())) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(schema.name(), ": argument '", arg.name(), "' has type ", arg.type()->str(),
                   ", which the kept-attention binding does not fill"));
}

absl::Status Unfillable(const c10::FunctionSchema& schema, const c10::Argument& arg) {
  return absl::FailedPreconditionError(absl::StrCat(
      schema.name(), ": argument '", arg.name(), "' (", arg.type()->str(),
      ") has no default and is not one the kept-attention binding knows; this libtorch's op "
      "differs from the ones it was written for (attention is recomputed instead)"));
}

// The value of an argument that is neither an input nor a forward return: attn_bias (the call
// has none: None where the type is optional, an undefined tensor where it is not), a known
// constant, or the schema's default.
absl::Status FillConstant(const c10::FunctionSchema& schema, const c10::Argument& arg,
                          c10::IValue* value) {
  if (arg.name() == "attn_bias") {
    *value = arg.type()->kind() == c10::TypeKind::OptionalType ? c10::IValue()
                                                               : c10::IValue(at::Tensor());
  } else if (auto known = KnownConstant(arg.name())) {
    *value = *known;
    return CheckConstant(schema, arg, *value);
  } else if (arg.default_value()) {
    *value = *arg.default_value();
  } else {
    return Unfillable(schema, arg);
  }
  return absl::OkStatus();
}

}  // namespace

void KeptAttention::Push(c10::intrusive_ptr<KeptAttentionEntry> entry) {
  entries_.push_back(std::move(entry));
}

c10::intrusive_ptr<KeptAttentionEntry> KeptAttention::Pop() {
  TORCH_CHECK(!entries_.empty(),
              "kept attention: the recompute ran more attention calls than the forward it "
              "replays (the layer's forward must be deterministic)");
  auto entry = std::move(entries_.front());
  entries_.pop_front();
  return entry;
}

int64_t KeptAttention::bytes() const {
  int64_t total = 0;
  for (const auto& e : entries_) {
    if (e->out.defined()) total += e->out.numel() * e->out.element_size();
    if (e->lse.defined()) total += e->lse.numel() * e->lse.element_size();
  }
  return total;
}

KeepAttentionScope::KeepAttentionScope(KeptAttention* kept, KeepMode mode)
    : kept_(kept), mode_(mode), outer_(current_scope) {
  current_scope = this;
}

KeepAttentionScope::~KeepAttentionScope() { current_scope = outer_; }

KeepAttentionScope* KeepAttentionScope::Current() { return current_scope; }

int64_t CausalAttentionForwardRuns() { return forward_runs.load(std::memory_order_relaxed); }

void CountCausalAttentionForward() { forward_runs.fetch_add(1, std::memory_order_relaxed); }

absl::StatusOr<FusedAttentionBinding> FusedAttentionBinding::Bind(
    const c10::FunctionSchema& forward, const c10::FunctionSchema& backward) {
  FusedAttentionBinding b;
  for (const c10::Argument& arg : forward.arguments()) {
    Arg a;
    const std::string& name = arg.name();
    if (name == "query" || name == "key" || name == "value") {
      a.source = name == "query" ? Source::kQuery : name == "key" ? Source::kKey : Source::kValue;
    } else if (absl::Status s = FillConstant(forward, arg, &a.value); !s.ok()) {
      return s;
    }
    b.forward_args_.push_back(std::move(a));
  }
  std::vector<std::string> returned;
  b.output_index_ = b.lse_index_ = -1;
  for (size_t i = 0; i < forward.returns().size(); ++i) {
    const std::string& name = forward.returns()[i].name();
    returned.push_back(name);
    if (name == "output") b.output_index_ = static_cast<int64_t>(i);
    if (name == "logsumexp" || name == "log_sumexp") b.lse_index_ = static_cast<int64_t>(i);
  }
  if (b.output_index_ < 0 || b.lse_index_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(forward.name(), ": its returns name no 'output' and 'logsumexp' (",
                     forward.returns().size(),
                     " returns); the kept-attention binding cannot tell which to keep"));
  }
  for (const c10::Argument& arg : backward.arguments()) {
    Arg a;
    const std::string& name = arg.name();
    auto ret = std::find(returned.begin(), returned.end(), name);
    if (ret == returned.end()) ret = std::find(returned.begin(), returned.end(), Alias(name));
    if (name == "grad_out" || name == "grad_out_") {
      a.source = Source::kGrad;
    } else if (name == "query" || name == "key" || name == "value") {
      a.source = name == "query" ? Source::kQuery : name == "key" ? Source::kKey : Source::kValue;
    } else if (name == "out") {
      a.source = Source::kForwardReturn;
      a.index = b.output_index_;
    } else if (name == "logsumexp" || name == "log_sumexp") {
      a.source = Source::kForwardReturn;
      a.index = b.lse_index_;
    } else if (!name.empty() && ret != returned.end()) {
      a.source = Source::kForwardReturn;
      a.index = ret - returned.begin();
    } else if (absl::Status s = FillConstant(backward, arg, &a.value); !s.ok()) {
      return s;
    }
    b.backward_args_.push_back(std::move(a));
  }
  if (backward.returns().size() < 3) {
    return absl::FailedPreconditionError(
        absl::StrCat(backward.name(), ": returns ", backward.returns().size(),
                     " values; the kept-attention binding expects dq, dk, dv first"));
  }
  return b;
}

std::vector<c10::IValue> FusedAttentionBinding::Stack(
    const std::vector<Arg>& args, const torch::Tensor& grad, const torch::Tensor& q,
    const torch::Tensor& k, const torch::Tensor& v,
    const std::vector<c10::IValue>& forward_returns) {
  std::vector<c10::IValue> stack;
  stack.reserve(args.size());
  for (const Arg& a : args) {
    switch (a.source) {
      case Source::kQuery:
        stack.emplace_back(q);
        break;
      case Source::kKey:
        stack.emplace_back(k);
        break;
      case Source::kValue:
        stack.emplace_back(v);
        break;
      case Source::kGrad:
        stack.emplace_back(grad);
        break;
      case Source::kForwardReturn:
        TORCH_CHECK(a.index < static_cast<int64_t>(forward_returns.size()),
                    "kept attention: forward return ", a.index, " missing (",
                    forward_returns.size(), " kept)");
        stack.push_back(forward_returns[a.index]);
        break;
      case Source::kConstant:
        stack.push_back(a.value);
        break;
    }
  }
  return stack;
}

std::vector<c10::IValue> FusedAttentionBinding::ForwardStack(const torch::Tensor& q,
                                                             const torch::Tensor& k,
                                                             const torch::Tensor& v) const {
  return Stack(forward_args_, torch::Tensor(), q, k, v, {});
}

std::vector<c10::IValue> FusedAttentionBinding::BackwardStack(
    const torch::Tensor& grad, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const std::vector<c10::IValue>& forward_returns) const {
  return Stack(backward_args_, grad, q, k, v, forward_returns);
}

absl::StatusOr<FusedAttentionOp> FindFusedAttentionOp(const std::string& name) {
  auto& dispatcher = c10::Dispatcher::singleton();
  auto forward = dispatcher.findSchema(c10::OperatorName(name, ""));
  auto backward = dispatcher.findSchema(c10::OperatorName(name + "_backward", ""));
  if (!forward || !backward) {
    return absl::NotFoundError(
        absl::StrCat(name, (forward ? "_backward" : ""), " is not registered in this libtorch"));
  }
  auto binding = FusedAttentionBinding::Bind(forward->schema(), backward->schema());
  if (!binding.ok()) return binding.status();
  return FusedAttentionOp{*forward, *backward, *std::move(binding), name};
}

c10::intrusive_ptr<KeptAttentionEntry> RunFusedAttentionForward(const FusedAttentionOp& op,
                                                                const torch::Tensor& q,
                                                                const torch::Tensor& k,
                                                                const torch::Tensor& v) {
  std::vector<c10::IValue> stack = op.binding.ForwardStack(q, k, v);
  op.forward.callBoxed(&stack);
  CountCausalAttentionForward();
  auto entry = c10::make_intrusive<KeptAttentionEntry>();
  entry->kept = true;
  entry->op = op.name;
  entry->out = stack.at(op.binding.output_index()).toTensor();
  entry->lse = stack.at(op.binding.lse_index()).toTensor();
  entry->forward_returns = std::move(stack);
  return entry;
}

std::vector<torch::Tensor> RunFusedAttentionBackward(const FusedAttentionOp& op,
                                                     const KeptAttentionEntry& entry,
                                                     const torch::Tensor& grad,
                                                     const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v,
                                                     const torch::Tensor& out) {
  std::vector<c10::IValue> returns = entry.forward_returns;
  returns.at(op.binding.output_index()) = out;
  std::vector<c10::IValue> stack = op.binding.BackwardStack(grad, q, k, v, returns);
  op.backward.callBoxed(&stack);
  TORCH_CHECK(stack.size() >= 3, op.name, "_backward returned ", stack.size(), " values");
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

}  // namespace ulysses::engine
