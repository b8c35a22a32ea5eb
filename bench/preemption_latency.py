#!/usr/bin/python3
"""Priority preemption latency, measured on real processes over loopback.

Starts ulysses-coordinator and W CPU ulysses-workers, submits a low-priority job whose group
takes every worker (the tiny preset at 1024 tokens on an SP group of W, a checkpoint every
--every steps), waits until it has trained --warm steps, then submits a job of priority 10 that
needs the same W workers, and measures from the outside (polling `ulyssesctl get job ID -o json`
every POLL seconds, so figures carry +-POLL resolution):

  submit -> victim checkpointing   the coordinator chose the low job and asked its ranks to
                                   checkpoint now (Abort{preempt})
  submit -> victim preempted       its ranks committed the checkpoint and exited 75
  submit -> high running           the high job's gang is placed and every rank started
  submit -> high first step        the high job reports its first optimizer step: what the
                                   person who submitted the urgent job waits for

and the victim's cost: the step it had reached, the step of the checkpoint it resumes from
(a preemption checkpoint loses nothing: they are equal) and the GPU-seconds lost that the
coordinator recorded (ulysses_preemption_lost_gpu_seconds_total{reason="priority"}).
--repeats N runs N rounds (a fresh cluster each) and prints each and the medians.

Usage: /usr/bin/python3 bench/preemption_latency.py [--bin build/bin] [--workers 2]
       [--every 100] [--warm 3] [--repeats 3] [--poll 0.05]
Prints one JSON line per round and one with the medians. Everything it starts is stopped.
"""
import argparse
import json
import os
import re
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback import ROOT, LoopbackCluster, read  # noqa: E402

SPEC = os.path.join(ROOT, "configs/jobs/tiny-demo.yaml")


def one_round(a):
    with LoopbackCluster(a.bin, a.workers, 10.0, a.poll, "ulysses-preempt-") as c:
        base = {"spec.stages[0].seq_len": 1024, "spec.stages[0].sp_degree": a.workers,
                "spec.checkpoint.every_steps": a.every,
                "spec.data.synthetic.validation_sequences": 2,
                "spec.stages[1].steps": 1, "spec.stages[2].steps": 1,
                "spec.stages[1].sp_degree": a.workers, "spec.stages[2].sp_degree": a.workers}
        low = c.submit(SPEC, dict(base, **{"spec.stages[0].steps": 400}))
        c.wait_for(lambda: c.get(low).get("step", 0) >= a.warm, 300, "low job warm")
        t0 = time.monotonic()
        high = c.submit(SPEC, dict(base, **{"spec.stages[0].steps": 2,
                                            "spec.scheduling.priority": 10}))
        marks = {}
        while "high_first_step" not in marks:
            if time.monotonic() - t0 > 300:
                sys.exit("timed out waiting for the high job's first step")
            lj, hj = c.get(low), c.get(high)
            now = time.monotonic() - t0
            if lj.get("state") == "CHECKPOINTING":
                marks.setdefault("victim_checkpointing", now)
                marks.setdefault("victim_step_at_preemption", lj.get("step", 0))
            if lj.get("state") == "PREEMPTED":
                marks.setdefault("victim_checkpointing", now)
                marks.setdefault("victim_preempted", now)
            if hj.get("state") == "RUNNING":
                marks.setdefault("high_running", now)
            if hj.get("step", 0) >= 1:
                marks.setdefault("high_running", now)
                marks["high_first_step"] = now
            time.sleep(a.poll)
        victim = c.get(low)
        lost = None  # null in the output when the coordinator's metrics cannot be read.
        port = re.search(r"listening .*metrics=(\d+)", read(os.path.join(c.tmp, "coordinator.log")))
        if port:
            text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port.group(1),
                                          timeout=10).read().decode()
            m = re.search(r'^ulysses_preemption_lost_gpu_seconds_total\{reason="priority"\} (\S+)',
                          text, re.M)
            lost = float(m.group(1)) if m else None
        return {
            "workers": a.workers, "checkpoint_every": a.every, "poll_s": a.poll,
            "submit_to_victim_checkpointing_s": round(marks["victim_checkpointing"], 3),
            "submit_to_victim_preempted_s": round(marks.get("victim_preempted", float("nan")), 3),
            "submit_to_high_running_s": round(marks["high_running"], 3),
            "submit_to_high_first_step_s": round(marks["high_first_step"], 3),
            "victim_step_at_preemption": marks.get("victim_step_at_preemption"),
            "victim_resumes_from_step": (victim.get("last_checkpoint") or {}).get("step"),
            "victim_preemptions": victim.get("preemptions"),
            "lost_gpu_seconds": lost,
        }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every", type=int, default=100,
                    help="the low job's checkpoint interval in steps (default: none before the "
                         "preemption, so its preemption checkpoint is the one that saves work)")
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--poll", type=float, default=0.05)
    a = ap.parse_args()
    rounds = []
    for _ in range(a.repeats):
        rounds.append(one_round(a))
        print(json.dumps(rounds[-1]), flush=True)
    keys = [k for k in rounds[0] if k.endswith("_s") and k != "poll_s"]
    print(json.dumps({"median": {k: round(statistics.median(r[k] for r in rounds), 3)
                                 for k in keys}, "repeats": a.repeats}))


if __name__ == "__main__":
    main()
