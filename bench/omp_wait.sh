#!/usr/bin/env bash
# OpenMP wait policy of CPU ranks: the needle demo job's first stage (one rank, 2 intra-op
# threads, tiny steps: the case where threads meet at a barrier most often) for SECONDS with
# libgomp's default (OMP_WAIT_POLICY set but empty: the launcher keeps it, libgomp ignores it
# and spins before it sleeps) and with PASSIVE (what every rank gets now,
# process::RankEnvironmentDefaults), alternated ROUNDS times. Prints steps per second of each
# run and the load average next to it: the difference shows when the cores are shared (two
# tests at once, a build beside it), which is how CI and a busy node run.
#
#   bench/omp_wait.sh [BUILD_DIR=build] [SECONDS=30] [ROUNDS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
SECONDS_EACH="${2:-30}"
ROUNDS="${3:-2}"
BIN="$BUILD_DIR/bin/ulysses-train"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
run() {  # run NAME POLICY
  local out="$WORK/$1"
  rm -rf "$out"
  OMP_WAIT_POLICY="$2" timeout "$SECONDS_EACH" "$BIN" train -f configs/jobs/needle-retrieval.yaml \
    --out "$out" > "$WORK/$1.log" 2>&1 || true
  local steps
  steps=$(grep -c '"step_in_stage"' "$out/metrics.jsonl" 2>/dev/null || echo 0)
  printf '{"policy":"%s","seconds":%s,"steps":%s,"steps_per_s":%s,"loadavg":"%s"}\n' \
    "${2:-default}" "$SECONDS_EACH" "$steps" \
    "$(awk -v s="$steps" -v t="$SECONDS_EACH" 'BEGIN{printf "%.1f", s/t}')" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
}
for _ in $(seq "$ROUNDS"); do
  run default ""
  run passive PASSIVE
done
