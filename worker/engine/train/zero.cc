#include "worker/engine/train/zero.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_fields.h"
#include "common/status.h"
#include "worker/engine/train/model_io.h"

namespace ulysses::engine::train {
namespace {

constexpr char kLayerPrefix[] = "model.layers.";

// Unit of a parameter: 1 + layer index for "model.layers.<i>.*", 0 for the outer parameters.
size_t UnitOf(const std::string& name) {
  if (!absl::StartsWith(name, kLayerPrefix)) return 0;
  std::string rest = name.substr(sizeof(kLayerPrefix) - 1);
  int64_t layer = 0;
  if (!absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer) || layer < 0) return 0;
  return static_cast<size_t>(layer) + 1;
}

int64_t Bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

void ThrowIfError(const absl::Status& s) { TORCH_CHECK(s.ok(), s.ToString()); }

}  // namespace

int64_t ZeroChunk(int64_t numel, int world) {
  return std::max<int64_t>(1, (numel + world - 1) / world);
}

ElementRange ZeroOwnedRange(int64_t numel, int rank, int world) {
  const int64_t c = ZeroChunk(numel, world);
  return {std::min(numel, rank * c), std::min(numel, (rank + 1) * c)};
}

ZeroSharding::ZeroSharding(model::LlamaForCausalLM model, Communicator* world, AdamW* optimizer,
                           const ZeroOptions& options, torch::Device device)
    : model_(std::move(model)),
      world_(world),
      optimizer_(optimizer),
      options_(options),
      device_(device),
      rank_(world->rank()),
      size_(world->size()) {}

ZeroSharding::~ZeroSharding() {
  if (model_) model_->model->SetLayerHooks({});
}

absl::StatusOr<std::unique_ptr<ZeroSharding>> ZeroSharding::Create(model::LlamaForCausalLM model,
                                                                   Communicator* world,
                                                                   AdamW* optimizer,
                                                                   const ZeroOptions& options,
                                                                   torch::Device device) {
  if (options.stage < 1 || options.stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec::fields::PathOf(&spec::ParallelismSpec::zero_stage), ": ", options.stage,
                     " has no sharding (use 1, 2 or 3)"));
  }
  if (options.stage == 3 && !options.activation_checkpointing) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec::fields::PathOf(&spec::ParallelismSpec::zero_stage), ": 3 needs ",
                     spec::fields::PathOf(&spec::MemorySpec::activation_checkpointing),
                     ": true (layers are re-gathered in backward by recomputing them)"));
  }
  if (options.sharded_init && options.stage != 3) {
    return absl::InvalidArgumentError("ZeroOptions::sharded_init is for stage 3");
  }
  std::unique_ptr<ZeroSharding> z(new ZeroSharding(model, world, optimizer, options, device));
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : Params(model)) {
    Entry e;
    e.name = name;
    e.param = p;
    e.shape = p.sizes().vec();
    e.numel = p.numel();
    e.chunk = ZeroChunk(e.numel, z->size_);
    e.unit = UnitOf(name);
    optimizer->SetDecays(name, DecaysWeight(name, p));  // by the full shape
    if (options.sharded_init) {
      // One parameter at a time: its whole fp32 init, of which this rank keeps its chunk.
      e.shard =
          options.init_seed
              ? z->Slice(
                    e,
                    model::InitialParameter(name, p.sizes(), *options.init_seed).to(options.dtype))
              : torch::zeros({e.chunk}, torch::TensorOptions(options.dtype).device(device));
      p.set_data(torch::empty({0}, torch::TensorOptions(options.dtype).device(device)));
#ifdef __GLIBC__
      // The whole parameter and its padded copy are freed here; glibc would keep their heap
      // pages (below the chunks kept so far) resident, up to the model's size at W = 1
      // (bench/state_memory.sh). Give them back: the peak stays chunks + one parameter.
      malloc_trim(0);  // host memory on every device: InitialParameter makes it there
#endif
    } else {
      e.shard = z->Slice(e, p);
    }
    if (options.stage >= 2) {
      e.grad = torch::zeros(
          {e.chunk}, e.shard.options().dtype(IsLowPrecision(p) ? torch::kFloat : p.scalar_type()));
    }
    // Offloaded: AdamW updates a host copy (a distinct tensor even when the device is the CPU).
    e.target = options.offload_optimizer ? e.shard.to(torch::kCPU).clone() : e.shard;
    if (e.unit >= z->units_.size()) z->units_.resize(e.unit + 1);
    z->units_[e.unit].push_back(z->entries_.size());
    z->entries_.push_back(std::move(e));
  }
  for (const Entry& e : z->entries_) z->targets_.emplace_back(e.name, e.target);
  ZeroSharding* self = z.get();
  model::LayerHooks hooks;
  if (options.stage == 3) {
    for (size_t u = 0; u < z->units_.size(); ++u) z->ReleaseUnit(u);
    hooks.before_use = [self](int64_t layer) { ThrowIfError(self->GatherUnit(layer + 1)); };
    hooks.after_use = [self](int64_t layer) { self->ReleaseUnit(layer + 1); };
  }
  if (options.stage >= 2 && options.activation_checkpointing) {
    z->per_layer_grads_ = true;
    hooks.after_backward = [self](int64_t layer) {
      ThrowIfError(self->ReduceUnitGrads(layer + 1));
    };
  }
  model->model->SetLayerHooks(std::move(hooks));
  return z;
}

int64_t ZeroSharding::OwnedLength(const Entry& e) const {
  return std::clamp<int64_t>(e.numel - rank_ * e.chunk, 0, e.chunk);
}

torch::Tensor ZeroSharding::Slice(const Entry& e, const torch::Tensor& whole) const {
  torch::Tensor flat = whole.detach().reshape({-1});  // [n]
  // [n] -> [W*c] (zero padding) -> this rank's [c]
  return torch::constant_pad_nd(flat, {0, size_ * e.chunk - e.numel})
      .narrow(0, rank_ * e.chunk, e.chunk)
      .to(device_)
      .clone();
}

absl::Status ZeroSharding::GatherUnit(size_t unit) {
  if (unit >= units_.size() || units_[unit].empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  int64_t total = 0;
  for (size_t i : units_[unit]) {
    parts.push_back(entries_[i].shard);
    total += entries_[i].chunk;
  }
  torch::Tensor flat = torch::cat(parts);  // [C]
  torch::Tensor out = torch::empty({size_ * total}, flat.options());
  RETURN_IF_ERROR(world_->AllGather(out, flat));
  torch::Tensor rows = out.view({size_, total});  // [W*C] -> [W, C]: row j = rank j's chunks
  int64_t offset = 0;
  for (size_t i : units_[unit]) {
    Entry& e = entries_[i];
    // [W, c] -> [W*c] -> [n] -> parameter shape
    torch::Tensor full =
        rows.narrow(1, offset, e.chunk).reshape({-1}).narrow(0, 0, e.numel).view(e.shape);
    offset += e.chunk;
    if (options_.stage == 3) {
      e.param.set_data(full);
    } else {
      e.param.copy_(full);
    }
  }
  if (observer_) observer_();
  return absl::OkStatus();
}

void ZeroSharding::ReleaseUnit(size_t unit) {
  if (options_.stage != 3 || unit >= units_.size()) return;
  for (size_t i : units_[unit]) {
    Entry& e = entries_[i];
    e.param.set_data(torch::empty({0}, e.param.options()));
  }
}

absl::Status ZeroSharding::ReduceUnitGrads(size_t unit) {
  if (options_.stage < 2 || unit >= units_.size() || units_[unit].empty()) {
    return absl::OkStatus();
  }
  if (observer_) observer_();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> columns;
  int64_t total = 0;
  for (size_t i : units_[unit]) {
    Entry& e = entries_[i];
    torch::Tensor g = e.param.grad();
    torch::Tensor flat = g.defined() ? g.detach().reshape({-1}).to(e.grad.scalar_type())
                                     : torch::zeros({e.numel}, e.grad.options());
    // [n] -> [W*c] (zero padding) -> [W, c]: row j goes to rank j
    columns.push_back(
        torch::constant_pad_nd(flat, {0, size_ * e.chunk - e.numel}).view({size_, e.chunk}));
    e.param.mutable_grad() = torch::Tensor();
    total += e.chunk;
  }
  torch::Tensor in = torch::cat(columns, 1).reshape({-1});  // [W, C] -> [W*C]
  torch::Tensor out = torch::empty({total}, in.options());
  RETURN_IF_ERROR(world_->ReduceScatterSum(out, in));
  int64_t offset = 0;
  for (size_t i : units_[unit]) {
    Entry& e = entries_[i];
    e.grad.add_(out.narrow(0, offset, e.chunk));
    offset += e.chunk;
  }
  return absl::OkStatus();
}

absl::Status ZeroSharding::GatherOuter() {
  if (options_.stage != 3) return absl::OkStatus();
  return GatherUnit(0);
}

void ZeroSharding::ReleaseOuter() { ReleaseUnit(0); }

absl::Status ZeroSharding::ReduceRemainingGrads() {
  if (options_.stage < 2) return absl::OkStatus();
  for (size_t u = 0; u < units_.size(); ++u) {
    if (u == 0 || !per_layer_grads_) RETURN_IF_ERROR(ReduceUnitGrads(u));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> ZeroSharding::FinishGrads(double divisor, double clip) {
  torch::NoGradGuard no_grad;
  // Folded as DivideAndClipGrads: the norm of the undivided shards (one _foreach_norm), summed
  // over ranks, then one multiply by 1/divisor and the clipping coefficient together.
  std::vector<torch::Tensor> grads;
  for (Entry& e : entries_) grads.push_back(e.grad);
  std::vector<torch::Tensor> total = {SquaredGradNormSum(grads)};
  RETURN_IF_ERROR(world_->AllReduceSum(total));
  const double norm = std::sqrt(total[0].item<double>()) / divisor;
  double coefficient = 1.0 / divisor;
  if (clip > 0 && std::isfinite(norm) && norm > clip) coefficient *= clip / (norm + 1e-6);
  if (!grads.empty() && coefficient != 1.0) at::_foreach_mul_(grads, coefficient);
  return norm;
}

absl::Status ZeroSharding::StepShards(const std::vector<torch::Tensor>& chunk_grads, double lr) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    // Offloaded: the gradient chunk goes to the host, where AdamW and its state live.
    grads[i] = options_.offload_optimizer ? chunk_grads[i].to(torch::kCPU) : chunk_grads[i];
  }
  optimizer_->Step(targets_, grads, lr);
  if (options_.offload_optimizer) {
    for (Entry& e : entries_) e.shard.copy_(e.target);  // updated chunk back to the device
  }
  return absl::OkStatus();
}

absl::Status ZeroSharding::Update(double lr, bool apply) {
  if (options_.stage < 2) {
    return absl::FailedPreconditionError("ZeroSharding::Update is for stages 2 and 3");
  }
  if (apply) {
    std::vector<torch::Tensor> grads;
    for (const Entry& e : entries_) grads.push_back(e.grad);
    RETURN_IF_ERROR(StepShards(grads, lr));
  }
  for (Entry& e : entries_) e.grad.zero_();
  if (apply && options_.stage == 2) {
    for (size_t u = 0; u < units_.size(); ++u) RETURN_IF_ERROR(GatherUnit(u));
  }
  return absl::OkStatus();
}

absl::Status ZeroSharding::UpdateFromFullGrads(const std::vector<torch::Tensor>& grads, double lr) {
  if (options_.stage != 1 || grads.size() != entries_.size()) {
    return absl::FailedPreconditionError(
        "ZeroSharding::UpdateFromFullGrads is for stage 1, with one gradient per parameter");
  }
  std::vector<torch::Tensor> chunks;
  for (size_t i = 0; i < entries_.size(); ++i) chunks.push_back(Slice(entries_[i], grads[i]));
  RETURN_IF_ERROR(StepShards(chunks, lr));
  for (size_t u = 0; u < units_.size(); ++u) RETURN_IF_ERROR(GatherUnit(u));
  return absl::OkStatus();
}

std::vector<NamedTensor> ZeroSharding::OwnedCheckpointTensors() const {
  std::vector<NamedTensor> out;
  std::map<std::string, const Entry*> by_name;
  auto piece = [&](const std::string& name, const Entry& e, const torch::Tensor& chunk) {
    const int64_t len = OwnedLength(e);
    if (len == 0) return;
    NamedTensor nt;
    nt.name = name;
    nt.tensor = chunk.detach().narrow(0, 0, len);  // a view: the save copies it to the host
    nt.full_shape = e.shape;
    nt.offset = rank_ * e.chunk;
    out.push_back(std::move(nt));
  };
  for (const Entry& e : entries_) {
    by_name[e.name] = &e;
    piece(kModelPrefix + e.name, e, e.shard);
  }
  for (const auto& [name, t] : optimizer_->StateTensors()) {
    for (const char* prefix : {"optim/exp_avg/", "optim/exp_avg_sq/", kMasterPrefix}) {
      if (!absl::StartsWith(name, prefix)) continue;
      auto it = by_name.find(name.substr(std::string(prefix).size()));
      if (it != by_name.end()) piece(name, *it->second, t);
      break;
    }
  }
  return out;
}

absl::Status ZeroSharding::LoadOwnedState(const std::vector<NamedTensor>& tensors,
                                          int64_t adam_steps) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t;
  torch::NoGradGuard no_grad;
  // The owned chunk [c] (zero padded) of a loaded whole tensor or owned piece, on `device`. A piece
  // that is the whole chunk already on `device` is used as it is (the caller copies it): a resume
  // holds its loaded share once, not once more as chunks.
  auto chunk_of = [&](const Entry& e, const NamedTensor& t,
                      torch::Device device) -> absl::StatusOr<torch::Tensor> {
    if (!t.full_shape) {
      if (t.tensor.numel() != e.numel) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint: ", t.name, " has shape ", c10::str(t.tensor.sizes()),
                         ", parameter has ", c10::str(c10::IntArrayRef(e.shape))));
      }
      return Slice(e, t.tensor).to(device);
    }
    const ElementRange own = ZeroOwnedRange(e.numel, rank_, size_);
    if (*t.full_shape != e.shape || t.offset != own.begin ||
        t.tensor.numel() != own.end - own.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint: piece of ", t.name, " at element ", t.offset, " (", t.tensor.numel(),
          " elements) is not rank ", rank_, "'s chunk [", own.begin, ", ", own.end, ")"));
    }
    torch::Tensor flat = t.tensor.reshape({-1});  // [len]
    if (flat.numel() == e.chunk && flat.device() == device) return flat;
    // [len] -> [c] (zero padding, like Slice)
    return torch::constant_pad_nd(flat, {0, e.chunk - flat.numel()}).to(device);
  };
  std::map<std::string, torch::Tensor> chunks;
  for (Entry& e : entries_) {
    auto model_it = by_name.find(kModelPrefix + e.name);
    if (model_it != by_name.end()) {
      ASSIGN_OR_RETURN(torch::Tensor c, chunk_of(e, *model_it->second, device_));
      e.shard.copy_(c);
      if (!e.target.is_same(e.shard)) e.target.copy_(e.shard);
    } else if (options_.stage == 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: tensor ", kModelPrefix, e.name, " is missing"));
    }
    for (const char* prefix : {"optim/exp_avg/", "optim/exp_avg_sq/", kMasterPrefix}) {
      auto it = by_name.find(prefix + e.name);
      if (it == by_name.end()) continue;
      // Where AdamW keeps it (the host when offloading): LoadState copies it there once.
      ASSIGN_OR_RETURN(torch::Tensor c, chunk_of(e, *it->second, e.target.device()));
      chunks[it->first] = c;
    }
  }
  return optimizer_->LoadState(targets_, chunks, adam_steps);
}

ModelStateResidency ZeroSharding::Residency() const {
  ModelStateResidency r;
  for (const Entry& e : entries_) {
    r.parameters += Bytes(e.shard) + (e.target.is_same(e.shard) ? 0 : Bytes(e.target));
    r.gradients += Bytes(e.grad);
  }
  return r;
}

}  // namespace ulysses::engine::train
