#!/usr/bin/env bash
# Training throughput of 4 CPU ranks on one machine (SP 4) with libtorch's default intra-op
# threads (every rank a thread per core: `--intra-op-threads 0`, the behaviour before issue 25)
# against each rank's share of the cores (the default now: cores / 4).
#
#   bench/rank_threads.sh [BUILD_DIR=build] [STEPS=6] [SEQ=4096]
#
# The tiny preset (vocab 256, hidden 256, 4 layers, 8 heads, 4 kv heads), fp32, one sequence per
# step. Prints one JSON line per setting: the median of steps 2..N (the first warms up).
# OMP_NUM_THREADS and MKL_NUM_THREADS are unset so that libtorch's default is its own.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
STEPS="${2:-6}"
SEQ="${3:-4096}"
unset OMP_NUM_THREADS MKL_NUM_THREADS
BIN="$BUILD_DIR/bin/ulysses-train"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/job.yaml" <<YAML
apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: threads}
spec:
  model: {preset: tiny}
  data: {synthetic: {generator: random, validation_sequences: 1}}
  parallelism: {sp_degree: 4}
  optimizer: {lr: 1.0e-3}
  stages: [{seq_len: $SEQ, steps: $STEPS}]
  checkpoint: {every_steps: 0, keep_last: 1}
YAML
echo "# cores usable: $(nproc); 4 ranks; seq $SEQ; $STEPS steps"
for setting in default-per-core share; do
  flags=()
  [ "$setting" = default-per-core ] && flags=(--intra-op-threads 0)
  "$BIN" train -f "$WORK/job.yaml" --out "$WORK/$setting" "${flags[@]}" > /dev/null 2>&1
  /usr/bin/python3 - "$WORK/$setting/metrics.jsonl" "$setting" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' not in l and '"step_seconds"' in l]
secs = sorted(r["step_seconds"] for r in rows[1:] or rows)
med = secs[len(secs) // 2]
print(json.dumps({"threads": sys.argv[2], "ranks": 4, "seq_len": rows[0]["seq_len"],
                  "tokens_per_s": round(rows[0]["seq_len"] / med, 1),
                  "step_seconds": [round(r["step_seconds"], 3) for r in rows]}))
PY
done
