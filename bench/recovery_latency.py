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
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--heartbeat-timeout-s", type=float, default=10.0)
    ap.add_argument("--poll", type=float, default=0.1)
    a = ap.parse_args()

    # A SIGTERM (e.g. from `timeout`) still runs the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="ulysses-recovery-")
    procs = []

    def start(args, log):
        p = subprocess.Popen(args, stdout=open(os.path.join(tmp, log), "w"),
                             stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        coord_log = os.path.join(tmp, "coordinator.log")
        start([os.path.join(a.bin, "ulysses-coordinator"), "--listen", "127.0.0.1:0",
               "--state-dir", os.path.join(tmp, "state"), "--metrics-listen", "127.0.0.1:0",
               "--heartbeat-timeout-s", str(a.heartbeat_timeout_s)], "coordinator.log")
        port = wait_for(lambda: re.search(r"listening grpc=(\d+)", read(coord_log)), 30,
                        "coordinator start").group(1)
        env = dict(os.environ, ULYSSES_COORDINATOR="127.0.0.1:" + port)
        # The admin token a coordinator without a token file creates: ulyssesctl and the
        # workers send it (docs/OPERATIONS.md).
        token_file = os.path.join(tmp, "state", "admin.token")
        auth = []
        if os.path.exists(token_file):
            env["ULYSSES_TOKEN"] = read(token_file).strip()
            auth = ["--token-file", token_file]
        os.environ.update(env)
        workers = {}
        for i in range(a.workers):
            name = "bench-w%d" % i
            workers[name] = start(
                [os.path.join(a.bin, "ulysses-worker"), "--coordinator", env["ULYSSES_COORDINATOR"],
                 "--name", name, "--device", "cpu", "--work-dir", os.path.join(tmp, name),
                 "--grace-period-s", "30", *auth], name + ".log")
        ctl = lambda *args: subprocess.run([os.path.join(a.bin, "ulyssesctl"), *args],
                                           capture_output=True, text=True)
        wait_for(lambda: ctl("get", "workers", "-o", "json").stdout.count('"IDLE"') >= a.workers,
                 30, "workers idle")

        t_submit = time.monotonic()
        out = ctl("submit", "-f", os.path.join(ROOT, "configs/jobs/tiny-demo.yaml"),
                  "--set", "spec.stages[0].sp_degree=2", "--set", "spec.stages[0].steps=40",
                  "--set", "spec.checkpoint.every_steps=2",
                  "--set", "spec.data.synthetic.validation_sequences=2",
                  "--set", "spec.stages[1].steps=1", "--set", "spec.stages[2].steps=1")
        if out.returncode != 0:
            sys.exit("submit failed: " + out.stderr)
        job_id = out.stdout.strip().split()[-1]
        get = lambda: json.loads(ctl("get", "job", job_id, "-o", "json").stdout or "{}")

        wait_for(lambda: get().get("state") == "RUNNING", 120, "RUNNING", a.poll)
        t_running = time.monotonic()
        wait_for(lambda: get().get("step", 0) >= 1, 120, "first step", a.poll)
        t_first_step = time.monotonic()
        # Let a checkpoint commit, then kill one rank's worker.
        job = wait_for(lambda: (lambda j: j if (j.get("last_checkpoint") or {}).get("step", 0) >= 2
                                else None)(get()), 180, "first checkpoint", a.poll)
        ckpt_step = job["last_checkpoint"]["step"]
        gen = job["generation"]
        victim = describe_workers(ctl, job_id)[-1]
        t_kill = time.monotonic()
        workers[victim].send_signal(signal.SIGKILL)
        wait_for(lambda: get().get("state") in ("RECOVERING", "SCHEDULING")
                 or get().get("generation", gen) > gen, 60, "RECOVERING", a.poll)
        t_detected = time.monotonic()
        wait_for(lambda: (lambda j: j.get("generation", 0) > gen and j.get("state") == "RUNNING")
                 (get()), 180, "RUNNING again", a.poll)
        t_running_again = time.monotonic()
        # The job's step never goes backwards, so it cannot tell the new generation's first
        # step: read it from the event history (the first progress after the new attempt).
        def resumed_step():
            j = json.loads(ctl("describe", "job", job_id, "-o", "json").stdout or "{}")
            new_attempt = False
            for e in j.get("events", []):
                if e.get("type") == "attempt_started" and e["attempt"]["generation"] > gen:
                    new_attempt = True
                elif new_attempt and e.get("type") == "progress":
                    return e["step"]
            return None
        first_step = wait_for(resumed_step, 180, "resumed", a.poll)
        t_resumed = time.monotonic()
        restarts = get().get("restarts")
        # After the kill only W-1 workers remain: the job's last stage (4 ranks) would wait for a
        # replacement, so the measurement ends here and the job is cancelled.
        ctl("cancel", job_id)
        print(json.dumps({
            "workers": a.workers, "heartbeat_timeout_s": a.heartbeat_timeout_s, "poll_s": a.poll,
            "submit_to_running_s": round(t_running - t_submit, 2),
            "submit_to_first_step_s": round(t_first_step - t_submit, 2),
            "kill_to_detected_s": round(t_detected - t_kill, 2),
            "kill_to_running_again_s": round(t_running_again - t_kill, 2),
            "kill_to_resumed_step_s": round(t_resumed - t_kill, 2),
            "checkpoint_step_at_kill": ckpt_step, "resumed_first_step": first_step,
            "restarts": restarts}))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def describe_workers(ctl, job_id):
    """Worker names of the current attempt, rank order."""
    j = json.loads(ctl("describe", "job", job_id, "-o", "json").stdout)
    ids = j["attempts"][-1]["worker_ids"]
    return [w[2:] if w.startswith("w-") else w for w in ids]


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def wait_for(pred, timeout_s, what, poll=0.1):
    print("waiting for " + what, file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    sys.exit("timed out waiting for " + what)


if __name__ == "__main__":
    main()
