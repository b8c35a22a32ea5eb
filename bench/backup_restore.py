#!/usr/bin/python3
"""Backup and restore of the coordinator's store with N jobs, on real processes.

Makes a store of --jobs jobs: one job is submitted through ulyssesctl and cancelled (so it
has its stages, state-change events and log lines as the coordinator writes them), then its
rows are cloned with sqlite3 under new ids (and --events-per-job progress-sized events each),
which is what a long-lived coordinator accumulates. Then, with the coordinator running on it:

  start_s            coordinator start on the store until it serves (recovery of every job)
  backup_s           `ulysses-coordinator backup --state-dir D --to FILE` (median of 3)
  backup_rpc_s       `ulyssesctl admin backup --to FILE` (the admin RPC, streamed; median of 3)
  backup_bytes       size of the backup file
  store_bytes        coordinator.db (+ -wal) before the backup
  restore_s          `ulysses-coordinator restore --from FILE --state-dir NEW` (verify + place)
  restored_start_s   coordinator start on the restored dir until it serves
  restored_jobs      jobs `ulyssesctl get jobs` lists there (must equal --jobs)

Usage: /usr/bin/python3 bench/backup_restore.py [--bin build/bin] [--jobs 10000]
       [--events-per-job 20]
Prints one JSON line. Everything it starts is stopped and removed on exit.
"""
import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
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


class Coordinator:
    def __init__(self, bin_dir, state_dir, log):
        self.log = log
        start = time.monotonic()
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "ulysses-coordinator"), "--listen", "127.0.0.1:0",
             "--state-dir", state_dir, "--metrics-listen", "127.0.0.1:0"],
            stdout=open(log, "w"), stderr=subprocess.STDOUT)
        while True:
            m = re.search(r"listening grpc=(\d+)", read(log))
            if m:
                break
            if self.proc.poll() is not None or time.monotonic() - start > 600:
                sys.exit("coordinator did not start:\n" + read(log))
            time.sleep(0.02)
        self.start_s = time.monotonic() - start
        os.environ["ULYSSES_COORDINATOR"] = "127.0.0.1:" + m.group(1)
        os.environ["ULYSSES_TOKEN"] = read(os.path.join(state_dir, "admin.token")).strip()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def run(args, **kw):
    out = subprocess.run(args, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit("%s failed (%d): %s%s" % (" ".join(args), out.returncode, out.stdout, out.stderr))
    return out


def timed(args):
    start = time.monotonic()
    run(args)
    return time.monotonic() - start


def clone(db_path, template, jobs, events_per_job):
    db = sqlite3.connect(db_path)
    cols = {t: [r[1] for r in db.execute("PRAGMA table_info(%s)" % t)]
            for t in ("jobs", "stages", "attempts", "events")}
    job = db.execute("SELECT * FROM jobs WHERE id=?", (template,)).fetchone()
    children = {t: db.execute("SELECT * FROM %s WHERE job_id=?" % t, (template,)).fetchall()
                for t in ("stages", "attempts", "events")}
    payload = children["events"][-1][cols["events"].index("payload")]
    number = cols["jobs"].index("number")
    for n in range(2, jobs + 1):
        jid = "job-%06d" % n
        row = list(job)
        row[cols["jobs"].index("id")] = jid
        row[number] = n
        if "request_id" in cols["jobs"]:
            row[cols["jobs"].index("request_id")] = ""
        db.execute("INSERT INTO jobs VALUES (%s)" % ",".join("?" * len(row)), row)
        for t in ("stages", "attempts", "events"):
            for child in children[t]:
                c = list(child)
                c[cols[t].index("job_id")] = jid
                db.execute("INSERT INTO %s VALUES (%s)" % (t, ",".join("?" * len(c))), c)
        seq0 = len(children["events"]) + 1
        for i in range(events_per_job):
            db.execute("INSERT INTO events(job_id, sequence, time_ms, payload) VALUES (?,?,?,?)",
                       (jid, seq0 + i, 1000 + i, payload))
    db.commit()
    db.close()


def median_of(k, f):
    return statistics.median(f() for _ in range(k))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--events-per-job", type=int, default=20)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ulysses-backup-bench-")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    coordinator = None
    try:
        state = os.path.join(tmp, "state")
        coordinator = Coordinator(a.bin, state, os.path.join(tmp, "c1.log"))
        ctl = os.path.join(a.bin, "ulyssesctl")
        out = run([ctl, "submit", "-f", os.path.join(ROOT, "configs/jobs/tiny-demo.yaml")])
        template = out.stdout.strip().split()[-1]
        run([ctl, "cancel", template])
        coordinator.stop()
        clone(os.path.join(state, "coordinator.db"), template, a.jobs, a.events_per_job)

        coordinator = Coordinator(a.bin, state, os.path.join(tmp, "c2.log"))
        store_bytes = sum(os.path.getsize(os.path.join(state, f))
                          for f in ("coordinator.db", "coordinator.db-wal")
                          if os.path.exists(os.path.join(state, f)))
        backup = os.path.join(tmp, "backup.db")
        coord_bin = os.path.join(a.bin, "ulysses-coordinator")
        backup_s = median_of(3, lambda: timed([coord_bin, "backup", "--state-dir", state,
                                               "--to", backup]))
        rpc_s = median_of(3, lambda: timed([ctl, "admin", "backup", "--to",
                                            os.path.join(tmp, "backup-rpc.db")]))
        backup_bytes = os.path.getsize(backup)
        start_s = coordinator.start_s
        coordinator.stop()
        coordinator = None

        restored = os.path.join(tmp, "restored")
        restore_s = timed([coord_bin, "restore", "--from", backup, "--state-dir", restored])
        coordinator = Coordinator(a.bin, restored, os.path.join(tmp, "c3.log"))
        listed = json.loads(run([ctl, "get", "jobs", "-o", "json"]).stdout)
        restored_jobs = len(listed) if isinstance(listed, list) else -1
        print(json.dumps({
            "jobs": a.jobs, "events_per_job": a.events_per_job,
            "store_bytes": store_bytes, "backup_bytes": backup_bytes,
            "start_s": round(start_s, 3), "backup_s": round(backup_s, 3),
            "backup_rpc_s": round(rpc_s, 3), "restore_s": round(restore_s, 3),
            "restored_start_s": round(coordinator.start_s, 3),
            "restored_jobs": restored_jobs}))
        if restored_jobs != a.jobs:
            sys.exit("restored store lists %d jobs, expected %d" % (restored_jobs, a.jobs))
    finally:
        if coordinator is not None:
            coordinator.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
