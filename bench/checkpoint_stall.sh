#!/usr/bin/env bash
# Training time blocked by checkpoints, synchronous vs asynchronous (CPU, `ulysses-train train`).
# Model: vocab 32000, hidden 512, 8 layers, 8 q / 8 kv heads, inter 1376, untied: 57.9M
# parameters, fp32 (a checkpoint is 12 bytes a parameter: 695 MB). seq_len SEQ, sp 1 x dp RANKS.
# Three runs of STEPS steps each: no periodic checkpoint, a synchronous one every step, an
# asynchronous one every step (all three also commit the stage-end checkpoint).
# Usage: bench/checkpoint_stall.sh [BUILD_DIR=build] [STEPS=8] [RANKS=1] [CKPT_DIR=mktemp]
#        [THREADS=0] [SEQ=256]
# THREADS: each rank's --intra-op-threads (0: libtorch's default, every core). With every core
# training, the background writer's CPU (CRC-32, staging copies) is taken from the steps; fewer
# threads than cores leave it a core, as host cores are spare on a GPU node.
# SEQ: tokens per step. At 256 a step (~2 s here) is shorter than the background write of 695 MB
# (~1.8 s), so the writer is never idle; a longer sequence gives the ratio of a real job, whose
# step (minutes at 1M tokens) is longer than its write.
# Prints one JSON line per run: the median step seconds (the step's own time from metrics.jsonl,
# which in the asynchronous run includes any slowdown from the writer thread sharing the cores),
# the mean blocked seconds of the periodic checkpoints (checkpoint events' blocked_seconds) and
# their mean wall seconds; then a summary: async blocked / sync blocked, and each run's time per
# step on the training thread (median step + mean blocked) over the run without periodic
# checkpoints, minus 1; and the same in the steady state ("steady_": the median blocked time of
# the saves after the first, which alone allocates and first touches the host snapshot buffers).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
STEPS="${2:-8}"
RANKS="${3:-1}"
BIN="$BUILD_DIR/bin/ulysses-train"
WORK="$(mktemp -d)"
CKPT="${4:-$WORK}"
THREADS="${5:-0}"
SEQ="${6:-256}"
trap 'rm -rf "$WORK"' EXIT
run() {  # name every_steps async
  mkdir -p "$CKPT/$1"
  cat > "$WORK/$1.yaml" <<YAML
apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: stall-$1}
spec:
  model: {vocab_size: 32000, hidden_size: 512, intermediate_size: 1376, num_hidden_layers: 8,
          num_attention_heads: 8, num_key_value_heads: 8}
  data: {synthetic: {generator: random, validation_sequences: 1}}
  parallelism: {sp_degree: 1, dp_degree: $RANKS}
  optimizer: {lr: 1.0e-4}
  stages: [{seq_len: $SEQ, steps: $STEPS}]
  checkpoint: {dir: $CKPT/$1/ckpt, every_steps: $2, keep_last: 1, async: $3}
YAML
  "$BIN" train -f "$WORK/$1.yaml" --out "$WORK/$1.out" --intra-op-threads "$THREADS" \
    > "$WORK/$1.events"
  /usr/bin/python3 - "$1" "$WORK/$1.out/metrics.jsonl" "$WORK/$1.events" <<'PY'
import json, sys
name, metrics, events = sys.argv[1:]
rows = [json.loads(l) for l in open(metrics) if '"eval"' not in l]
secs = sorted(r["step_seconds"] for r in rows[1:])
ev = [json.loads(l) for l in open(events) if l.startswith("{")]
ckpts = [e for e in ev if e.get("event") == "checkpoint"][:-1]  # periodic only
blocked = [c["blocked_seconds"] for c in ckpts]
later = sorted(blocked[1:])  # the first asynchronous save also allocates the host buffers
print(json.dumps({"run": name, "steps": len(rows), "median_step_seconds": secs[len(secs) // 2],
                  "periodic_checkpoints": len(ckpts),
                  "mean_blocked_seconds": sum(blocked) / len(blocked) if blocked else 0.0,
                  "first_blocked_seconds": blocked[0] if blocked else 0.0,
                  "median_later_blocked_seconds": later[len(later) // 2] if later else 0.0,
                  "mean_checkpoint_seconds":
                      sum(c["seconds"] for c in ckpts) / len(ckpts) if ckpts else 0.0,
                  "bytes": ckpts[0]["bytes"] if ckpts else None}))
PY
}
run none 0 false > "$WORK/none.json"
run sync 1 false > "$WORK/sync.json"
run async 1 true > "$WORK/async.json"
cat "$WORK/none.json" "$WORK/sync.json" "$WORK/async.json"
/usr/bin/python3 - "$WORK/none.json" "$WORK/sync.json" "$WORK/async.json" <<'PY'
import json, sys
none, sync, asyn = (json.load(open(p)) for p in sys.argv[1:])
base = none["median_step_seconds"]
def per_step(r):  # training thread's time per step: compute + checkpoint blocking
    return r["median_step_seconds"] + r["mean_blocked_seconds"]
def steady(r):  # after the first save: the steady state of every-step checkpointing
    return r["median_step_seconds"] + r["median_later_blocked_seconds"]
print(json.dumps({
    "async_blocked_over_sync": asyn["mean_blocked_seconds"] / sync["mean_blocked_seconds"],
    "sync_step_overhead": per_step(sync) / base - 1,
    "async_step_overhead": per_step(asyn) / base - 1,
    "steady_async_blocked_over_sync":
        asyn["median_later_blocked_seconds"] / sync["median_later_blocked_seconds"],
    "steady_async_step_overhead": steady(asyn) / base - 1}))
PY
