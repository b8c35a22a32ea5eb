// The ulysses-worker daemon: one agent per GPU (or CPU rank).
//
// The agent registers with the coordinator, holds one Session stream (heartbeats,
// progress, logs, checkpoint and exit reports up; assignments, aborts, acks and stop
// down) and runs each Assignment as a child `ulysses-train rank` process
// (ChildSupervisor), so a crashing step never takes the agent with it.
//
// Failure behaviour:
// - A broken session (coordinator restart, transient error) never touches the child:
//   the agent re-registers with backoff, reports what it runs (job, generation, rank)
//   and keeps or kills the child as the coordinator answers. Reports that need an
//   ack (checkpoint committed, attempt exited) are resent on the next session.
// - Abort: SIGTERM to the child, SIGKILL after the abort's grace. An Abort with `preempt`
//   (priority preemption) stops it as a preemption instead: the rank checkpoints, exits 75
//   and the exit is reported as preempted; the agent keeps taking work.
// - Metrics (--metrics-listen): the rank's per-step figures from every rank's step events,
//   labelled {job_id, stage, rank}, removed when the attempt ends (worker_metrics.h).
// - RequestShutdown() (SIGTERM of the agent, or Stop from the coordinator): SIGTERM
//   to the child, up to grace_period for it to checkpoint and exit 75, SIGKILL after;
//   the exit is reported as a preemption, then Run() returns.
//
// Thread-safety: Run() is called once; RequestShutdown() from any thread.
#ifndef ULYSSES_WORKER_AGENT_WORKER_AGENT_H_
#define ULYSSES_WORKER_AGENT_WORKER_AGENT_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/agent/worker_config.h"

namespace ulysses::agent {

class WorkerAgent {
 public:
  explicit WorkerAgent(WorkerConfig config);
  ~WorkerAgent();
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

  // Runs until shutdown completes. Returns OK after a clean drain.
  absl::Status Run();

  // Starts the graceful shutdown (preempts the child). Thread-safe, idempotent.
  void RequestShutdown();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ulysses::agent

#endif  // ULYSSES_WORKER_AGENT_WORKER_AGENT_H_
