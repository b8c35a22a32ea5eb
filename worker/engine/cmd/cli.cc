#include "worker/engine/cmd/cli.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/contract/exit.h"
#include "common/contract/rank_control.h"
#include "common/process/cpu_share.h"
#include "common/spec/job_spec_fields.h"
#include "common/spec/job_spec_parser.h"
#include "common/status.h"
#include "common/stop.h"
#include "worker/engine/cmd/launcher.h"
#include "worker/engine/data/indexed.h"
#include "worker/engine/hf/export.h"
#include "worker/engine/parallel/rendezvous_port.h"
#include "worker/engine/train/device_memory.h"
#include "worker/engine/train/engine.h"

namespace ulysses::engine::train {
namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  ulysses-train train  -f JOB.yaml [--nproc N] [--out DIR] [--device cpu|cuda|cuda:N]"
    " [--peak-flops F] [--intra-op-threads N] [--stop-grace-s G] [--set spec.path=value ...]\n"
    "  ulysses-train eval   -f JOB.yaml [--nproc N] [--checkpoint DIR | --init-from HFDIR]"
    " [--seq-len T]\n"
    "  ulysses-train export --checkpoint DIR --hf-out DIR [--dtype bf16|fp16|fp32|fp64]\n"
    "                       [--max-file-bytes N] [--tokenizer-from HFDIR]\n"
    "  ulysses-train rank   -f JOB.yaml --out DIR --stage I --rank R --world-size W"
    " --master-addr HOST --master-port PORT [--device cpu|cuda:N] [--backend auto|gloo|nccl]"
    " [--collective-timeout-s S] [--step-events rank0|all] [--peak-flops F]"
    " [--progress-line off|stderr] [--intra-op-threads N] [--stop-grace-s G]"
    " [--control none|stdin] [--set ...]\n"
    "  ulysses-train data pack --out PREFIX (--jsonl FILE | --from-flat FILE (--doc-len N | --eos "
    "ID))"
    " [--vocab-size V]\n";

struct Flags {
  std::map<std::string, std::string> values;
  std::vector<std::string> sets;
  bool Has(const std::string& k) const { return values.count(k) > 0; }
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second;
  }
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv, int first,
                                 const std::vector<std::string>& allowed) {
  Flags f;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    bool known = false;
    for (const auto& a : allowed) known = known || a == arg;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "'\n", kUsage));
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("flag ", arg, " needs a value"));
      }
      value = argv[++i];
    }
    if (arg == "--set") {
      f.sets.push_back(value);
    } else {
      f.values[arg] = value;
    }
  }
  return f;
}

absl::StatusOr<int> IntFlag(const Flags& f, const std::string& name, int def) {
  if (!f.Has(name)) return def;
  int v = 0;
  if (!absl::SimpleAtoi(f.Get(name), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": '", f.Get(name), "' is not an integer"));
  }
  return v;
}

// --intra-op-threads: 0 (libtorch's default) or 1..kMaxIntraOpThreads; `def` when absent.
absl::StatusOr<int> IntraOpThreadsFlag(const Flags& f, int def) {
  ASSIGN_OR_RETURN(int v, IntFlag(f, "--intra-op-threads", def));
  if (v < 0 || v > process::kMaxIntraOpThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--intra-op-threads: ", v, " is outside 0..", process::kMaxIntraOpThreads,
        " (each rank's libtorch threads: its share of the cores; 0 = libtorch's default)"));
  }
  return v;
}

// --stop-grace-s: seconds from SIGTERM to SIGKILL, 0..86400; 0 (no deadline) when absent.
absl::StatusOr<double> StopGraceFlag(const Flags& f) {
  if (!f.Has("--stop-grace-s")) return 0.0;
  double v = 0;
  if (!absl::SimpleAtod(f.Get("--stop-grace-s"), &v) || !std::isfinite(v) || v < 0 || v > 86400) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stop-grace-s: '", f.Get("--stop-grace-s"),
        "' is not seconds in 0..86400 (the time from SIGTERM to SIGKILL, e.g. 30; 0 = none)"));
  }
  return v;
}

// --peak-flops: a finite FLOP/s >= 0; 0 (unknown) when absent.
absl::StatusOr<double> PeakFlopsFlag(const Flags& f) {
  if (!f.Has("--peak-flops")) return 0.0;
  double v = 0;
  if (!absl::SimpleAtod(f.Get("--peak-flops"), &v) || !std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peak-flops: '", f.Get("--peak-flops"),
                     "' is not a finite FLOP/s >= 0 (the device's dense peak, e.g. 989e12 for "
                     "an H100 in bf16; 0 = unknown)"));
  }
  return v;
}

absl::StatusOr<std::string> Required(const Flags& f, const std::string& name) {
  if (!f.Has(name) || f.Get(name).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": required\n", kUsage));
  }
  return f.Get(name);
}

int Fail(const absl::Status& s) {
  std::cerr << "ulysses-train: " << s.message() << std::endl;
  return contract::RankExitCodeFor(s);
}

// Where the local launcher puts its ranks: all on the CPU, or round-robin over the visible GPUs.
// When ranks outnumber GPUs they share devices and talk Gloo (NCCL refuses two ranks on one GPU).
struct RankDevice {
  std::string device;
  std::string backend;
};
struct LocalDevicePlan {
  bool cuda = false;
  int first = 0;  // cuda:N pins every rank to GPU N
  int count = 0;  // GPUs to spread over (0 for cpu)
  RankDevice For(int rank, int world) const {
    if (!cuda) return {"cpu", "auto"};
    const int index = first + rank % count;
    return {absl::StrCat("cuda:", index), world > count ? "gloo" : "auto"};
  }
};

absl::StatusOr<LocalDevicePlan> LocalDevices(const std::string& device) {
  LocalDevicePlan plan;
  if (device == "cpu") return plan;
  const int visible = static_cast<int>(torch::cuda::device_count());
  int index = -1;
  if (device != "cuda" && !(absl::StartsWith(device, "cuda:") &&
                            absl::SimpleAtoi(device.substr(5), &index) && index >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", device, "' is not cpu, cuda or cuda:N"));
  }
  if (visible == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", device, "' but no CUDA device is visible (use --device cpu)"));
  }
  if (index >= visible) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", device, "' but only ", visible, " CUDA devices are visible"));
  }
  plan.cuda = true;
  plan.first = index < 0 ? 0 : index;
  plan.count = index < 0 ? visible : 1;
  return plan;
}

#define OR_FAIL(lhs, expr)                            \
  auto lhs##_or = (expr);                             \
  if (!lhs##_or.ok()) return Fail(lhs##_or.status()); \
  auto lhs = std::move(lhs##_or).value()

int RankCommand(int argc, char** argv) {
  OR_FAIL(f, ParseFlags(argc, argv, 2,
                        {"-f",
                         "--out",
                         "--stage",
                         "--rank",
                         "--world-size",
                         "--master-addr",
                         "--master-port",
                         "--device",
                         "--backend",
                         "--collective-timeout-s",
                         "--step-events",
                         "--peak-flops",
                         "--progress-line",
                         "--intra-op-threads",
                         "--stop-grace-s",
                         "--control",
                         "--job-id",
                         "--tenant",
                         "--generation",
                         "--set"}));
  RankOptions o;
  OR_FAIL(job, Required(f, "-f"));
  OR_FAIL(out, Required(f, "--out"));
  OR_FAIL(stage, IntFlag(f, "--stage", 0));
  OR_FAIL(rank, IntFlag(f, "--rank", 0));
  OR_FAIL(world, IntFlag(f, "--world-size", 1));
  OR_FAIL(port, IntFlag(f, "--master-port", 0));
  OR_FAIL(timeout_s, IntFlag(f, "--collective-timeout-s", 60));
  if (timeout_s < 1 || timeout_s > 86400) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--collective-timeout-s: ", timeout_s,
                     " is outside 1..86400 (use e.g. 600 when ranks load large checkpoints)")));
  }
  o.collective_timeout_s = timeout_s;
  o.job_file = job;
  o.out_dir = out;
  o.stage = stage;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.master_addr = f.Get("--master-addr", "127.0.0.1");
  o.device = f.Get("--device", "cpu");
  o.backend = f.Get("--backend", "auto");
  o.job_id = f.Get("--job-id", "");
  o.tenant = f.Get("--tenant", "");
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string*>{"--job-id", &o.job_id},
        {"--tenant", &o.tenant}}) {
    const bool plain =
        value->size() <= 128 && std::all_of(value->begin(), value->end(), [](char c) {
          return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
        });
    if (!plain) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          flag, ": not at most 128 of [A-Za-z0-9._-] (the coordinator's job id and tenant)")));
    }
  }
  OR_FAIL(generation, IntFlag(f, "--generation", -1));
  o.generation = generation;
  if (const char* secret = std::getenv(contract::kRendezvousSecretEnv); secret != nullptr) {
    o.rendezvous_secret = secret;
    unsetenv(contract::kRendezvousSecretEnv);  // Not inherited by anything the rank starts.
  }
  const std::string step_events = f.Get("--step-events", "rank0");
  if (step_events != "rank0" && step_events != "all") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--step-events: \"", step_events,
                     "\" is not rank0 or all (all: every rank prints its "
                     "step events)")));
  }
  o.step_events_all_ranks = step_events == "all";
  OR_FAIL(peak_flops, PeakFlopsFlag(f));
  o.peak_flops = peak_flops;
  const std::string progress_line = f.Get("--progress-line", "off");
  if (progress_line != "off" && progress_line != "stderr") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--progress-line: \"", progress_line,
                     "\" is not off or stderr (stderr: rank 0 prints a human progress line per "
                     "step)")));
  }
  o.progress_line = progress_line == "stderr";
  OR_FAIL(threads, IntraOpThreadsFlag(f, 0));
  o.intra_op_threads = threads;
  OR_FAIL(grace, StopGraceFlag(f));
  o.stop_grace_s = grace;
  const std::string control = f.Get("--control", "none");
  if (control != "none" && control != "stdin") {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--control: \"", control,
        "\" is not none or stdin (stdin: read checkpoint interval updates, one JSON line each)")));
  }
  o.control_stdin = control == "stdin";
  o.overrides = f.sets;
  if (world > 1 && port <= 0) {
    return Fail(absl::InvalidArgumentError("--master-port: required when --world-size > 1"));
  }
  auto result = RunRank(o);
  if (!result.ok()) return Fail(result.status());
  return result->preempted ? contract::kExitPreempted : contract::kExitOk;
}

int TrainCommand(int argc, char** argv) {
  OR_FAIL(f, ParseFlags(argc, argv, 2,
                        {"-f", "--nproc", "--out", "--device", "--peak-flops", "--intra-op-threads",
                         "--stop-grace-s", "--set"}));
  OR_FAIL(job, Required(f, "-f"));
  OR_FAIL(nproc, IntFlag(f, "--nproc", 0));
  OR_FAIL(stop_grace, StopGraceFlag(f));
  OR_FAIL(peak_flops, PeakFlopsFlag(f));
  OR_FAIL(explicit_threads, IntraOpThreadsFlag(f, 0));
  spec::ParseOptions popts;
  popts.overrides = f.sets;
  OR_FAIL(spec, spec::LoadJobSpecFile(job, popts));
  for (size_t i = 0; i < spec.stages.size(); ++i) {
    if (nproc > 0 && spec.StageWorld(i) != nproc) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--nproc: ", nproc, " != sp_degree ", spec.StageSp(i), " x dp_degree ",
                       spec.StageDp(i), " of ", spec::fields::PathOf(&spec::JobSpec::stages), "[",
                       i, "] (omit --nproc or make them equal)")));
    }
  }
  std::string out = f.Get("--out", (std::filesystem::path("runs") / spec.metadata.name).string());
  OR_FAIL(devices, LocalDevices(f.Get("--device", "cpu")));
  OR_FAIL(first_stage, FirstStageToRun(spec, out));
  const size_t first = static_cast<size_t>(first_stage);
  InstallStopSignalHandlers();
  const std::string self = SelfExe();
  for (size_t stage = first; stage < spec.stages.size(); ++stage) {
    const int world = static_cast<int>(spec.StageWorld(stage));
    OR_FAIL(port, PickRendezvousPort());
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> a = {self,
                                    "rank",
                                    "-f",
                                    job,
                                    "--out",
                                    out,
                                    "--stage",
                                    std::to_string(stage),
                                    "--rank",
                                    std::to_string(r),
                                    "--world-size",
                                    std::to_string(world),
                                    "--master-addr",
                                    "127.0.0.1",
                                    "--master-port",
                                    std::to_string(port)};
      const RankDevice d = devices.For(r, world);
      for (const std::string& flag :
           {std::string("--device"), d.device, std::string("--backend"), d.backend,
            std::string("--progress-line"), std::string("stderr")}) {
        a.push_back(flag);
      }
      if (peak_flops > 0) {
        a.push_back("--peak-flops");
        a.push_back(f.Get("--peak-flops"));
      }
      // Every rank of the stage runs on this machine: each gets its share of the cores.
      const int threads = f.Has("--intra-op-threads")
                              ? explicit_threads
                              : process::IntraOpThreadShare(process::UsableCores(), world);
      if (threads > 0) {
        a.push_back("--intra-op-threads");
        a.push_back(std::to_string(threads));
      }
      if (stop_grace > 0) {  // SIGTERM: each rank leaves within the grace (preemption.h)
        a.push_back("--stop-grace-s");
        a.push_back(f.Get("--stop-grace-s"));
      }
      for (const auto& s : f.sets) {
        a.push_back("--set");
        a.push_back(s);
      }
      argvs.push_back(std::move(a));
    }
    int code = RunProcesses(argvs);
    if (code != 0) return code;
    if (StopRequested()) return contract::kExitPreempted;
  }
  return contract::kExitOk;
}

int EvalCommand(int argc, char** argv) {
  OR_FAIL(f, ParseFlags(argc, argv, 2,
                        {"-f", "--nproc", "--checkpoint", "--init-from", "--seq-len", "--set",
                         "--rank", "--world-size", "--master-addr", "--master-port", "--device"}));
  OR_FAIL(job, Required(f, "-f"));
  OR_FAIL(nproc, IntFlag(f, "--nproc", 1));
  OR_FAIL(seq_len, IntFlag(f, "--seq-len", 0));
  EvalOptions o;
  o.job_file = job;
  o.overrides = f.sets;
  o.checkpoint = f.Get("--checkpoint");
  o.init_from = f.Get("--init-from");
  o.seq_len = seq_len;
  o.device = f.Get("--device", "cpu");
  if (f.Has("--rank")) {  // one rank of a multi-process eval (spawned below)
    OR_FAIL(rank, IntFlag(f, "--rank", 0));
    OR_FAIL(world, IntFlag(f, "--world-size", 1));
    OR_FAIL(port, IntFlag(f, "--master-port", 0));
    o.rank = rank;
    o.world_size = world;
    o.master_port = port;
    o.master_addr = f.Get("--master-addr", "127.0.0.1");
  } else if (nproc > 1) {
    OR_FAIL(port, PickRendezvousPort());
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < nproc; ++r) {
      std::vector<std::string> a(argv, argv + argc);
      a[0] = SelfExe();
      for (auto extra : {std::make_pair("--rank", std::to_string(r)),
                         std::make_pair("--world-size", std::to_string(nproc)),
                         std::make_pair("--master-port", std::to_string(port))}) {
        a.push_back(extra.first);
        a.push_back(extra.second);
      }
      argvs.push_back(std::move(a));
    }
    return RunProcesses(argvs);
  } else if (nproc < 1) {
    return Fail(absl::InvalidArgumentError("--nproc: must be >= 1"));
  }
  auto r = RunEvalRank(o);
  if (!r.ok()) return Fail(r.status());
  if (o.rank == 0) {
    nlohmann::json j{{"loss", r->loss}, {"tokens", r->tokens}};
    if (r->has_accuracy) j["accuracy"] = r->accuracy;
    std::cout << j.dump() << std::endl;
  }
  return contract::kExitOk;
}

int ExportCommand(int argc, char** argv) {
  OR_FAIL(f, ParseFlags(
                 argc, argv, 2,
                 {"--checkpoint", "--hf-out", "--dtype", "--max-file-bytes", "--tokenizer-from"}));
  ExportOptions o;
  if (f.Has("--max-file-bytes")) {
    const std::string v = f.Get("--max-file-bytes");
    if (!absl::SimpleAtoi(v, &o.max_file_bytes) || o.max_file_bytes < 1) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--max-file-bytes: '", v, "' is not a byte count >= 1 (default 5000000000, HF's 5 GB)")));
    }
  }
  o.dtype = f.Get("--dtype");
  if (f.Has("--dtype") && o.dtype.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--dtype: '' is not an export dtype (use bf16, fp16, fp32 or fp64, or leave it out)"));
  }
  OR_FAIL(ckpt, Required(f, "--checkpoint"));
  OR_FAIL(out, Required(f, "--hf-out"));
  o.checkpoint = ckpt;
  o.hf_out = out;
  if (f.Has("--tokenizer-from")) {
    o.tokenizer_from = f.Get("--tokenizer-from");
    if (o.tokenizer_from.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--tokenizer-from: '' is not a directory (give the HF model directory, or leave it out "
          "to copy the tokenizer of the job's init_from)"));
    }
  }
  OR_FAIL(result, ExportCheckpoint(o));
  if (!result.tokenizer_note.empty()) std::cerr << "warning: " << result.tokenizer_note << "\n";
  std::cout << nlohmann::json{{"checkpoint", result.checkpoint},
                              {"hf_out", out},
                              {"dtype", result.dtype},
                              {"tensors", result.tensors},
                              {"from_masters", result.from_masters},
                              {"files", result.files},
                              {"largest_tensor_bytes", result.largest_tensor_bytes},
                              {"bytes_read", result.bytes_read},
                              {"tokenizer_from", result.tokenizer_from},
                              {"tokenizer_files", result.tokenizer_files}}
                   .dump()
            << std::endl;
  return contract::kExitOk;
}

// `ulysses-train data pack`: builds an indexed dataset (worker/engine/data/indexed.h).
int DataCommand(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]) != "pack") {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("data: the only verb is `pack`\n", kUsage)));
  }
  OR_FAIL(f, ParseFlags(argc, argv, 3,
                        {"--out", "--jsonl", "--from-flat", "--doc-len", "--eos", "--vocab-size"}));
  OR_FAIL(out, Required(f, "--out"));
  OR_FAIL(vocab, IntFlag(f, "--vocab-size", 0));
  if (f.Has("--jsonl") == f.Has("--from-flat")) {
    return Fail(absl::InvalidArgumentError(
        "data pack: give exactly one input, --jsonl FILE or --from-flat FILE"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<PackStats> stats;
  if (f.Has("--jsonl")) {
    if (f.Has("--doc-len") || f.Has("--eos")) {
      return Fail(absl::InvalidArgumentError(
          "data pack --jsonl: --doc-len/--eos apply to --from-flat only (JSONL lines are the "
          "documents)"));
    }
    stats = PackJsonl(f.Get("--jsonl"), out, vocab);
  } else {
    OR_FAIL(doc_len, IntFlag(f, "--doc-len", 0));
    OR_FAIL(eos, IntFlag(f, "--eos", -1));
    stats = PackFlat(f.Get("--from-flat"), out, doc_len, eos, vocab);
  }
  if (!stats.ok()) return Fail(stats.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << nlohmann::json{{"prefix", out},
                              {"documents", stats->documents},
                              {"tokens", stats->tokens},
                              {"mask", stats->has_mask},
                              {"seconds", seconds}}
                   .dump()
            << std::endl;
  return contract::kExitOk;
}

}  // namespace

int UlyssesTrainMain(int argc, char** argv) {
  ConfigureCudaAllocator();  // Before any CUDA allocation (the ranks inherit it too).
  if (argc < 2) {
    std::cerr << kUsage;
    return contract::kExitBadInput;
  }
  const std::string cmd = argv[1];
  // `ulysses-train train --help` (any command): the usage, not "unknown flag".
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << kUsage;
      return contract::kExitOk;
    }
  }
  if (cmd == "rank") return RankCommand(argc, argv);
  if (cmd == "train") return TrainCommand(argc, argv);
  if (cmd == "eval") return EvalCommand(argc, argv);
  if (cmd == "export") return ExportCommand(argc, argv);
  if (cmd == "data") return DataCommand(argc, argv);
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::cout << kUsage;
    return contract::kExitOk;
  }
  std::cerr << "ulysses-train: unknown command '" << cmd << "'\n" << kUsage;
  return contract::kExitBadInput;
}

}  // namespace ulysses::engine::train
