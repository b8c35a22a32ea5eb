#!/usr/bin/env bash
# The planner's per-rank memory on the cpu device against measured peak RSS: runs
# `ulysses-train` locally (all ranks on this host) for a few steps of the tiny preset and
# compares rank 0's peak RSS after the last training step (metrics.jsonl peak_rss_bytes:
# getrusage ru_maxrss, before eval and the final checkpoint) with
# `ulyssesctl plan --device-type cpu -o json` total_bytes_per_rank for the same spec.
#
# Usage: bench/plan_vs_rss.sh [BUILD_DIR=build] [CASES] [STEPS=2]
#   CASES: space-separated SEQ:SP[:MEMORY] items; MEMORY is a flow-map body for spec.memory
#   without spaces (CASES is split on them), so quote its keys:
#   '2048:4:"activation_checkpointing":true,"tiled_loss":true'. Default MEMORY:
#   "tiled_loss: true, loss_tile_tokens: 2048".
#   Default CASES: "8192:4 16384:4 32768:4".
#   ULYSSES_TRAIN / ULYSSESCTL override the binaries (default BUILD_DIR/bin/...).
#   ZERO=N sets spec.parallelism.zero_stage (0..3); DP=N sets spec.parallelism.dp_degree (the
#   world is SP x DP ranks); MODEL is a flow-map body for spec.model (default "preset: tiny"),
#   e.g. a wider model whose model state dominates, to check the ZeRO formula.
# Prints one JSON line per case: seq_len, sp, memory, planned and measured bytes, ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
CASES="${2:-8192:4 16384:4 32768:4}"
STEPS="${3:-2}"
TRAIN="${ULYSSES_TRAIN:-$BUILD_DIR/bin/ulysses-train}"
CTL="${ULYSSESCTL:-$BUILD_DIR/bin/ulyssesctl}"
ZERO="${ZERO:-0}"
DP="${DP:-1}"
MODEL="${MODEL:-preset: tiny}"
for CASE in $CASES; do
  IFS=: read -r S SP MEM <<< "$CASE"
  MEM="${MEM:-tiled_loss: true, loss_tile_tokens: 2048}"
  WORK="$(mktemp -d)"
  cat > "$WORK/job.yaml" <<YAML
apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: plan-vs-rss}
spec:
  model: {$MODEL}
  data: {synthetic: {generator: random, validation_sequences: 1}}
  parallelism: {sp_degree: $SP, dp_degree: $DP, zero_stage: $ZERO}
  memory: {$MEM}
  stages: [{seq_len: $S, steps: $STEPS}]
  checkpoint: {every_steps: 0, keep_last: 1}
YAML
  "$CTL" plan -f "$WORK/job.yaml" --device-type cpu -o json > "$WORK/plan.json"
  "$TRAIN" train -f "$WORK/job.yaml" --out "$WORK/out" > "$WORK/events" 2>&1
  /usr/bin/python3 - "$WORK" "$S" "$SP" "$MEM" "$ZERO" "$DP" <<'PY'
import json, sys
work, seq, sp, mem = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
zero, dp = int(sys.argv[5]), int(sys.argv[6])
rows = [json.loads(l) for l in open(work + "/out/metrics.jsonl") if '"eval"' not in l]
plan = json.load(open(work + "/plan.json"))[0]
measured = max(r["peak_rss_bytes"] for r in rows)
planned = plan["total_bytes_per_rank"]
print(json.dumps({"seq_len": seq, "sp": sp, "dp": dp, "zero_stage": zero, "memory": mem,
                  "steps": len(rows),
                  "planned_bytes": planned, "measured_peak_rss_bytes": measured,
                  "planned_over_measured": round(planned / measured, 3),
                  "planned_model_state": plan["model_state_bytes_per_rank"],
                  "planned_activations": plan["activation_bytes_per_rank"],
                  "planned_runtime": plan["runtime_bytes_per_rank"],
                  "step_seconds": rows[-1]["step_seconds"]}))
PY
  rm -rf "$WORK"
done
