// schedule_pass: the coordinator's scheduling pass at cluster scale (issue 30), in process.
//
// Drives the real JobMachine::Schedule (the pass the ticker runs every 100 ms and
// SubmitJob, OpenSession and freeing heartbeats run inline) over a State as the
// coordinator holds it: --workers nodes with --capacity slots each (25,000 x 8 = a
// 200,000-GPU cluster), filled by running one-node jobs, and --queued more jobs waiting.
// No gRPC and no store: what is timed is the pass itself under the coordinator's mutex.
//
//   build/bin/schedule_pass --workers 25000 --capacity 8 --queued 10000 --passes 50
//
// Four timings, each p50 / p99 / max over --passes passes:
//   idle    the cluster empty but for the jobs these passes launched, one new job of
//           --idle-sp ranks queued before each pass (SubmitJob's pass on a quiet cluster:
//           coordinator_load's case, where every pass sees every free slot);
//   steady  the cluster full, nothing changed since the last pass (the ticker's pass);
//   churn   one running job ended before each pass (its node freed): the pass launches
//           the head of the queue onto it;
//   submit  one new job queued before each pass (SubmitJob's pass).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/contract/cli11.h"
#include "common/logging.h"
#include "coordinator/config.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/job_machine.h"
#include "coordinator/runtime.h"

namespace {

using namespace ulysses::coordinator;  // NOLINT: a bench main.
namespace v1 = ulysses::v1;
using Clock = std::chrono::steady_clock;

class NullSink : public WorkerSink {
 public:
  void Send(const v1::CoordinatorMessage&) override {}
  void Close(const absl::Status&) override {}
};

std::string JobYaml(int64_t n, int sp) {
  return absl::StrCat(
      "apiVersion: ulysses/v1\nkind: TrainJob\nmetadata:\n  name: sched-", n,
      "\nspec:\n  model: {preset: tiny}\n  data:\n    synthetic: {generator: random}\n"
      "  stages:\n    - {seq_len: 256, steps: 10, sp_degree: ",
      sp, "}\n");
}

class Cluster {
 public:
  Cluster(int capacity, int per_label)
      : capacity_(capacity),
        per_label_(per_label),
        metrics_(CoordinatorMetrics::Register(nullptr, [](CountsPart) { return StateCounts(); })),
        machine_(config_, *metrics_, state_) {}

  void AddWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      auto w = std::make_unique<WorkerRt>();
      w->rec.id = absl::StrCat("w-", 100000 + i);
      w->rec.name = absl::StrCat("node-", i);
      w->rec.host = absl::StrCat("10.", i / 65536, ".", (i / 256) % 256, ".", i % 256);
      w->rec.capacity = capacity_;
      if (per_label_ > 0) w->rec.node_label = absl::StrCat("rack-", i / per_label_);
      for (int s = 0; s < capacity_; ++s) w->rec.devices.push_back(absl::StrCat("cuda:", s));
      w->rec.device = w->rec.devices[0];
      w->state = v1::WORKER_STATE_IDLE;
      w->sink = &sink_;
      w->session = state_.next_session_id++;
      state_.workers[w->rec.id] = std::move(w);
    }
  }

  // A job of one stage with `sp` ranks (default: a node's capacity), queued (PENDING).
  JobRt* Queue(int sp = 0) {
    if (sp == 0) sp = capacity_;
    auto j = std::make_unique<JobRt>();
    const int64_t n = state_.next_job_number++;
    j->rec.id = absl::StrCat("job-", 1000000 + n);
    j->rec.name = absl::StrCat("sched-", n);
    j->rec.number = n;
    j->rec.state = v1::JOB_STATE_PENDING;
    j->rec.max_failures = 3;
    j->rec.checkpoint_dir = absl::StrCat("/ckpt/", j->rec.id);
    j->rec.out_dir = absl::StrCat("/out/", j->rec.id);
    j->rec.tenant = "default";
    StageRecord s;
    s.sp = sp;
    s.seq_len = 256;
    s.steps = 10;
    j->rec.stages = {s};
    j->rec.spec_yaml = JobYaml(n, sp);
    JobRt* out = j.get();
    state_.jobs[out->rec.id] = std::move(j);
    queued_.push_back(out);
    return out;
  }

  // Its ranks all started: RUNNING, as after the workers' started reports.
  void MarkRunning(JobRt& job) {
    job.rec.state = v1::JOB_STATE_RUNNING;
    const AttemptRecord* a = job.rec.current_attempt();
    for (size_t r = 0; a != nullptr && r < a->worker_ids.size(); ++r) {
      job.started_ranks.insert(static_cast<int>(r));
    }
  }

  // The job finished: its attempt ended and its workers' slots are free again.
  void Finish(JobRt& job) {
    AttemptRecord& a = job.rec.attempts.back();
    a.outcome = v1::ATTEMPT_OUTCOME_SUCCEEDED;
    a.ended_ms = NowMs();
    for (size_t r = 0; r < a.worker_ids.size(); ++r) {
      WorkerRt& w = *state_.workers[a.worker_ids[r]];
      w.slots.erase(a.slots[r]);
      if (w.slots.empty()) w.state = v1::WORKER_STATE_IDLE;
    }
    job.rec.state = v1::JOB_STATE_SUCCEEDED;
  }

  // One pass; returns its seconds and the number of jobs it launched.
  double Pass(int* launched) {
    Txn txn;
    const auto t0 = Clock::now();
    machine_.Schedule(txn);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    *launched = 0;
    for (const auto& [w, m] : txn.outbound) *launched += m.has_assignment() ? 1 : 0;
    for (JobRt* j : txn.jobs) {
      if (j->rec.state == v1::JOB_STATE_SCHEDULING) MarkRunning(*j);
    }
    return s;
  }

  std::vector<JobRt*> Running() {
    std::vector<JobRt*> out;
    for (auto& [id, j] : state_.jobs) {
      if (j->rec.state == v1::JOB_STATE_RUNNING) out.push_back(j.get());
    }
    return out;
  }
  size_t QueuedCount() {
    size_t n = 0;
    for (auto& [id, j] : state_.jobs) n += IsQueued(j->rec.state) ? 1 : 0;
    return n;
  }

 private:
  const int capacity_;
  const int per_label_;
  CoordinatorConfig config_;
  State state_;
  NullSink sink_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  JobMachine machine_;
  std::vector<JobRt*> queued_;
};

std::string Summary(const char* name, std::vector<double> s) {
  std::sort(s.begin(), s.end());
  auto pct = [&](double p) {
    return s[std::min(s.size() - 1, static_cast<size_t>(p * static_cast<double>(s.size())))];
  };
  char buf[200];
  snprintf(buf, sizeof(buf), "%-8s n=%-4zu p50=%8.2f ms  p99=%8.2f ms  max=%8.2f ms", name,
           s.size(), pct(0.5) * 1e3, pct(0.99) * 1e3, s.back() * 1e3);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The coordinator's scheduling pass at cluster scale, in process"};
  int workers = 25000;
  int capacity = 8;
  int queued = 10000;
  int passes = 50;
  int per_label = 0;
  int idle_sp = 2;
  app.add_option("--workers", workers, "Nodes (worker agents)")->check(CLI::Range(1, 1000000));
  app.add_option("--capacity", capacity, "Slots (GPUs) per node")->check(CLI::Range(1, 64));
  app.add_option("--queued", queued, "Jobs waiting behind the full cluster")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--passes", passes, "Timed passes per scenario")->check(CLI::Range(1, 100000));
  app.add_option("--per-label", per_label,
                 "Nodes per node label (rack-0, rack-1, ...; 0 = no labels)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--idle-sp", idle_sp, "Ranks of each job the idle scenario submits")
      ->check(CLI::Range(1, 64));
  if (std::optional<int> exit_code = ulysses::contract::ParseCommandLine(app, argc, argv)) {
    return *exit_code;
  }

  ulysses::SetLogLevel(ulysses::LogLevel::kWarning);  // Not a line per launched job.
  Cluster c(capacity, per_label);
  c.AddWorkers(workers);
  int launched = 0;
  // An empty cluster, one small job submitted before each pass; the jobs stay running and
  // end before the fill.
  std::vector<double> idle;
  int idle_launched = 0;
  for (int i = 0; i < passes; ++i) {
    c.Queue(idle_sp);
    idle.push_back(c.Pass(&launched));
    idle_launched += launched;
  }
  for (JobRt* j : c.Running()) c.Finish(*j);
  // Fill the cluster: one one-node job per node, placed by the pass itself.
  const auto fill0 = Clock::now();
  for (int i = 0; i < workers; ++i) c.Queue();
  const double fill_pass = c.Pass(&launched);
  printf(
      "schedule_pass: %d nodes x %d slots = %d slots; fill pass launched %d ranks of %d jobs "
      "in %.1f ms (setup %.1f s)\n",
      workers, capacity, workers * capacity, launched, workers, fill_pass * 1e3,
      std::chrono::duration<double>(Clock::now() - fill0).count());
  for (int i = 0; i < queued; ++i) c.Queue();
  // The first pass after queueing writes every waiting job's reason once.
  const double first = c.Pass(&launched);
  printf("%zu jobs queued, %zu running; first pass (writes each waiting job's reason) %.1f ms\n",
         c.QueuedCount(), c.Running().size(), first * 1e3);

  std::vector<double> steady, churn, submit;
  for (int i = 0; i < passes; ++i) steady.push_back(c.Pass(&launched));
  int churn_launched = 0;
  std::vector<JobRt*> running = c.Running();
  for (int i = 0; i < passes && i < static_cast<int>(running.size()); ++i) {
    c.Finish(*running[i]);
    churn.push_back(c.Pass(&launched));
    churn_launched += launched;
  }
  for (int i = 0; i < passes; ++i) {
    c.Queue();
    submit.push_back(c.Pass(&launched));
  }
  printf("%s   (%d ranks launched)\n", Summary("idle", idle).c_str(), idle_launched);
  printf("%s\n", Summary("steady", steady).c_str());
  printf("%s   (%d ranks launched onto freed nodes)\n", Summary("churn", churn).c_str(),
         churn_launched);
  printf("%s\n", Summary("submit", submit).c_str());
  printf("at the end: %zu queued, %zu running\n", c.QueuedCount(), c.Running().size());
  // A pass that placed nothing while nodes were freed would be a broken scheduler, not a
  // fast one.
  if (idle_launched != passes * idle_sp) {
    fprintf(stderr, "idle passes launched %d ranks, expected %d\n", idle_launched,
            passes * idle_sp);
    return 1;
  }
  if (churn_launched != static_cast<int>(churn.size()) * capacity) {
    fprintf(stderr, "churn passes launched %d ranks, expected %zu\n", churn_launched,
            churn.size() * capacity);
    return 1;
  }
  return 0;
}
