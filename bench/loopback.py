"""A control plane on loopback for the bench/ scripts: ulysses-coordinator and CPU
ulysses-workers as real processes, ulyssesctl to drive them, everything stopped on exit.

    with LoopbackCluster(bin_dir, workers=4, heartbeat_timeout_s=10) as c:
        job_id = c.submit("configs/jobs/tiny-demo.yaml", {"spec.stages[0].sp_degree": 2})
        c.wait_for(lambda: c.get(job_id).get("state") == "RUNNING", 120, "RUNNING")

The coordinator runs without a token file, so it creates an admin token in its state dir;
ulyssesctl and the workers use it (docs/OPERATIONS.md).
"""
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


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def wait_for(pred, timeout_s, what, poll=0.1):
    """Polls pred() every `poll` seconds until it returns a true value; exits on timeout."""
    print("waiting for " + what, file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    sys.exit("timed out waiting for " + what)


class LoopbackCluster:
    def __init__(self, bin_dir, workers, heartbeat_timeout_s=10.0, poll=0.1, prefix="ulysses-"):
        self.bin = bin_dir
        self.poll = poll
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.procs = []
        self.workers = {}
        # A SIGTERM (e.g. from `timeout`) still runs the cleanup in __exit__.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            self._start(workers, heartbeat_timeout_s)
        except BaseException:
            self.close()
            raise

    def _start(self, workers, heartbeat_timeout_s):
        coord_log = os.path.join(self.tmp, "coordinator.log")
        self.spawn([os.path.join(self.bin, "ulysses-coordinator"), "--listen", "127.0.0.1:0",
                    "--state-dir", os.path.join(self.tmp, "state"),
                    "--metrics-listen", "127.0.0.1:0",
                    "--heartbeat-timeout-s", str(heartbeat_timeout_s)], "coordinator.log")
        port = wait_for(lambda: re.search(r"listening grpc=(\d+)", read(coord_log)), 30,
                        "coordinator start").group(1)
        os.environ["ULYSSES_COORDINATOR"] = "127.0.0.1:" + port
        token_file = os.path.join(self.tmp, "state", "admin.token")
        self.auth = []
        if os.path.exists(token_file):
            os.environ["ULYSSES_TOKEN"] = read(token_file).strip()
            self.auth = ["--token-file", token_file]
        for i in range(workers):
            self.start_worker("bench-w%d" % i)
        wait_for(lambda: self.ctl("get", "workers", "-o", "json").stdout.count('"IDLE"') >= workers,
                 30, "workers idle")

    def spawn(self, args, log):
        p = subprocess.Popen(args, stdout=open(os.path.join(self.tmp, log), "w"),
                             stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def start_worker(self, name):
        self.workers[name] = self.spawn(
            [os.path.join(self.bin, "ulysses-worker"), "--coordinator",
             os.environ["ULYSSES_COORDINATOR"], "--name", name, "--device", "cpu",
             "--work-dir", os.path.join(self.tmp, name), "--grace-period-s", "30", *self.auth],
            name + ".log")

    def ctl(self, *args):
        return subprocess.run([os.path.join(self.bin, "ulyssesctl"), *args], capture_output=True,
                              text=True)

    def submit(self, spec_path, sets):
        args = ["submit", "-f", spec_path]
        for k, v in sets.items():
            args += ["--set", "%s=%s" % (k, v)]
        out = self.ctl(*args)
        if out.returncode != 0:
            sys.exit("submit failed: " + out.stderr)
        return out.stdout.strip().split()[-1]

    def get(self, job_id):
        return json.loads(self.ctl("get", "job", job_id, "-o", "json").stdout or "{}")

    def describe(self, job_id):
        return json.loads(self.ctl("describe", "job", job_id, "-o", "json").stdout or "{}")

    def wait_for(self, pred, timeout_s, what):
        return wait_for(pred, timeout_s, what, self.poll)

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
