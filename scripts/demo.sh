#!/usr/bin/env bash
# Ulysses demo on one machine: a coordinator (temp state dir, free port) and 4 CPU
# workers on loopback run configs/jobs/needle-retrieval.yaml (a small model learns needle
# retrieval at 128 tokens, then the context grows 1k -> 2k -> 4k with SP 1 -> 2 -> 4, each
# stage resuming from the last one's checkpoint), watched live to the end; then prints
# per-stage loss and retrieval accuracy (chance: 1/14). Every process is stopped on exit.
#
#   scripts/demo.sh                                   # full demo (~2 minutes on 2 cores)
#   scripts/demo.sh --set spec.stages[0].steps=5      # extra --set overrides go to submit
#
# Env: ULYSSES_BIN_DIR (default build/bin), SPEC (default configs/jobs/needle-retrieval.yaml),
#      WORKERS (default 4), KEEP=1 keeps the temp dir (logs, checkpoints).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${ULYSSES_BIN_DIR:-$ROOT/build/bin}"
SPEC="${SPEC:-$ROOT/configs/jobs/needle-retrieval.yaml}"
WORKERS="${WORKERS:-4}"
PY=/usr/bin/python3

for b in ulysses-coordinator ulysses-worker ulyssesctl ulysses-train; do
  if [[ ! -x "$BIN/$b" ]]; then
    echo "demo: $BIN/$b is missing: build it first (cmake --build build --target $b)" >&2
    exit 1
  fi
done

TMP="$(mktemp -d /tmp/ulysses-demo.XXXXXX)"
PIDS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # Workers first (SIGTERM lets a running rank checkpoint), then the coordinator.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${PIDS[$i]}" 2>/dev/null || true; done
  local deadline=$((SECONDS + 40))
  for pid in "${PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ "${KEEP:-0}" == 1 ]]; then
    echo "demo: logs and state kept in $TMP"
  else
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "demo: work dir $TMP"
# TLS as in production: a dev CA, the coordinator's certificate and one client certificate per
# worker (mutual TLS: a worker may register only the name its certificate names).
NAMES=()
for ((i = 0; i < WORKERS; i++)); do NAMES+=("demo-w$i"); done
"$ROOT/scripts/dev_certs.sh" "$TMP/certs" "${NAMES[@]}" >/dev/null
"$BIN/ulysses-coordinator" --listen 127.0.0.1:0 --state-dir "$TMP/state" \
  --metrics-listen 127.0.0.1:0 --tls-cert "$TMP/certs/server.pem" \
  --tls-key "$TMP/certs/server.key" --tls-client-ca "$TMP/certs/ca.pem" \
  >"$TMP/coordinator.log" 2>&1 &
PIDS+=($!)
PORT=""
for _ in $(seq 1 150); do
  PORT="$(sed -n 's/.*listening grpc=\([0-9]*\).*/\1/p' "$TMP/coordinator.log" | head -1)"
  [[ -n "$PORT" ]] && break
  kill -0 "${PIDS[0]}" 2>/dev/null || break
  sleep 0.2
done
if [[ -z "$PORT" ]]; then
  echo "demo: the coordinator did not start:" >&2
  cat "$TMP/coordinator.log" >&2
  exit 1
fi
export ULYSSES_COORDINATOR="127.0.0.1:$PORT"
echo "demo: coordinator on $ULYSSES_COORDINATOR (metrics: $(sed -n 's/.*metrics=\([0-9]*\).*/\1/p' "$TMP/coordinator.log" | head -1))"
# Started without a token file, the coordinator made an admin token and a ulyssesctl config
# for it (server, CA, token file) in its state dir: the newcomer's path (docs/OPERATIONS.md).
export ULYSSES_CONFIG="$TMP/state/ulyssesctl-config.yaml"
if [[ ! -f "$ULYSSES_CONFIG" ]]; then
  echo "demo: the coordinator wrote no $ULYSSES_CONFIG:" >&2
  cat "$TMP/coordinator.log" >&2
  exit 1
fi
echo "demo: TLS + tokens on; export ULYSSES_CONFIG=$ULYSSES_CONFIG"

for ((i = 0; i < WORKERS; i++)); do
  "$BIN/ulysses-worker" --coordinator "$ULYSSES_COORDINATOR" --name "demo-w$i" --device cpu \
    --work-dir "$TMP/workers/w$i" --grace-period-s 30 --ca "$TMP/certs/ca.pem" \
    --cert "$TMP/certs/workers/demo-w$i.pem" --key "$TMP/certs/workers/demo-w$i.key" \
    >"$TMP/worker$i.log" 2>&1 &
  PIDS+=($!)
done
for _ in $(seq 1 150); do
  idle="$("$BIN/ulyssesctl" get workers -o json 2>/dev/null | grep -c '"state": "IDLE"' || true)"
  [[ "$idle" -ge "$WORKERS" ]] && break
  sleep 0.2
done
"$BIN/ulyssesctl" get workers

"$BIN/ulyssesctl" validate -f "$SPEC" "$@"
JOB="$("$BIN/ulyssesctl" submit -f "$SPEC" "$@")"
echo "demo: submitted $JOB"
status=0
"$BIN/ulyssesctl" watch "$JOB" || status=$?

"$BIN/ulyssesctl" describe job "$JOB" -o json >"$TMP/job.json"
"$PY" - "$TMP/job.json" <<'PYEOF'
import json, sys
job = json.load(open(sys.argv[1]))
print()
print(f"{job['id']} {job['name']}: {job['state']}  restarts={job['restarts']} "
      f"preemptions={job['preemptions']}")
print(f"{'stage':>5}  {'seq_len':>7}  {'sp':>2}  {'steps':>5}  {'train_loss':>10}  "
      f"{'eval_loss':>9}  {'accuracy':>8}")
for s in job["stages"]:
    acc = f"{s['eval_accuracy']:.3f}" if s.get("eval_seq_len") else "-"
    ev = f"{s['eval_loss']:.4f}" if s.get("eval_seq_len") else "-"
    print(f"{s['index']:>5}  {s['seq_len']:>7}  {s['sp']:>2}  {s['steps']:>5}  "
          f"{s['loss']:>10.4f}  {ev:>9}  {acc:>8}")
PYEOF
exit "$status"
