#include "worker/engine/parallel/communicator.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/net/host_port.h"
#include "common/status.h"
#include "worker/engine/parallel/gloo_communicator.h"
#include "worker/engine/parallel/host_staging_communicator.h"
#ifdef ULYSSES_HAVE_CUDA
#include "worker/engine/parallel/nccl_communicator.h"
#endif

namespace ulysses::engine {
namespace {

// Parses "cuda:N" into N; -1 for "cpu"; -2 for anything else.
int ParseDevice(const std::string& device) {
  if (device == "cpu") return -1;
  int index = 0;
  if (absl::StartsWith(device, "cuda:") &&
      absl::SimpleAtoi(absl::string_view(device).substr(5), &index) && index >= 0) {
    return index;
  }
  return -2;
}

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Rank 0 names the attempt in its store (and leaves a key only holders of the secret find);
// every other rank checks both before it writes anything there.
absl::Status CheckAttempt(c10d::Store& store, const CommConfig& config) {
  const std::string proof = absl::StrCat(config.attempt, "/", config.secret, "/ulysses/joined");
  const std::string where = absl::StrCat(config.master_addr, ":", config.master_port);
  try {
    if (config.rank == 0) {
      store.set(proof, Bytes("1"));
      store.set(kAttemptKey, Bytes(config.attempt));
      return absl::OkStatus();
    }
    store.wait({kAttemptKey}, config.timeout);
    const std::vector<uint8_t> named = store.get(kAttemptKey);
    const std::string theirs(named.begin(), named.end());
    const std::string fix =
        "rank 0 of this attempt could not host the rendezvous on that port and another job's "
        "rank 0 holds it (another coordinator on the host with an overlapping rendezvous port "
        "range: give each its own rendezvous_port_min..rendezvous_port_max); the attempt is "
        "retried";
    if (theirs != config.attempt) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", config.rank, " of ", config.attempt.empty() ? "a run" : config.attempt,
          " met the rendezvous store of ",
          theirs.empty() ? std::string("an unnamed attempt") : theirs.substr(0, 128), " at ", where,
          " and left it (", fix, ")"));
    }
    if (!store.check({proof})) {
      return absl::UnavailableError(
          absl::StrCat("rank ", config.rank, " of ", config.attempt, " met a rendezvous store at ",
                       where, " that names this attempt without its secret (", fix, ")"));
    }
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    return absl::UnavailableError(absl::StrCat("rendezvous at ", where, " (rank ", config.rank,
                                               "): the store did not name its attempt: ", msg));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCommConfig(const CommConfig& c) {
  if (c.backend != "gloo" && c.backend != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.backend: '", c.backend, "' is not supported; use gloo or nccl"));
  }
#ifndef ULYSSES_HAVE_CUDA
  if (c.backend == "nccl") {
    return absl::InvalidArgumentError(
        "comm.backend: 'nccl' needs a build with CUDA/NCCL (ULYSSES_HAVE_CUDA); use gloo");
  }
#endif
  if (c.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.world_size: ", c.world_size, " must be >= 1"));
  }
  if (c.rank < 0 || c.rank >= c.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("comm.rank: ", c.rank, " must be in [0, ",
                                                   c.world_size, ") for world_size ",
                                                   c.world_size));
  }
  if (c.sp_size < 1 || c.world_size % c.sp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.sp_size: ", c.sp_size, " must be >= 1 and divide world_size (",
                     c.world_size, "); world_size = sp_size * dp_size"));
  }
  if (c.world_size > 1 && (c.master_port < 1 || c.master_port > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("comm.master_port: ", c.master_port,
                                                   " must be in [1, 65535] when world_size > 1"));
  }
  if (c.world_size > 1 && c.master_addr.empty()) {
    return absl::InvalidArgumentError("comm.master_addr: empty; set the host of rank 0");
  }
  if (c.timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.timeout: ", c.timeout.count(), " ms must be > 0"));
  }
  int dev = ParseDevice(c.device);
  if (dev == -2) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.device: '", c.device, "' is not cpu or cuda:N"));
  }
  if (c.backend == "nccl" && dev < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.device: '", c.device, "' with backend nccl; use cuda:N"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProcessGroups> CreateProcessGroups(const CommConfig& config) {
  RETURN_IF_ERROR(ValidateCommConfig(config));
  const int rank = config.rank, world = config.world_size, sp = config.sp_size;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    if (world == 1) {
      store = c10::make_intrusive<c10d::HashStore>();
    } else {
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<std::uint16_t>(config.master_port);
      opts.isServer = rank == 0;
      opts.numWorkers = world;
      opts.waitWorkers = true;
      opts.timeout = config.timeout;
      store = c10::make_intrusive<c10d::TCPStore>(config.master_addr, opts);
    }
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    if (rank == 0 && world > 1) {
      return absl::UnavailableError(absl::StrCat(
          "rank 0 could not host the rendezvous on port ", config.master_port, " of ",
          config.master_addr, ": ", msg,
          " (another process on that host holds the port, e.g. a job of another coordinator "
          "whose rendezvous port range overlaps this one's: give each coordinator on a host "
          "its own rendezvous_port_min..rendezvous_port_max; the attempt is retried)"));
    }
    return absl::UnavailableError(absl::StrCat("rendezvous at ", config.master_addr, ":",
                                               config.master_port, " (rank ", rank, " of ", world,
                                               ") failed: ", msg));
  }
  if (!config.attempt.empty() || !config.secret.empty()) {
    RETURN_IF_ERROR(CheckAttempt(*store, config));
    store = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat(config.attempt, "/", config.secret),
                                                   store);
  }

  ProcessGroups groups;
  groups.sp_rank = rank % sp;
  groups.dp_rank = rank / sp;
  const int dp = world / sp;
  const std::string sp_name = absl::StrCat("sp", rank / sp);
  const std::string dp_name = absl::StrCat("dp", groups.sp_rank);
  auto make = [&](const std::string& name, int r,
                  int n) -> absl::StatusOr<std::unique_ptr<Communicator>> {
#ifdef ULYSSES_HAVE_CUDA
    if (config.backend == "nccl") {
      return internal::CreateNcclCommunicator(store, name, r, n, ParseDevice(config.device),
                                              config.timeout);
    }
#endif
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> gloo,
                     internal::CreateGlooCommunicator(store, name, r, n, config.timeout,
                                                      net::IsLoopbackHost(config.master_addr)));
    // Gloo here reduces CPU tensors; ranks on a GPU stage theirs through host memory.
    if (ParseDevice(config.device) >= 0) return internal::WrapWithHostStaging(std::move(gloo));
    return gloo;
  };
  // Same construction order on every rank: world, then sp, then dp.
  ASSIGN_OR_RETURN(groups.world, make("world", rank, world));
  ASSIGN_OR_RETURN(groups.sp, make(sp_name, groups.sp_rank, sp));
  ASSIGN_OR_RETURN(groups.dp, make(dp_name, groups.dp_rank, dp));
  return groups;
}

}  // namespace ulysses::engine
