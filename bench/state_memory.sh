#!/usr/bin/env bash
# Peak RSS per rank while a rank builds its state, against `ulyssesctl plan --device-type cpu`
# (issue 24): an 81.8M-parameter fp32 Llama (vocab 4096, hidden 768, intermediate 2048, 12 layers,
# 12 q / 4 kv heads, untied: the decoder layers hold 92 % of it), ZeRO-3 with activation checkpointing, at W = 1, 2, 4 ranks
# (sp 1; sp 2; sp 2 x dp 2), CPU, seq_len 64 then 128, one step per stage:
#   init    stage 0 from the seed (ZeroOptions::sharded_init)
#   resume  stage 1 in new rank processes, from stage 0's final checkpoint
#   import  stage 0 of a second job with model.init_from = the HF export of that checkpoint
#   export  `ulysses-train export` of stage 1's checkpoint (one process; max RSS via getrusage)
# init/resume/import are each rank's peak RSS when its state is ready, before the first step
# (the engine's "rank R state ready (...): peak RSS N bytes" log line); the plan's figures are
# stage 0's init_bytes_per_rank (init, import) and stage 1's resume_bytes_per_rank, and
# export_bytes_per_rank.
#
# Usage: bench/state_memory.sh [BUILD_DIR=build] [WORLDS="1 2 4"]
#   ULYSSES_TRAIN / ULYSSESCTL override the binaries (default BUILD_DIR/bin/...).
# Prints one JSON line per (W, phase): measured max over the ranks, planned, measured/planned,
# and for W > 1 the ratio to the W = 1 figure of the same phase.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
WORLDS="${2:-1 2 4}"
TRAIN="${ULYSSES_TRAIN:-$BUILD_DIR/bin/ulysses-train}"
CTL="${ULYSSESCTL:-$BUILD_DIR/bin/ulyssesctl}"
ROOT="$(mktemp -d)"
trap 'rm -rf "$ROOT"' EXIT
RESULTS="$ROOT/results.jsonl"
: > "$RESULTS"
job() {  # job FILE NAME SP DP [INIT_FROM]
  cat > "$1" <<YAML
apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: $2}
spec:
  model:
    vocab_size: 4096
    hidden_size: 768
    intermediate_size: 2048
    num_hidden_layers: 12
    num_attention_heads: 12
    num_key_value_heads: 4
    dtype: float32
${5:+    init_from: $5}
  data: {synthetic: {generator: random, validation_sequences: 1}}
  parallelism: {sp_degree: $3, dp_degree: $4, zero_stage: 3}
  memory: {activation_checkpointing: true, tiled_loss: true, loss_tile_tokens: 64}
  eval: {every_steps: 0, max_sequences: 1}
  stages: [{seq_len: 64, steps: 1}, {seq_len: 128, steps: 1}]
  checkpoint: {every_steps: 0, keep_last: 2, async: false}
YAML
}
state_peaks() {  # state_peaks LOG PHASE -> the ranks' "state ready (PHASE)" peaks, one a line
  sed -n "s/.*rank \([0-9]*\) state ready ($2): peak RSS \([0-9]*\) bytes.*/\2/p" "$1"
}
for W in $WORLDS; do
  case "$W" in 1) SP=1; DP=1 ;; 2) SP=2; DP=1 ;; 4) SP=2; DP=2 ;; *) echo "W=$W: use 1, 2 or 4" >&2; exit 2 ;; esac
  D="$ROOT/w$W"
  mkdir -p "$D"
  job "$D/job.yaml" "state-w$W" "$SP" "$DP"
  "$CTL" plan -f "$D/job.yaml" --device-type cpu -o json > "$D/plan.json"
  "$TRAIN" train -f "$D/job.yaml" --out "$D/out" > "$D/events" 2> "$D/log"
  CKPT="$(ls -d "$D"/out/checkpoints/step-* 2>/dev/null | tail -1 || true)"
  [ -n "$CKPT" ] || CKPT="$(ls -d "$D"/out/*/step-* | tail -1)"
  /usr/bin/python3 - "$TRAIN" "$CKPT" "$D/hf" > "$D/export_rss" <<'PY'
import resource, subprocess, sys
subprocess.run([sys.argv[1], "export", "--checkpoint", sys.argv[2], "--hf-out", sys.argv[3]],
               check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
PY
  job "$D/import.yaml" "state-import-w$W" "$SP" "$DP" "$D/hf"
  sed -i 's/stages: \[{seq_len: 64, steps: 1}, {seq_len: 128, steps: 1}\]/stages: [{seq_len: 64, steps: 1}]/' "$D/import.yaml"
  "$CTL" plan -f "$D/import.yaml" --device-type cpu -o json > "$D/import_plan.json"
  "$TRAIN" train -f "$D/import.yaml" --out "$D/import_out" > "$D/import_events" 2> "$D/import_log"
  /usr/bin/python3 - "$W" "$D" "$RESULTS" \
    "$(state_peaks "$D/log" init | tr '\n' ' ')" "$(state_peaks "$D/log" resume | tr '\n' ' ')" \
    "$(state_peaks "$D/import_log" import | tr '\n' ' ')" <<'PY'
import json, sys
w, d, results = int(sys.argv[1]), sys.argv[2], sys.argv[3]
peaks = {k: [int(x) for x in v.split()] for k, v in zip(("init", "resume", "import"), sys.argv[4:7])}
plan = json.load(open(d + "/plan.json"))
imp = json.load(open(d + "/import_plan.json"))
planned = {"init": plan[0]["init_bytes_per_rank"], "resume": plan[1]["resume_bytes_per_rank"],
           "import": imp[0]["init_bytes_per_rank"], "export": plan[1]["export_bytes"]}
peaks["export"] = [int(open(d + "/export_rss").read())]
with open(results, "a") as out:
    for phase in ("init", "resume", "import", "export"):
        ranks = peaks[phase]
        if not ranks or (phase != "export" and len(ranks) != w):
            sys.exit(f"W={w} {phase}: {len(ranks)} rank figures in the logs, expected {w}")
        out.write(json.dumps({"world": w, "phase": phase, "measured_bytes": max(ranks),
                              "planned_bytes": planned[phase],
                              "measured_over_planned": round(max(ranks) / planned[phase], 3)})
                  + "\n")
PY
done
/usr/bin/python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
one = {r["phase"]: r["measured_bytes"] for r in rows if r["world"] == 1}
for r in rows:
    if r["world"] > 1 and r["phase"] in one:
        r["over_w1"] = round(r["measured_bytes"] / one[r["phase"]], 3)
    print(json.dumps(r))
PY
