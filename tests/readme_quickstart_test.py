"""README's quickstart, run verbatim: every command of its "Working with a running coordinator"
block (coordinator, worker, submit, get, watch, top, describe, logs -f, cancel && resume, get
workers) and of its "Validate or plan a job offline" block, read from README.md at run time, in
one bash in the order README gives them, with the built binaries as build/bin and the source's
configs/ as configs/. The job README submits must end SUCCEEDED and every command must exit 0
(except README's `cancel ... && resume ...` on the finished job, which must refuse with "nothing
to cancel": README shows how the two are used, not that they apply to an ended job).

Isolation: the commands use fixed ports (the coordinator's 127.0.0.1:50051 and metrics 9091, the
rendezvous range 29500-29999) and fixed paths (/tmp/ulysses-state, /tmp/ulysses-w1), so the
block runs in its own network and mount namespaces (`unshare`): a private loopback and a private
/tmp (tmpfs), nothing shared with other tests or the machine. Exit 77 (skipped) where namespaces
cannot be made.

Between commands the script waits only where a person reading the output would: after a
backgrounded coordinator until it printed `listening grpc=` (documented readiness line), after a
backgrounded worker until it printed `registered as`. The other blocks of the quickstart:
scripts/bootstrap.sh and scripts/test.sh are what CI itself runs (.ci/run); scripts/demo.sh and
the "Train locally" block train needle-retrieval for minutes (needle_learning_test trains that
job's model; the ulysses-train train/eval/export commands are covered by train_e2e_test and
export_test).

Usage: readme_quickstart_test.py (env ULYSSES_SOURCE_DIR, ULYSSES_BIN_DIR)."""
import fcntl
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
SOURCE = os.environ.get("ULYSSES_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("ULYSSES_BIN_DIR") or os.path.join(SOURCE, "build", "bin")
# The paragraphs (their first words) that introduce the blocks run here, in README's order.
BLOCKS = ["Working with a running coordinator", "Validate or plan a job offline"]
JOB_TIMEOUT_S = 600


def fail(message):
    print(f"readme_quickstart_test: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def readme_blocks():
    """The ```sh blocks of README's Quickstart section that follow the BLOCKS paragraphs,
    as lists of commands (continuation lines joined)."""
    text = open(os.path.join(SOURCE, "README.md")).read()
    m = re.search(r"^## Quickstart.*?(?=^## )", text, re.S | re.M)
    if not m:
        fail("README.md has no '## Quickstart' section")
    section = m.group(0)
    out = []
    for intro in BLOCKS:
        at = section.find(intro)
        if at < 0:
            fail(f"README's quickstart no longer has the paragraph {intro!r}: update BLOCKS")
        block = re.search(r"```sh\n(.*?)```", section[at:], re.S)
        if not block:
            fail(f"no ```sh block after {intro!r}")
        commands, pending = [], ""
        for line in block.group(1).splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command = (pending + line).strip()
            pending = ""
            if command and not command.startswith("#"):
                commands.append(command)
        out.append(commands)
    return out


def loopback_up():
    """`ip link set lo up` without iproute2: SIOCSIFFLAGS IFF_UP on lo."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


PREAMBLE = r"""
set -u
__log=$1
__wait_for() {  # __wait_for TEXT: until the script's output has a line with TEXT
  local deadline=$((SECONDS + 60))
  until grep -q -- "$1" "$__log"; do
    if ((SECONDS >= deadline)); then echo "@@timeout waiting for: $1"; exit 3; fi
    sleep 0.2
  done
}
__final_state() {  # the state of the first job id the script printed, before the teardown
  local id
  id=$(grep -m1 -x 'job-[0-9]*' "$__log") || { echo "@@state none"; return; }
  echo "@@state $id $(build/bin/ulyssesctl describe job "$id" -o json |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')"
}
trap '__final_state; kill $(jobs -p) 2>/dev/null; wait' EXIT
"""


BACKGROUND = re.compile(r"[^&]&\s*(#.*)?$")  # `cmd &` (maybe with a comment), not `a && b`


def script_for(blocks):
    lines = [PREAMBLE]
    n = 0
    for commands in blocks:
        for command in commands:
            n += 1
            lines.append(f"echo '@@run {n}: '{quote(command)}")
            lines.append(command)
            if BACKGROUND.search(command):
                lines.append(f"echo '@@rc {n} background'")
                if "ulysses-coordinator" in command:
                    lines.append("__wait_for 'listening grpc='")
                elif "ulysses-worker" in command:
                    lines.append("__wait_for 'registered as w-'")
            else:
                lines.append(f"echo \"@@rc {n} $?\"")
    return "\n".join(lines) + "\n", n


def quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def keep_visible_under_tmp():
    """A checkout or build under /tmp (a clone in /tmp/ci) would vanish under the private
    /tmp: bind the old /tmp at a directory outside it first and read the paths through that."""
    global SOURCE, BIN
    if not any(p == "/tmp" or p.startswith("/tmp/") for p in (SOURCE, BIN)):
        return
    old = tempfile.mkdtemp(prefix="readme-old-tmp-", dir="/dev/shm")
    subprocess.run(["mount", "--bind", "/tmp", old], check=True)
    SOURCE, BIN = (old + p[len("/tmp"):] if p.startswith("/tmp/") else p for p in (SOURCE, BIN))


def inner():
    loopback_up()
    keep_visible_under_tmp()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/tmp"], check=True)
    work = tempfile.mkdtemp(prefix="readme-")
    os.makedirs(os.path.join(work, "build"))
    os.symlink(BIN, os.path.join(work, "build", "bin"))
    os.symlink(os.path.join(SOURCE, "configs"), os.path.join(work, "configs"))
    blocks = readme_blocks()
    script, count = script_for(blocks)
    script_path = os.path.join(work, "quickstart.sh")
    log_path = os.path.join(work, "quickstart.log")
    with open(script_path, "w") as f:
        f.write(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ULYSSES_")}
    env["HOME"] = work  # no ~/.config/ulysses of the machine's user
    with open(log_path, "w") as log:
        proc = subprocess.run(["bash", script_path, log_path], cwd=work, env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT_S)
    output = open(log_path).read()
    print(output[-20000:])
    commands = [c for b in blocks for c in b]
    rcs = dict(re.findall(r"^@@rc (\d+) (\S+)$", output, re.M))
    problems = []
    for i, command in enumerate(commands, start=1):
        rc = rcs.get(str(i))
        if rc is None:
            problems.append(f"command {i} never finished: {command}")
        elif " cancel " in command and "&&" in command:
            if rc == "0" or "nothing to cancel" not in output:
                problems.append(f"command {i} ({command}): want the refusal of cancelling "
                                f"the ended job, got exit {rc}")
        elif rc not in ("0", "background"):
            problems.append(f"command {i} exited {rc}: {command}")
    submit = [c for c in commands if " submit " in c]
    if len(submit) != 1:
        problems.append(f"want one submit in the block, found {len(submit)}")
    final = re.search(r"^@@state (\S+) ?(\S*)$", output, re.M)
    ids = [final.group(1)] if final and final.group(1) != "none" else []
    if not ids:
        problems.append("submit printed no job id")
    elif final.group(2) != "SUCCEEDED":
        problems.append(f"the job README submits ({ids[0]}) ended {final.group(2) or '?'}, "
                        "not SUCCEEDED")
    if proc.returncode not in (0,):
        problems.append(f"the script exited {proc.returncode}")
    if problems:
        fail("\n  " + "\n  ".join(problems))
    print(f"readme_quickstart_test: {count} README commands ran; {ids[0]} SUCCEEDED")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--inner":
        inner()
        return
    for b in ("ulysses-coordinator", "ulysses-worker", "ulyssesctl", "ulysses-train"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            print(f"readme_quickstart_test: {BIN}/{b} is not built", file=sys.stderr)
            sys.exit(1 if b != "ulysses-train" else SKIP)
    unshare = shutil.which("unshare")
    flags = ["--net", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    if not unshare or subprocess.run([unshare, *flags, "true"]).returncode != 0:
        print("readme_quickstart_test: skipped: cannot create network and mount namespaces "
              "(unshare --net --mount" + ("" if os.geteuid() == 0 else " --map-root-user") +
              "); README's fixed ports and /tmp paths need them", file=sys.stderr)
        sys.exit(SKIP)
    r = subprocess.run([unshare, *flags, sys.executable, os.path.abspath(__file__), "--inner"])
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
