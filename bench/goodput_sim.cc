// Goodput at cluster scale in virtual time (issue 26, docs/BENCHMARKS.md "Goodput at scale").
//
// Drives the coordinator's own decision code, not a copy of it:
//   - placement, the queue and priority preemption: coordinator/scheduler.h PlanQueue;
//   - failure budgets: coordinator/failure_budget.h CountFailure;
//   - the checkpoint interval (`every_steps: auto`): coordinator/checkpoint_interval.h
//     ChooseCheckpointInterval, fed the blocking cost and the failures the run has observed;
//   - goodput accounting: coordinator/goodput.h (GoodputStart/Step/Commit/End/Settle);
//   - sizes: the job's spec (configs/jobs/llama3-8b-1m.yaml) through common/spec, checkpoint
//     bytes from common/spec/memory_model.h, step time from common/spec/model_math.h.
// What is modelled (the stated assumptions, flags below):
//   - N nodes x 8 GPUs; the measured job runs its 1M-token stage on --job-gpus GPUs (SP 8 as in
//     the config, DP = job-gpus / 8) at --mfu of an H100's dense bf16 peak; the other nodes run
//     preemptible low-priority 8-GPU jobs that the measured job preempts when it needs room;
//   - node failures: exponential, the Llama 3 rate (419 interruptions in 54 days on 16,384
//     GPUs) or --harsh times it; a failed node is repaired after an exponential --repair-h;
//   - spot reclaims: exponential per node (--spot-per-node-day) with a 30 s notice: ranks
//     finish the step if it ends within the notice and snapshot it (the SIGTERM path), else the
//     in-flight checkpoint completes if it can; the node returns after --spot-return-h;
//   - checkpoint cost: the checkpoint's bytes over --storage-gbps (aggregate). Synchronous saves
//     block that long; asynchronous ones block for the host copy of a rank's share at
//     --d2h-gbps and write in the background (the next save waits for it: counted as blocking);
//   - a restart costs --restart-s (launch, rendezvous) plus reading the checkpoint back.
// ETTR (effective training time ratio, Kokolis et al., arXiv 2410.21680): productive training
// time (steps that reached a committed checkpoint) over the wall time since submission.
//
//   build/bin/goodput_sim [--nodes 160] [--job-gpus 1024] [--days 30] [--seeds 8]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec_parser.h"
#include "common/spec/memory_model.h"
#include "common/spec/model_math.h"
#include "coordinator/checkpoint_interval.h"
#include "coordinator/failure_budget.h"
#include "coordinator/goodput.h"
#include "coordinator/model.h"
#include "coordinator/scheduler.h"

namespace ulysses::coordinator {
namespace {

constexpr int kGpusPerNode = 8;
constexpr double kH100Bf16Peak = 989e12;
constexpr double kNoticeS = 30;  // Spot reclaim notice (SIGTERM grace).

struct Options {
  int nodes = 160;
  int job_gpus = 1024;
  double days = 30;
  int seeds = 8;
  double mfu = 0.40;
  double storage_gbps = 20;  // Aggregate write/read bandwidth of the checkpoint store (GB/s).
  double d2h_gbps = 20;      // Per-rank device-to-host copy (pinned) for the async snapshot.
  double restart_s = 120;    // Launch, rendezvous and warm-up of a new attempt.
  double repair_h = 4;       // Mean time to bring a failed node back.
  double spot_per_node_day = 0.01;
  double spot_return_h = 1;
  std::string spec = "configs/jobs/llama3-8b-1m.yaml";
};

enum class Policy { kEvery20Steps, kEveryHour, kAuto };
const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kEvery20Steps:
      return "every 20 steps";
    case Policy::kEveryHour:
      return "every hour";
    case Policy::kAuto:
      return "auto";
  }
  return "?";
}

struct Sizes {
  double step_s = 0;          // One optimizer step of the 1M stage.
  double ckpt_bytes = 0;      // The whole checkpoint.
  double snapshot_bytes = 0;  // One rank's share (async host copy).
  int64_t sp = 8;
};

struct Scenario {
  Policy policy;
  bool async;
  double failure_scale;  // 1 = Llama 3 rate, 10 = harsh.
};

struct Result {
  double ettr = 0, goodput = 0, mean_interval_s = 0, blocked_s = 0;
  int failures = 0, reclaims = 0, checkpoints = 0;
  bool budget_exhausted = false;
};

enum class Ev { kNodeFail, kNodeBack, kSpotNotice, kStepEnd, kLaunched, kSchedule };
struct Event {
  double t;
  Ev kind;
  int node = -1;
  int64_t generation = 0;  // kStepEnd / kLaunched: which attempt (stale ones are dropped).
  int64_t epoch = 0;       // Node events: the node's up-period they were drawn in.
  bool operator>(const Event& o) const { return t > o.t; }
};

class Sim {
 public:
  Sim(const Options& o, const Sizes& s, const Scenario& sc, uint64_t seed)
      : o_(o), s_(s), sc_(sc), rng_(seed), nodes_(o.nodes) {
    rec_.id = "main";
    rec_.max_infra_failures = 20;
    rec_.failure_window_s = 86400;
    const double node_fail_rate = kGpusPerNode / kLlama3GpuMtbfSeconds * sc.failure_scale;
    for (int n = 0; n < o_.nodes; ++n) {
      Push({Exp(node_fail_rate), Ev::kNodeFail, n, 0, 0});
      if (o_.spot_per_node_day > 0) {
        Push({Exp(o_.spot_per_node_day / 86400.0), Ev::kSpotNotice, n, 0, 0});
      }
    }
    Push({0, Ev::kSchedule});
  }

  Result Run() {
    const double end = o_.days * 86400.0;
    while (!events_.empty() && events_.top().t <= end && !rec_failed_) {
      Event e = events_.top();
      events_.pop();
      now_ = e.t;
      Handle(e);
    }
    now_ = end;
    if (running_) EndAttempt(v1::ATTEMPT_OUTCOME_ABORTED);  // The horizon: uncommitted is lost.
    bool changed = false;
    GoodputSettle(g_, Ms(now_), 0, /*force=*/true, &changed);
    Result r;
    const double world = o_.job_gpus;
    r.ettr = g_.productive_gpu_s / world / end;
    r.goodput = g_.allocated_gpu_s > 0 ? g_.productive_gpu_s / g_.allocated_gpu_s : 0;
    r.failures = failures_;
    r.reclaims = reclaims_;
    r.checkpoints = checkpoints_;
    r.blocked_s = blocked_total_;
    r.mean_interval_s = checkpoints_ > 0 ? interval_sum_ / checkpoints_ : 0;
    r.budget_exhausted = rec_failed_;
    return r;
  }

 private:
  struct Node {
    bool up = true;
    bool main = false;    // Holds ranks of the measured job.
    bool filler = false;  // Holds a preemptible 8-GPU job.
    int64_t epoch = 0;    // Up-periods so far: failure and reclaim draws belong to one.
  };

  static int64_t Ms(double t) { return static_cast<int64_t>(std::llround(t * 1000.0)); }
  double Exp(double rate) { return now_ + std::exponential_distribution<double>(rate)(rng_); }
  void Push(Event e) { events_.push(e); }

  void Handle(const Event& e) {
    // A failure or reclaim drawn in an earlier up-period of its node (it went down since).
    if ((e.kind == Ev::kNodeFail || e.kind == Ev::kSpotNotice) && e.epoch != nodes_[e.node].epoch) {
      return;
    }
    switch (e.kind) {
      case Ev::kNodeFail:
        NodeDown(e.node, /*notice=*/false);
        Push({Exp(1.0 / (o_.repair_h * 3600)), Ev::kNodeBack, e.node});
        break;
      case Ev::kSpotNotice:
        NodeDown(e.node, /*notice=*/true);
        Push({Exp(1.0 / (o_.spot_return_h * 3600)), Ev::kNodeBack, e.node});
        break;
      case Ev::kNodeBack: {
        Node& node = nodes_[e.node];
        node.up = true;
        ++node.epoch;
        const double rate = kGpusPerNode / kLlama3GpuMtbfSeconds * sc_.failure_scale;
        Push({Exp(rate), Ev::kNodeFail, e.node, 0, node.epoch});
        if (o_.spot_per_node_day > 0) {
          Push({Exp(o_.spot_per_node_day / 86400.0), Ev::kSpotNotice, e.node, 0, node.epoch});
        }
        Schedule();
        break;
      }
      case Ev::kSchedule:
        Schedule();
        break;
      case Ev::kLaunched:
        if (running_ && e.generation == generation_) {
          training_ = true;
          step_started_ = now_;
          Push({now_ + s_.step_s, Ev::kStepEnd, -1, generation_});
        }
        break;
      case Ev::kStepEnd:
        if (running_ && e.generation == generation_) StepEnd();
        break;
    }
  }

  // A node goes away (failure, or a spot reclaim with its notice). Node events of a node
  // that is already down are dropped: its next failure is drawn when it comes back.
  void NodeDown(int n, bool notice) {
    Node& node = nodes_[n];
    if (!node.up) return;
    node.up = false;
    node.filler = false;  // Its filler job is requeued (fillers are not measured).
    if (node.main && running_) {
      if (notice) {
        ++reclaims_;
        Preempted();
      } else {
        ++failures_;
        BudgetCount b = CountFailure(rec_, /*infra=*/true, Ms(now_));
        observed_failures_ += 1;
        EndAttempt(v1::ATTEMPT_OUTCOME_LOST);
        if (b.exhausted) rec_failed_ = true;
      }
    }
    node.main = false;
    Push({now_, Ev::kSchedule});
  }

  // SIGTERM with kNoticeS of grace: a step that ends within the notice is finished and
  // snapshotted; its save (or the one in flight) commits if it completes within the notice.
  void Preempted() {
    const double deadline = now_ + kNoticeS;
    if (training_) {
      const double step_end = step_started_ + s_.step_s;
      if (step_end <= deadline) {
        FlushCommits(step_end);
        ++step_;
        GoodputStep(g_, steps_, step_, s_.step_s, Ms(step_end));
        const double done = SaveCommitTime(step_end);
        if (done <= deadline) Commit(step_, done, BlockedFor(step_end));
      }
      // The save in flight completes within the notice or is lost with the attempt.
      FlushCommits(deadline);
    }
    EndAttempt(v1::ATTEMPT_OUTCOME_PREEMPTED, deadline);
  }

  double BlockedFor(double at) const {
    const double wait = std::max(0.0, write_busy_until_ - at);  // The previous async write.
    return sc_.async ? wait + s_.snapshot_bytes / (o_.d2h_gbps * 1e9)
                     : s_.ckpt_bytes / (o_.storage_gbps * 1e9);
  }
  double SaveCommitTime(double at) const {
    const double blocked = BlockedFor(at);
    return sc_.async ? at + blocked + s_.ckpt_bytes / (o_.storage_gbps * 1e9) : at + blocked;
  }

  void Commit(int64_t step, double at, double blocked) {
    GoodputCommit(g_, steps_, step, blocked, Ms(at));
    rec_.last_checkpoint = CheckpointRecord{};
    rec_.last_checkpoint->step = step;
    rec_.last_checkpoint->committed_ms = Ms(at);
    committed_step_ = step;
    ++checkpoints_;
  }

  bool CheckpointDue() {
    const double since = now_ - last_ckpt_t_;
    switch (sc_.policy) {
      case Policy::kEvery20Steps:
        return step_ - last_ckpt_step_ >= 20;
      case Policy::kEveryHour:
        return since >= 3600;
      case Policy::kAuto: {
        IntervalInputs in;
        in.auto_interval = true;
        in.group_gpus = o_.job_gpus;
        if (measured_cost_ >= 0) in.cost_seconds = measured_cost_;
        in.observed_gpu_seconds = observed_gpu_s_;
        in.observed_failures = observed_failures_;
        const IntervalChoice c = ChooseCheckpointInterval(in);
        if (c.every_steps > 0) return step_ - last_ckpt_step_ >= c.every_steps;
        return since + 0.5 * s_.step_s >= c.every_seconds;  // The step end nearest to it.
      }
    }
    return false;
  }

  void StepEnd() {
    FlushCommits(now_);
    ++step_;
    observed_gpu_s_ += s_.step_s * o_.job_gpus;
    GoodputStep(g_, steps_, step_, s_.step_s, Ms(now_));
    double next_start = now_;
    if (CheckpointDue()) {
      const double blocked = BlockedFor(now_);
      const double commit_at = SaveCommitTime(now_);
      interval_sum_ += now_ - last_ckpt_t_;
      blocked_total_ += blocked;
      measured_cost_ = blocked;
      last_ckpt_t_ = now_;
      last_ckpt_step_ = step_;
      if (sc_.async) {
        write_busy_until_ = commit_at;
        // The commit is accounted when it lands; a failure before that loses it.
        pending_commits_.push_back({step_, commit_at, blocked});
      } else {
        Commit(step_, commit_at, blocked);
      }
      next_start = now_ + blocked;
    }
    FlushCommits(next_start);
    step_started_ = next_start;
    Push({next_start + s_.step_s, Ev::kStepEnd, -1, generation_});
  }

  struct Pending {
    int64_t step;
    double at;
    double blocked;
  };
  // Async commits that landed by `t`.
  void FlushCommits(double t) {
    while (!pending_commits_.empty() && pending_commits_.front().at <= t) {
      const Pending p = pending_commits_.front();
      pending_commits_.erase(pending_commits_.begin());
      Commit(p.step, p.at, p.blocked);
    }
  }

  // The attempt ends at `end` (>= now; a preempted one holds its GPUs through the notice and
  // is not relaunched before then).
  void EndAttempt(v1::AttemptOutcome outcome, double end = -1) {
    if (end < now_) end = now_;
    FlushCommits(end);
    pending_commits_.clear();  // Writes that had not landed are lost with the attempt.
    write_busy_until_ = 0;
    main_not_before_ = end;
    GoodputEnd(g_, outcome, Ms(end));
    running_ = false;
    training_ = false;
    for (Node& n : nodes_) n.main = false;
    step_ = committed_step_;  // The next attempt resumes from the last committed checkpoint.
    last_ckpt_step_ = step_;
  }

  // One scheduling pass through PlanQueue: the measured job (priority 10, not preemptible) and
  // the fillers (priority 0, preemptible, one per free node).
  void Schedule() {
    std::vector<IdleWorker> idle, live;
    std::vector<RunningJob> running;
    for (int n = 0; n < o_.nodes; ++n) {
      if (!nodes_[n].up) continue;
      for (int s = 0; s < kGpusPerNode; ++s) {
        IdleWorker w{absl::StrCat("n", n), absl::StrCat("rack", n / 32), s};
        live.push_back(w);
        if (!nodes_[n].main && !nodes_[n].filler) idle.push_back(w);
      }
      if (nodes_[n].filler) {
        RunningJob r;
        r.id = absl::StrCat("filler-", n);
        r.priority = 0;
        r.number = 1000 + n;
        r.preemptible = true;
        for (int s = 0; s < kGpusPerNode; ++s) {
          r.workers.push_back({absl::StrCat("n", n), absl::StrCat("rack", n / 32), s});
        }
        running.push_back(std::move(r));
      }
    }
    std::vector<QueuedJob> queue;
    if (!running_ && now_ < main_not_before_) {
      Push({main_not_before_, Ev::kSchedule});
    } else if (!running_) {
      QueuedJob q;
      q.id = "main";
      q.priority = 10;
      q.number = 1;
      q.gang.sp = s_.sp;
      q.gang.dp = o_.job_gpus / s_.sp;
      queue.push_back(q);
    }
    // One queued filler per node that could take one (they backfill whatever is left).
    for (int n = 0; n < o_.nodes; ++n) {
      if (!nodes_[n].up || nodes_[n].main || nodes_[n].filler) continue;
      QueuedJob f;
      f.id = absl::StrCat("filler-q", n);
      f.priority = 0;
      f.number = 2000 + n;
      f.gang.sp = kGpusPerNode;
      queue.push_back(f);
    }
    std::vector<QueueDecision> ds = PlanQueue(queue, idle, live, nullptr, {}, running);
    bool preempted = false;
    for (const QueueDecision& d : ds) {
      if (d.kind == QueueDecision::Kind::kPreempt) {
        for (const Victim& v : d.victims) {
          nodes_[std::atoi(v.job_id.c_str() + 7)].filler = false;  // "filler-<n>"
          preempted = true;
        }
      } else if (d.kind == QueueDecision::Kind::kLaunch) {
        std::vector<int> held;
        for (const std::string& w : d.worker_ids) held.push_back(std::atoi(w.c_str() + 1));
        if (d.job_id == "main") {
          for (int n : held) nodes_[n].main = true;
          Launch();
        } else {
          for (int n : held) nodes_[n].filler = true;
        }
      }
    }
    // Victims' nodes free once their ranks checkpoint and exit (within their notice).
    if (preempted) Push({now_ + kNoticeS, Ev::kSchedule});
  }

  void Launch() {
    ++generation_;
    running_ = true;
    training_ = false;
    steps_.clear();
    GoodputDelta d = GoodputStart(g_, steps_, generation_, o_.job_gpus, Ms(now_));
    (void)d;
    const double resume_read = committed_step_ > 0 ? s_.ckpt_bytes / (o_.storage_gbps * 1e9) : 0;
    last_ckpt_t_ = now_;
    Push({now_ + o_.restart_s + resume_read, Ev::kLaunched, -1, generation_});
  }

  const Options& o_;
  const Sizes& s_;
  const Scenario sc_;
  std::mt19937_64 rng_;
  std::vector<Node> nodes_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  double now_ = 0;

  JobRecord rec_;
  bool rec_failed_ = false;
  GoodputRecord g_;
  GoodputSteps steps_;
  int64_t generation_ = 0;
  bool running_ = false, training_ = false;
  double step_started_ = 0;
  int64_t step_ = 0, committed_step_ = 0, last_ckpt_step_ = 0;
  double last_ckpt_t_ = 0;
  double write_busy_until_ = 0;
  double main_not_before_ = 0;
  std::vector<Pending> pending_commits_;
  double measured_cost_ = -1;
  double observed_gpu_s_ = 0;
  int64_t observed_failures_ = 0;
  int failures_ = 0, reclaims_ = 0, checkpoints_ = 0;
  double interval_sum_ = 0, blocked_total_ = 0;
};

bool ParseFlags(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    bool ok = true;
    if (k == "--nodes")
      ok = absl::SimpleAtoi(v, &o->nodes);
    else if (k == "--job-gpus")
      ok = absl::SimpleAtoi(v, &o->job_gpus);
    else if (k == "--days")
      ok = absl::SimpleAtod(v, &o->days);
    else if (k == "--seeds")
      ok = absl::SimpleAtoi(v, &o->seeds);
    else if (k == "--mfu")
      ok = absl::SimpleAtod(v, &o->mfu);
    else if (k == "--storage-gbps")
      ok = absl::SimpleAtod(v, &o->storage_gbps);
    else if (k == "--d2h-gbps")
      ok = absl::SimpleAtod(v, &o->d2h_gbps);
    else if (k == "--restart-s")
      ok = absl::SimpleAtod(v, &o->restart_s);
    else if (k == "--repair-h")
      ok = absl::SimpleAtod(v, &o->repair_h);
    else if (k == "--spot-per-node-day")
      ok = absl::SimpleAtod(v, &o->spot_per_node_day);
    else if (k == "--spot-return-h")
      ok = absl::SimpleAtod(v, &o->spot_return_h);
    else if (k == "--spec")
      o->spec = v;
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "goodput_sim: bad flag %s %s\n", k.c_str(), v);
      return false;
    }
  }
  if (o->nodes < 1 || o->nodes > 4096 || o->job_gpus < 8 || o->job_gpus % 8 != 0 ||
      o->job_gpus > o->nodes * kGpusPerNode || !(o->days > 0) || o->seeds < 1 ||
      !(o->mfu > 0 && o->mfu <= 1) || !(o->storage_gbps > 0) || !(o->d2h_gbps > 0)) {
    std::fprintf(stderr,
                 "goodput_sim: need 1 <= nodes <= 4096, 8 <= job-gpus <= nodes*8 (a multiple of "
                 "8), days > 0, seeds >= 1, 0 < mfu <= 1, bandwidths > 0\n");
    return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseFlags(argc, argv, &o)) return 2;
  absl::StatusOr<spec::JobSpec> job = spec::LoadJobSpecFile(o.spec);
  if (!job.ok()) {
    std::fprintf(stderr, "goodput_sim: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  const size_t last = job->stages.size() - 1;
  Sizes s;
  s.sp = job->StageSp(last);
  const int64_t seq = job->stages[last].seq_len;
  const int64_t dp = o.job_gpus / s.sp;
  const double flops = spec::ModelFlopsPerToken(job->model, seq) * seq * dp;
  s.step_s = flops / (o.job_gpus * kH100Bf16Peak * o.mfu);
  const spec::ParameterCounts params = spec::CountParameters(job->model);
  s.ckpt_bytes = spec::CheckpointStateBytes(params, job->model.dtype);
  s.snapshot_bytes =
      spec::SnapshotBytesPerRank(params, job->model.dtype, o.job_gpus, job->parallelism.zero_stage);

  std::printf("goodput_sim: %s, stage %lld tokens on %d GPUs (sp %lld x dp %lld) of %d nodes x 8\n",
              o.spec.c_str(), static_cast<long long>(seq), o.job_gpus, static_cast<long long>(s.sp),
              static_cast<long long>(dp), o.nodes);
  std::printf(
      "  step %.0f s at MFU %.2f; checkpoint %.1f GB (%.0f MB per rank); sync save %.1f s "
      "at %.0f GB/s; async host copy %.3f s at %.0f GB/s per rank; restart %.0f s + "
      "read-back\n",
      s.step_s, o.mfu, s.ckpt_bytes / 1e9, s.snapshot_bytes / 1e6,
      s.ckpt_bytes / (o.storage_gbps * 1e9), o.storage_gbps, s.snapshot_bytes / (o.d2h_gbps * 1e9),
      o.d2h_gbps, o.restart_s);
  std::printf(
      "  failures: Llama 3 rate (job MTBF %.1f h at this size) and 10x; spot reclaims "
      "%.3f per node-day, 30 s notice; repair %.1f h; %.0f days x %d seeds\n\n",
      kLlama3GpuMtbfSeconds / o.job_gpus / 3600, o.spot_per_node_day, o.repair_h, o.days, o.seeds);
  std::printf(
      "| failures | interval | save | ETTR | goodput | mean interval | blocked/ckpt | "
      "failures | reclaims |\n|---|---|---|---|---|---|---|---|---|\n");
  for (double scale : {1.0, 10.0}) {
    for (Policy p : {Policy::kEvery20Steps, Policy::kEveryHour, Policy::kAuto}) {
      for (bool async : {false, true}) {
        Result sum;
        int exhausted = 0;
        for (int seed = 0; seed < o.seeds; ++seed) {
          Sim sim(o, s, Scenario{p, async, scale}, 0x5eed + seed);
          Result r = sim.Run();
          sum.ettr += r.ettr;
          sum.goodput += r.goodput;
          sum.mean_interval_s += r.mean_interval_s;
          sum.blocked_s += r.checkpoints > 0 ? r.blocked_s / r.checkpoints : 0;
          sum.failures += r.failures;
          sum.reclaims += r.reclaims;
          exhausted += r.budget_exhausted;
        }
        const double n = o.seeds;
        std::printf(
            "| %s | %s | %s | %.1f %% | %.1f %% | %.0f s | %.2f s | %.1f | %.1f |%s\n",
            scale == 1 ? "Llama 3" : "10x Llama 3", PolicyName(p), async ? "async" : "sync",
            100 * sum.ettr / n, 100 * sum.goodput / n, sum.mean_interval_s / n, sum.blocked_s / n,
            sum.failures / n, sum.reclaims / n,
            exhausted ? absl::StrCat(" budget exhausted in ", exhausted, " runs").c_str() : "");
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace ulysses::coordinator

int main(int argc, char** argv) { return ulysses::coordinator::Main(argc, argv); }
