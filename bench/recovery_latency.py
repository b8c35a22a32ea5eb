#!/usr/bin/python3
"""Control-plane latencies for the tiny job, measured on real processes over loopback.

Starts ulysses-coordinator and W CPU ulysses-workers, submits configs/jobs/tiny-demo.yaml with
its first stage on an SP group of 2, and measures from the outside (polling
`ulyssesctl get job ID -o json` every POLL seconds, so figures carry +-POLL resolution):

  submit -> RUNNING        the gang is placed and every rank reported started
  submit -> first step     the first optimizer step is reported
  kill -9 -> RECOVERING    a worker of the running group is SIGKILLed; the coordinator notices
                           (bounded by its heartbeat timeout)
  kill -9 -> RUNNING       a new generation has every rank started: what the coordinator's
                           ulysses_recovery_duration_seconds measures (from RECOVERING), before
                           rendezvous, the checkpoint load and the first step
  kill -9 -> resumed       the new generation reports its first step (the one after the last
                           checkpoint: resumed_first_step = checkpoint_step_at_kill + 1 unless a
                           checkpoint committed between reading it and the kill)

Usage: /usr/bin/python3 bench/recovery_latency.py [--bin build/bin] [--workers 4]
       [--heartbeat-timeout-s 10] [--poll 0.1]
Prints one JSON line with the figures. Everything it starts is stopped on exit.
"""
import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback import ROOT, LoopbackCluster  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--heartbeat-timeout-s", type=float, default=10.0)
    ap.add_argument("--poll", type=float, default=0.1)
    a = ap.parse_args()

    with LoopbackCluster(a.bin, a.workers, a.heartbeat_timeout_s, a.poll,
                         "ulysses-recovery-") as c:
        t_submit = time.monotonic()
        job_id = c.submit(os.path.join(ROOT, "configs/jobs/tiny-demo.yaml"), {
            "spec.stages[0].sp_degree": 2, "spec.stages[0].steps": 40,
            "spec.checkpoint.every_steps": 2, "spec.data.synthetic.validation_sequences": 2,
            "spec.stages[1].steps": 1, "spec.stages[2].steps": 1})
        get = lambda: c.get(job_id)

        c.wait_for(lambda: get().get("state") == "RUNNING", 120, "RUNNING")
        t_running = time.monotonic()
        c.wait_for(lambda: get().get("step", 0) >= 1, 120, "first step")
        t_first_step = time.monotonic()
        # Let a checkpoint commit, then kill one rank's worker.
        job = c.wait_for(lambda: (lambda j: j if (j.get("last_checkpoint") or {}).get("step", 0)
                                  >= 2 else None)(get()), 180, "first checkpoint")
        ckpt_step = job["last_checkpoint"]["step"]
        gen = job["generation"]
        victim = describe_workers(c, job_id)[-1]
        t_kill = time.monotonic()
        c.workers[victim].send_signal(signal.SIGKILL)
        c.wait_for(lambda: get().get("state") in ("RECOVERING", "SCHEDULING")
                   or get().get("generation", gen) > gen, 60, "RECOVERING")
        t_detected = time.monotonic()
        c.wait_for(lambda: (lambda j: j.get("generation", 0) > gen and j.get("state") == "RUNNING")
                   (get()), 180, "RUNNING again")
        t_running_again = time.monotonic()
        # The job's step never goes backwards, so it cannot tell the new generation's first
        # step: read it from the event history (the first progress after the new attempt).
        def resumed_step():
            new_attempt = False
            for e in c.describe(job_id).get("events", []):
                if e.get("type") == "attempt_started" and e["attempt"]["generation"] > gen:
                    new_attempt = True
                elif new_attempt and e.get("type") == "progress":
                    return e["step"]
            return None
        first_step = c.wait_for(resumed_step, 180, "resumed")
        t_resumed = time.monotonic()
        restarts = get().get("restarts")
        # After the kill only W-1 workers remain: the job's last stage (4 ranks) would wait for a
        # replacement, so the measurement ends here and the job is cancelled.
        c.ctl("cancel", job_id)
        print(json.dumps({
            "workers": a.workers, "heartbeat_timeout_s": a.heartbeat_timeout_s, "poll_s": a.poll,
            "submit_to_running_s": round(t_running - t_submit, 2),
            "submit_to_first_step_s": round(t_first_step - t_submit, 2),
            "kill_to_detected_s": round(t_detected - t_kill, 2),
            "kill_to_running_again_s": round(t_running_again - t_kill, 2),
            "kill_to_resumed_step_s": round(t_resumed - t_kill, 2),
            "checkpoint_step_at_kill": ckpt_step, "resumed_first_step": first_step,
            "restarts": restarts}))


def describe_workers(c, job_id):
    """Worker names of the current attempt, rank order."""
    ids = c.describe(job_id)["attempts"][-1]["worker_ids"]
    return [w[2:] if w.startswith("w-") else w for w in ids]


if __name__ == "__main__":
    main()
